"""Helpers shared by the tests (importable by procs too: no pytest here)."""

from __future__ import annotations

import time
from typing import Any, Callable


def wait_until(cond: Callable[[], Any], timeout: float = 10.0, what: str = "",
               every: float = 0.005) -> Any:
    """Poll `cond` until it returns something true, and return that; AssertionError naming
    `what` once `timeout` seconds pass. A test waits for a condition, with a bound."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, what or "condition not met in time"
        time.sleep(every)
