"""The transport's promises under faults (docs/transport.md): an answer sent before a failure
always counts, a dead proc fails what waits on it without stalling anything else, and a
send that fails fails its call. Each fault is injected for real, in a proc."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import runtime
from runtime import Actor, SupervisionError, endpoint, this_host

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(autouse=True)
def quiet_failures(monkeypatch):
    """The actors fail on purpose: their reports are not the root's unhandled failures."""
    monkeypatch.setattr(runtime, "unhandled_fault_hook", lambda failure: None)


class Answerer(Actor):
    """Answers call i with `size` bytes; fails or dies at a chosen call."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def answer(self, i: int, size: int, abort_at: int = -1, kill: str = "",
               kill_at: int = -1) -> bytes:
        if i == kill_at and kill == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        if i == kill_at and kill == "during":  # while this answer is being written
            threading.Timer(0.002, os.kill, (os.getpid(), signal.SIGKILL)).start()
        if i == kill_at and kill == "after":  # once it has left: at the next call
            self.die_next = True
        elif getattr(self, "die_next", False):
            os.kill(os.getpid(), signal.SIGKILL)
        if i == abort_at:
            runtime.context().actor_instance.abort(f"failing after answer {i}")
        return bytes([i % 251]) * size


class Healthy(Actor):
    @endpoint
    def ping(self, i: int) -> int:
        return i


@pytest.fixture(scope="module")
def healthy():
    """A second mesh on the same host, called throughout by a thread: it must never stall."""
    pm = this_host().spawn_procs(per_host={"procs": 1}, name="healthy")
    m = pm.spawn("healthy", Healthy)
    m.initialized.get(timeout=60)
    stop = threading.Event()
    worst: list = [0.0]
    errors: list = []

    def caller() -> None:
        i = 0
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                assert m.ping.call_one(i).get(timeout=10) == i
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors.append(e)
                return
            worst[0] = max(worst[0], time.monotonic() - t0)
            i += 1
            time.sleep(0.002)

    t = threading.Thread(target=caller, daemon=True)
    t.start()
    yield worst, errors
    stop.set()
    t.join(15)
    print(f"\nhealthy mesh: worst call {worst[0] * 1e3:.1f} ms while faults were injected")
    pm.stop().get(timeout=30)


def _fresh(name: str):
    pm = this_host().spawn_procs(per_host={"procs": 1}, name=name)
    m = pm.spawn("answerer", Answerer)
    m.initialized.get(timeout=60)
    return pm, m


def _check_healthy(healthy) -> None:
    worst, errors = healthy
    assert not errors, errors


@pytest.mark.parametrize("size", [1 << 10, 65 << 10, 16 << 20])
@pytest.mark.parametrize("when", ["before", "during", "after"])
def test_a_proc_killed_around_a_large_answer(healthy, size, when):
    """16 pipelined calls; the proc is SIGKILLed before, while or after it writes answer 8.
    Every answer that came whole counts, in order; every other call fails with the kill
    named; nothing hangs; the host agent and the healthy mesh go on."""
    n, at = 16, 8
    pm, m = _fresh(f"killed-{when}-{size}")
    try:
        one = m.slice(procs=0)
        futs: list = []
        for i in range(n):
            try:
                futs.append(one.answer.call_one(i, size, kill=when, kill_at=at))
            except SupervisionError as e:  # the proc died (and was reported) before this
                futs.append(e)  # call was issued: it fails at the call site, as documented
        ok = 0
        for i, f in enumerate(futs):
            try:
                if isinstance(f, SupervisionError):
                    raise f
                value = f.get(timeout=60)
            except SupervisionError as e:
                assert "SIGKILL" in str(e), e
                continue
            assert value == bytes([i % 251]) * size and i == ok, (i, ok)
            ok += 1
        assert all(f.done() for f in futs if not isinstance(f, SupervisionError))
        if when == "before":
            assert ok == at
        elif when == "after":
            assert ok == at + 1
        else:  # the kill lands within 2 ms: while answer 8 or a later one is written
            assert ok >= at
    finally:
        pm.stop().get(timeout=30)
    _check_healthy(healthy)


@pytest.mark.parametrize("size", [65 << 10, 1 << 20])
@pytest.mark.parametrize("n", [1, 64, 65, 1000])
def test_answers_sent_before_an_actor_fails_all_count(healthy, n, size):
    """The caller issues all n calls first and reads them afterwards; the actor answers each
    and fails while answering the last. Every answer was sent before the failure: every
    future resolves to its value; the next call raises the failure."""
    pm, m = _fresh(f"abort-{n}-{size >> 10}k")
    try:
        one = m.slice(procs=0)
        futs = [one.answer.call_one(i, size, abort_at=n - 1) for i in range(n)]
        for i in range(n):
            value = futs[i].get(timeout=120)
            assert len(value) == size and value[:1] == bytes([i % 251]), i
            futs[i] = None  # the values of 1000 MiB need not stay
        with pytest.raises(SupervisionError, match=f"failing after answer {n - 1}"):
            one.answer.call_one(n, size).get(timeout=60)
    finally:
        pm.stop().get(timeout=30)
    _check_healthy(healthy)


def test_the_host_agent_outlives_the_faults(healthy):
    """After the kills above, a new proc mesh starts on the same host agent and answers."""
    pm, m = _fresh("after-faults")
    try:
        assert m.slice(procs=0).answer.call_one(3, 10).get(timeout=60) == bytes([3]) * 10
    finally:
        pm.stop().get(timeout=30)
    _check_healthy(healthy)


def test_a_send_that_fails_fails_the_call_naming_the_peer(tmp_path):
    """A peer that accepts our connection, then goes (closes it and its listening socket):
    a call sent there fails with the address and the error, instead of waiting forever."""
    import socket

    from runtime.transport.framing import Header, Kind

    rt = runtime.get_runtime()
    path = str(tmp_path / "closer")
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(path)
    lsock.listen(1)
    try:
        got: list = []
        done = threading.Event()

        def on_fail(exc, **_):
            got.append(exc)
            done.set()

        addr = f"ipc://{path}"
        rt.send(addr, Header(Kind.LOG))  # connects
        conn, _ = lsock.accept()
        conn.close()
        lsock.close()
        deadline = time.monotonic() + 20
        while not done.is_set():
            assert time.monotonic() < deadline
            port = rt.open_port(lambda h, b, bufs: None, on_fail, {"nobody"})
            rt.send(addr, Header(Kind.CALL, actor="a", method="m", reply=rt.address,
                                 port=port))
            done.wait(0.02)
        assert isinstance(got[0], SupervisionError) and path in str(got[0]), got
    finally:
        lsock.close()
