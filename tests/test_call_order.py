"""Calls, their answers and their failures, in the order their senders sent them
(docs/transport.md): futures waited on by other threads and in asyncio, several threads
calling at once, answers sent before a failure, failures of a waiting call."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

import runtime
from runtime import Actor, Port, SupervisionError, concurrent_endpoint, endpoint, this_host

from _actors import Ledger
from _util import wait_until
from _threads import run_in_threads
from _procs import spawn_procs_fixture

pytestmark = pytest.mark.timeout(120)


procs = spawn_procs_fixture({"procs": 2}, "order")


@pytest.fixture
def log(procs):
    m = procs.spawn("log", Ledger)
    yield m
    m.stop().get(timeout=30)


def _resolver(fut: runtime.Future) -> list:
    """The thread that runs `fut`'s done-callbacks (a callback thread: docs/transport.md),
    once it has: an `await` may wake before it does."""
    out: list = []
    fut.add_done_callback(lambda f: out.append(threading.get_ident()))
    return out


def test_a_future_awaited_in_asyncio_resolves(log):
    one = log.slice(procs=0)
    one.add.call_one(0, 0).get(timeout=30)

    async def main() -> tuple:
        fut = one.nap.call_one(0.2)  # answers after the callback below is in place
        by = _resolver(fut)
        value = await asyncio.wait_for(fut, 30)
        both = await asyncio.wait_for(asyncio.gather(one.add.call_one(0, 8),
                                                     log.add.call(0, 9)), 30)
        return value, by, both

    value, by, (eight, nine) = asyncio.run(main())
    assert value == 0.2 and eight == 8 and list(nine.values()) == [9, 9]
    wait_until(lambda: by, 10, "the done-callback ran")
    assert by != [threading.get_ident()]


def test_another_thread_waits_on_a_future_of_this_thread(log):
    one = log.slice(procs=0)
    fut = one.nap.call_one(0.2)
    got: list = []
    t = threading.Thread(target=lambda: got.append(fut.get(timeout=30)))
    t.start()
    t.join(40)
    assert got == [0.2]
    # and a future made by a thread that has ended, waited on here
    box: list = []
    t = threading.Thread(target=lambda: box.append(one.nap.call_one(0.1)))
    t.start()
    t.join(40)
    assert box[0].get(timeout=30) == 0.1


def test_a_failure_reaches_a_waiting_caller_at_once(procs):
    """The proc dies while this thread waits in get(): the I/O thread fails the call, and
    the waiting thread wakes with the error."""
    for i in range(3):
        pm = this_host().spawn_procs(per_host={"procs": 1}, name=f"doomed{i}")
        try:
            m = pm.spawn("doomed", Ledger)
            pid = m.pid.call_one().get(timeout=30)
            fut = m.nap.call_one(60)
            threading.Timer(0.2, os.kill, (pid, signal.SIGKILL)).start()
            with pytest.raises(SupervisionError, match="SIGKILL"):
                fut.get(timeout=30)
        finally:
            pm.stop().get(timeout=30)


def test_each_thread_gets_its_replies_in_its_order(log):
    """Threads calling one actor at once: each sender's calls arrive in the order sent,
    and each thread's results are its own."""
    one = log.slice(procs=0)
    n = 60

    def caller(who: int) -> None:
        futs = [one.add.call_one(who, i) for i in range(n)]
        for i in range(n, 2 * n):
            assert one.add.call_one(who, i).get(timeout=30) == i
        assert [f.get(timeout=30) for f in futs] == list(range(n))

    errors = run_in_threads(caller, 4)
    assert not errors, errors
    for w in range(4):
        assert one.seen_by.call_one(w).get(timeout=30) == list(range(2 * n))


@pytest.mark.parametrize("where", ["proc", "controller"])
def test_an_actor_failure_is_handled_before_its_call_raises(procs, where):
    """The error reply comes behind the failure report the actor sent first, on the same
    connection: the call raises the failure (in Monarch's words, which the report adds) and the
    controller already shows the actor failed."""
    rt = runtime.get_runtime()
    for i in range(4):
        name = f"exiting{i}{where}"
        m = (procs.slice(procs=0) if where == "proc" else runtime.this_proc()).spawn(
            name, Exiting)
        with pytest.raises(SupervisionError, match=rf"Endpoint call {name}\.leave\(\) failed"):
            m.leave.call_one().get(timeout=30)
        states = [a.state.value for h in rt.health.snapshot() if h.name == name
                  for a in h.actors]
        assert states == ["failed"], states


