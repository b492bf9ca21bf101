"""The I/O thread runs the runtime and nothing else (docs/transport.md, "The I/O thread"):
a user's done-callback, a blocked output sink or a busy spell of the I/O thread kills no
healthy proc and hangs no call."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import runtime
from runtime import this_host
from _seam_actors import Worker
from _util import wait_until
from _procs import spawn_procs_fixture

pytestmark = pytest.mark.timeout(90)

#: a heartbeat timeout the tests outlast on purpose (the procs send every 0.5 s)
SHORT = 1.0


procs = spawn_procs_fixture({"procs": 3}, "seams", stop_timeout=15)


@pytest.fixture(scope="module")
def workers(procs):
    m = procs.spawn("workers", Worker)
    m.initialized.get(timeout=30)
    return m


def all_alive(m) -> list:
    return list(m.rank.call().get(timeout=10).values())


def test_a_slow_done_callback_kills_no_proc(workers):
    """A callback that takes 2.5 timeouts: it runs on a callback thread, the I/O thread
    keeps reading heartbeats, and every proc answers afterwards."""
    ended = threading.Event()
    seen = []

    def slow(f):
        seen.append(threading.current_thread().name)
        time.sleep(2.5 * SHORT)
        ended.set()

    with runtime.configured(heartbeat_timeout=SHORT):
        fut = workers.rank.call()
        fut.add_done_callback(slow)
        fut.get(timeout=10)
        assert ended.wait(15), "the callback never finished"
        assert all_alive(workers) == [0, 1, 2]
    assert seen and not seen[0].startswith("monarch-io"), seen


def test_a_done_callback_may_wait_on_another_call(workers):
    """A callback that waits on another call gets its answer (the I/O thread is free to
    resolve it), and so does a callback that waits on a future another callback resolves."""
    got: list = []
    threads: list = []
    done = threading.Event()
    chained: runtime.Future = runtime.Future("chained")

    def needs_chained(f):
        got.append(chained.get(timeout=10))
        done.set()

    def waits(f):
        threads.append(threading.current_thread().name)
        got.append(workers.slice(procs=2).rank.call_one().get(timeout=10))
        chained.set_result("chained")  # resolves the other callback's wait

    gate: runtime.Future = runtime.Future("gate")
    gate.add_done_callback(needs_chained)
    gate.set_result(None)  # needs_chained now waits, on a callback thread
    second = workers.slice(procs=1).nap.call_one(0.3)
    second.add_done_callback(waits)  # runs when the I/O thread resolves the call
    assert done.wait(20), f"callbacks deadlocked: {got}"
    assert got == [0, "chained"]  # current_rank() is the point in the slice called
    assert threads and threads[0].startswith("runtime-callbacks"), threads


def test_a_busy_io_thread_kills_no_proc(workers):
    """The I/O thread itself busy for 2.5 timeouts (a stand-in for a GIL-heavy pause or a
    slow handler): silence is judged on what came meanwhile, so no healthy proc is killed."""
    rt = runtime.get_runtime()
    with runtime.configured(heartbeat_timeout=SHORT):
        done = runtime.Future("stall")
        rt.loop.call_soon(lambda: (time.sleep(2.5 * SHORT), done.set_result(None)))
        done.get(timeout=20)
        assert all_alive(workers) == [0, 1, 2]


def test_answers_are_unpickled_by_their_taker_not_the_io_thread(workers):
    """An answer whose unpickling takes seconds is unpickled by the thread that takes it:
    meanwhile the I/O thread answers other calls and reads heartbeats."""
    started, finished = threading.Event(), threading.Event()
    got: list = []
    fut = workers.slice(procs=0).slow_reply.call_one(3.0)

    def take() -> None:
        started.set()
        got.append(fut.get(timeout=30))
        finished.set()

    taker = threading.Thread(target=take)
    with runtime.configured(heartbeat_timeout=SHORT):
        taker.start()
        assert started.wait(10)
        while not fut.done():  # the answer has come: it is being unpickled in `take`
            time.sleep(0.01)
        for _ in range(5):  # other calls are answered while it is
            assert all_alive(workers) == [0, 1, 2]
        assert not finished.is_set()
        taker.join(30)
    assert got == ["slow from 0"]


def test_an_output_sink_that_blocks_stops_no_call(workers):
    """The terminal or notebook stops taking output (a paused `| less`): calls keep
    answering and procs stay alive; output past output_buffer_bytes is dropped, counted and
    said once the sink takes output again."""
    rt = runtime.get_runtime()
    before = rt.output_sink
    release = threading.Event()
    taken: list = []
    blocked = threading.Event()

    def sink(prefix: str, stream: str, text: str) -> None:
        blocked.set()
        release.wait(30)
        taken.append((prefix, stream, text))

    rt.set_output_sink(sink)
    try:
        with runtime.configured(heartbeat_timeout=SHORT, output_buffer_bytes=16 << 10):
            assert workers.slice(procs=0).say.call_one(2).get(timeout=10) == 2
            assert blocked.wait(10), "no output reached the sink"
            # the sink is stuck in its first line: 2,000 more lines (about 140 KB) arrive
            assert workers.slice(procs=1).say.call_one(2000).get(timeout=20) == 2000
            # time passes with the sink blocked: heartbeats are still read
            deadline = time.monotonic() + 2.5 * SHORT
            while time.monotonic() < deadline:
                assert all_alive(workers) == [0, 1, 2]
                time.sleep(0.2)
            assert not release.is_set() and len(taken) == 0  # all of that while blocked
            release.set()

            def counted() -> tuple[int, int, list]:
                """Lines taken, lines the notes say were dropped, the notes."""
                rt.flush_output(timeout=10)
                notes = [t for p, _, t in list(taken) if "bytes of proc output dropped" in t]
                lines = sum(t.count("line ") for p, _, t in list(taken) if p != "runtime")
                return lines, sum(int(n.split(" line(s)")[0]) for n in notes), notes

            deadline = time.monotonic() + 20
            while sum(counted()[:2]) < 2002 and time.monotonic() < deadline:
                time.sleep(0.1)
        lines, dropped, notes = counted()
        assert lines + dropped == 2002, (lines, dropped, notes)  # each line taken or counted
        assert dropped > 0 and notes and "output_buffer_bytes" in notes[0], notes
    finally:
        release.set()
        rt.set_output_sink(before)


def test_a_slow_actor_slows_its_callers(workers):
    """Calls to an actor that answers slowly: past mailbox_limit calls (or mailbox_bytes)
    in flight to it, call() waits for answers instead of filling the actor's mailbox."""
    one = workers.slice(procs=2)
    futs: list = []
    most = 0
    with runtime.configured(mailbox_limit=8):
        for _ in range(40):
            futs.append(one.nap.call_one(0.01))
            most = max(most, sum(not f.done() for f in futs))
    assert most <= 8, most
    blob = np.zeros(1 << 20, dtype=np.uint8)  # 1 MiB per call
    most_bytes = 0
    with runtime.configured(mailbox_bytes=4 << 20):
        for _ in range(30):
            futs.append(one.echo_size.call_one(blob, 0.01))
            most_bytes = max(most_bytes, sum(not f.done() for f in futs[40:]))
    assert most_bytes <= 4, most_bytes
    assert [f.get(timeout=30) for f in futs[40:]] == [1 << 20] * 30
    assert all(f.get(timeout=30) == 0.01 for f in futs[:40])


