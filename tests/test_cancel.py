"""`Future.cancel()` stops remote work (docs/runtime.md, "Cancelling a call"): a running sync
handler, a running async handler and a call still queued in the mailbox; the actor answers
its next call."""

from __future__ import annotations

import asyncio
import _thread
import os
import threading
import time

import pytest

import runtime
from runtime import Actor, CancelledError, endpoint, this_host
from _util import wait_until

pytestmark = pytest.mark.timeout(90)


class Slow(Actor):
    def __init__(self, mark_dir: str) -> None:
        self.mark_dir = mark_dir
        self.ran: list = []

    def _mark(self, tag: str) -> None:
        self.ran.append(tag)
        open(os.path.join(self.mark_dir, tag), "w").close()  # the test sees it started

    @endpoint
    def spin(self, tag: str, seconds: float) -> str:
        self._mark(tag)
        end = time.monotonic() + seconds
        while time.monotonic() < end:  # Python bytecode: an interrupt lands at once
            time.sleep(0.01)
        return tag

    @endpoint
    async def wait(self, tag: str, seconds: float) -> str:
        self._mark(tag)
        await asyncio.sleep(seconds)
        return tag

    @endpoint
    def hold(self, tag: str, release: str) -> str:
        """Run Python code until the file `release` exists (at most 60 s)."""
        self._mark(tag)
        end = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < end:
            time.sleep(0.01)
        return tag

    @endpoint
    def ran_list(self) -> list:
        return self.ran


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    marks = tmp_path_factory.mktemp("marks")
    pm = this_host().spawn_procs(per_host={"procs": 1}, name="cancel")
    m = pm.spawn("slow", Slow, str(marks))
    m.initialized.get(timeout=30)
    yield m, marks
    pm.stop().get(timeout=30)


@pytest.mark.parametrize("endpoint_name", ["spin", "wait"], ids=["sync", "async"])
def test_cancel_stops_a_running_handler_and_the_actor_answers_next(slow, endpoint_name):
    m, marks = slow
    tag = f"running-{endpoint_name}"
    fut = getattr(m, endpoint_name).call_one(tag, 60)
    wait_until(lambda: (marks / tag).exists(), 30, "the handler never started")
    assert fut.cancel()
    with pytest.raises(CancelledError, match=f"{endpoint_name}.*was cancelled"):
        fut.get(timeout=10)
    assert not fut.cancel()  # resolved: nothing left to cancel
    # the handler stopped (else this call would wait out its 60 s) and the actor is usable
    assert m.spin.call_one("after", 0).get(timeout=10) == "after"


def test_a_cancelled_call_still_queued_is_not_run(slow):
    m, marks = slow
    first = m.spin.call_one("first", 60)
    queued = m.spin.call_one("queued", 0)  # waits in the mailbox behind `first`
    wait_until(lambda: (marks / "first").exists(), 30, "the first call never started")
    assert queued.cancel()
    with pytest.raises(CancelledError):
        queued.get(timeout=10)
    assert first.cancel()
    with pytest.raises(CancelledError):
        first.get(timeout=10)
    ran = m.ran_list.call_one().get(timeout=10)
    assert "first" in ran and "queued" not in ran


def test_cancel_of_what_is_not_a_remote_call_says_no():
    local = runtime.Future("local")
    assert not local.cancel()
    local.set_result(1)
    assert local.get(timeout=1) == 1


def test_cancel_calls_cancels_what_is_in_flight_to_a_mesh(slow):
    m, marks = slow
    futs = [m.spin.call_one(f"many{i}", 60) for i in range(3)]
    wait_until(lambda: (marks / "many0").exists(), 30, "the first call never started")
    assert m.cancel_calls() == 3
    for f in futs:
        with pytest.raises(CancelledError):
            f.get(timeout=10)
    assert m.cancel_calls() == 0
    assert m.spin.call_one("after-many", 0).get(timeout=10) == "after-many"
    assert "many1" not in m.ran_list.call_one().get(timeout=10)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """Two actors (own threads) on one proc, and the marks directory they write."""
    marks = tmp_path_factory.mktemp("marks2")
    pm = this_host().spawn_procs(per_host={"procs": 1}, name="scoped")
    a = pm.spawn("first", Slow, str(marks))
    b = pm.spawn("second", Slow, str(marks))
    a.initialized.get(timeout=30)
    b.initialized.get(timeout=30)
    yield a, b, marks
    pm.stop().get(timeout=30)


def _interrupt_main_when_it_waits_on(fut) -> threading.Thread:
    """Ctrl-C (as a signal would) in the main thread once it blocks in `fut.get()`."""
    main = threading.main_thread().ident

    def go() -> None:
        wait_until(lambda: runtime.future.waiting_in(main) is fut, 30, "never waited")
        _thread.interrupt_main()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_an_interrupted_wait_in_a_call_scope_leaves_earlier_calls_running(two, tmp_path):
    """Ctrl-C in a wait on a call started before the scope (an earlier cell's) interrupts
    nothing remote; `cancel()` stops the scope's own calls, and only those."""
    a, b, marks = two
    release = tmp_path / "release"
    earlier = a.hold.call_one("earlier", str(release))
    with runtime.call_scope() as calls:
        mine = b.hold.call_one("mine", str(release))
        wait_until(lambda: (marks / "earlier").exists() and (marks / "mine").exists(), 30,
                   "the handlers never started")
        assert calls.owns(mine) and not calls.owns(earlier)
        t = _interrupt_main_when_it_waits_on(earlier)
        with pytest.raises(KeyboardInterrupt):
            earlier.get(timeout=30)
        t.join(10)
    assert calls.pending() == [mine]
    assert calls.cancel() == ["Slow.hold.call_one"]
    with pytest.raises(CancelledError, match="hold"):
        mine.get(timeout=10)
    release.touch()
    # not interrupted: it ran to its end once released
    assert earlier.get(timeout=30) == "earlier"
    assert calls.cancel() == []


def test_an_interrupted_wait_on_a_scopes_own_call_interrupts_it(two, tmp_path):
    """Ctrl-C in a wait on the scope's own call interrupts its actor as before (and
    `cancel()` then leaves it alone); the scope's other call is cancelled."""
    a, b, marks = two
    release = tmp_path / "release"
    with runtime.call_scope() as calls:
        waited = a.hold.call_one("waited", str(release))
        other = b.hold.call_one("other", str(release))
        wait_until(lambda: (marks / "waited").exists() and (marks / "other").exists(), 30,
                   "the handlers never started")
        t = _interrupt_main_when_it_waits_on(waited)
        with pytest.raises(KeyboardInterrupt):
            waited.get(timeout=30)
        t.join(10)
    assert calls.cancel() == ["Slow.hold.call_one"]  # `other`; `waited` was interrupted
    with pytest.raises(CancelledError):
        other.get(timeout=10)
    with pytest.raises(runtime.ActorError, match="KeyboardInterrupt"):
        waited.get(timeout=10)  # interrupted remotely, not run to its end (no release)
    assert a.spin.call_one("after", 0).get(timeout=10) == "after"
    assert b.spin.call_one("after", 0).get(timeout=10) == "after"
