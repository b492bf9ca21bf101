"""Helpers shared by the tests (importable by procs too: no pytest here)."""

from __future__ import annotations

import time
from typing import Any, Callable


def wait_until(cond: Callable[[], Any], timeout: float = 10.0,
               what: str | Callable[[], Any] = "", every: float = 0.005) -> Any:
    """Poll `cond` until it returns something true, and return that; AssertionError naming
    `what` once `timeout` seconds pass (a callable `what` is called then: the message can
    show the state that was not reached). A test waits for a condition, with a bound."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() >= deadline:
            msg = str(what()) if callable(what) else what
            raise AssertionError(msg or "condition not met in time")
        time.sleep(every)


def pipeline_until_death(mesh: Any, size: int, busy: float = 0.0, n: int = 400,
                         die_at: int = 300) -> tuple[int, list]:
    """Pipeline `n` calls `step(i, size, die_at)` to one actor whose proc SIGKILLs itself
    inside call `die_at` (its answers to the calls before were sent); with `busy`, the
    controller's I/O thread then sleeps that long. Returns (answers that counted, the
    SupervisionError texts of the rest); a call made once the death is known fails at the
    call site and counts among the errors."""
    import runtime

    futs: list = []
    for i in range(n):
        try:
            futs.append(mesh.step.call_one(i, size, die_at))
        except runtime.SupervisionError as e:
            futs.append(e)
    if busy:
        runtime.get_runtime().loop.call_soon(time.sleep, busy)
    answered, errors = 0, []
    for f in futs:
        try:
            if isinstance(f, BaseException):
                raise f
            assert len(f.get(timeout=60)) == size
            answered += 1
        except runtime.SupervisionError as e:
            errors.append(str(e))
    return answered, errors


class FakeClock:
    """A clock a test drives: pass it where code takes `clock=` (and its `sleep` where code
    takes `sleep=`: sleeping advances it, after `on_sleep(now)` had its turn)."""

    def __init__(self, now: float = 1000.0, on_sleep: Callable[[float], None] = lambda t: None):
        self.now = now
        self.on_sleep = on_sleep

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.on_sleep(self.now)
        self.now += seconds