def test_a_slow_actor_slows_its_broadcasters(workers, tmp_path):
    """Broadcasts and sends (no answer) to an actor that takes them slowly count in the
    same window until the actor confirms it took them: the sender waits instead of filling
    the actor's mailbox (measured: sent minus handled, which the actor writes to a file)."""
    one = workers.slice(procs=1)
    path = tmp_path / "handled"
    path.touch()

    def backlog(sent: int) -> int:
        return sent - path.read_text().count("x")

    most = 0
    with runtime.configured(mailbox_limit=8):
        for i in range(40):
            one.note.broadcast(str(path), 0.005)
            most = max(most, backlog(i + 1))
    assert most <= 8, most
    wait_until(lambda: backlog(40) == 0, 30, "the actor did not take every broadcast")
    blob = np.zeros(1 << 20, dtype=np.uint8)  # 1 MiB each
    most_bytes = 0
    with runtime.configured(mailbox_bytes=4 << 20):
        for i in range(20):
            runtime.send(one.note, (str(path), 0.005, blob), {})
            most_bytes = max(most_bytes, backlog(41 + i))
    assert most_bytes <= 4, most_bytes
    wait_until(lambda: backlog(60) == 0, 30, "the actor did not take every message")


def test_procs_sending_large_answers_are_alive_while_the_bytes_flow():
    """Three procs answer 250 MB each at once under a 0.4 s heartbeat timeout: reading it
    all takes longer than that, and their heartbeats queue behind their answers, but bytes
    arriving are a sign of life: every answer counts and no proc is killed."""
    with runtime.configured(heartbeat_interval=0.1, heartbeat_timeout=0.4):
        pm = this_host().spawn_procs(per_host={"procs": 3}, name="large")
        try:
            m = pm.spawn("large", Worker)
            m.initialized.get(timeout=30)
            sizes = [len(v) for v in m.blob.call(250_000_000).get(timeout=60).values()]
            assert sizes == [250_000_000] * 3
            assert all_alive(m) == [0, 1, 2]
        finally:
            pm.stop().get(timeout=30)
