"""Run a test body in several threads at once and collect what they raised."""

from __future__ import annotations

import threading
from typing import Callable


def run_in_threads(fn: Callable[[int], None], n: int, timeout: float = 60.0
                   ) -> list[BaseException]:
    """Call fn(0) .. fn(n-1), each in its own thread, all at once; their exceptions, and a
    TimeoutError for each thread still running after `timeout` (a daemon: it cannot hold
    up the interpreter's exit)."""
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            fn(i)
        except BaseException as e:  # noqa: BLE001 - returned to the test
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    errors += [TimeoutError(f"thread {i} still runs after {timeout:g} s")
               for i, t in enumerate(threads) if t.is_alive()]
    return errors


def in_thread(fn: Callable[[], None], timeout: float = 30.0) -> None:
    """Call fn() in another thread (one that is not the caller's: its own send sockets,
    its own inbox) and fail unless it returned within `timeout`."""
    errors = run_in_threads(lambda _: fn(), 1, timeout)
    assert not errors, errors