class Exiting(Actor):
    @endpoint
    def leave(self) -> None:
        raise SystemExit(3)


class Aborting(Actor):
    @endpoint
    def answer_then_abort(self) -> str:
        runtime.context().actor_instance.abort("done here")
        return "answered"


@pytest.mark.parametrize("where", ["proc", "controller"])
def test_an_answer_sent_before_the_actor_fails_still_counts(procs, where):
    """The result comes before the failure report, which the actor sent after it on the
    same connection: the answer counts, the next call raises."""
    for i in range(10):
        host = procs.slice(procs=0) if where == "proc" else runtime.this_proc()
        m = host.spawn(f"aborting{i}{where}", Aborting)
        assert m.answer_then_abort.call_one().get(timeout=30) == "answered"
        with pytest.raises(SupervisionError):
            m.answer_then_abort.call_one().get(timeout=30)


class AbortingLarge(Actor):
    @endpoint
    def answer_then_abort(self, n: int) -> bytes:
        runtime.context().actor_instance.abort("done here")
        return b"x" * n


@pytest.mark.parametrize("where", ["proc", "controller"])
def test_a_large_answer_still_counts_when_the_actor_fails_after_it(procs, where):
    """A 64 MiB answer, then the small failure report: the report cannot overtake it."""
    _large_answer_then_failure(procs, where, "abortlarge", AbortingLarge, "done here")


def _large_answer_then_failure(procs, where: str, prefix: str, cls: type, match: str) -> None:
    """Three times: a fresh actor of `cls` (in a proc or in this controller) answers 64 MiB
    from `answer_then_abort` and fails; the answer counts, the next call raises `match`."""
    n = 64 << 20
    for i in range(3):
        host = procs.slice(procs=0) if where == "proc" else runtime.this_proc()
        m = host.spawn(f"{prefix}{i}{where}", cls)
        assert len(m.answer_then_abort.call_one(n).get(timeout=60)) == n
        with pytest.raises(SupervisionError, match=match):
            m.answer_then_abort.call_one(n).get(timeout=60)


class AbortingRankZero(Actor):
    @endpoint
    def answer(self, n: int) -> bytes:
        me = runtime.context().actor_instance
        if me.rank.rank == 0:
            me.abort("rank 0 is done")
            return b"x" * n
        return b"y"


def test_one_rank_answers_then_fails_the_other_answers(procs):
    """A call to two ranks: rank 0 answers and then fails, rank 1 answers. Both answers
    count; the controller shows rank 0 failed; the next call raises."""
    rt = runtime.get_runtime()
    for i in range(3):
        name = f"rankzero{i}"
        m = procs.spawn(name, AbortingRankZero)
        answers = m.answer.call(64 << 20).get(timeout=60).values()
        assert [len(a) for a in answers] == [64 << 20, 1]
        with pytest.raises(SupervisionError, match="rank 0 is done"):
            m.answer.call(0).get(timeout=60)
        states = [a.state.value for h in rt.health.snapshot() if h.name == name
                  for a in h.actors]
        assert states[0] == "failed", states


class PortAnswerThenRaise(Actor):
    @concurrent_endpoint(explicit_response_port=True)
    async def answer_then_abort(self, port: "Port[bytes]", n: int) -> None:
        port.send(b"x" * n)
        raise ValueError("raised after answering")


@pytest.mark.parametrize("where", ["proc", "controller"])
def test_an_explicit_port_answer_still_counts_when_its_endpoint_then_raises(procs, where,
                                                                           monkeypatch):
    """An explicit-port endpoint that answers and then raises fails its actor (Monarch);
    its answer counts: nothing sent after it overtakes it."""
    monkeypatch.setattr(runtime, "unhandled_fault_hook", lambda failure: None)
    _large_answer_then_failure(procs, where, "portraise", PortAnswerThenRaise,
                               "raised after answering")
