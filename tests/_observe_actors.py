"""Actors for tests/test_timeline.py and tests/test_proc_stacks.py (importable by procs)."""
from __future__ import annotations

import ctypes
import os
import threading
import time

import runtime
from runtime import Actor, endpoint


class Worker(Actor):
    """Calls that succeed, fail and open spans; a proc stuck in C with the GIL held."""

    @endpoint
    def step(self, x: int) -> int:
        with runtime.span("inner"):
            time.sleep(0.002)
        if x < 0:
            raise ValueError("negative step")
        return x

    @endpoint
    @runtime.traced
    def traced_step(self) -> int:
        return 1

    @endpoint
    def hold_gil_reading(self, fifo: str) -> int:
        """Block in libc read() on `fifo` through ctypes.PyDLL, which keeps the GIL: no
        other thread of this proc runs Python until a byte arrives."""
        fd = os.open(fifo, os.O_RDWR)  # a FIFO opened read-write does not wait for a writer
        try:
            buf = ctypes.create_string_buffer(1)
            return int(ctypes.PyDLL(None).read(fd, buf, 1))
        finally:
            os.close(fd)

    @endpoint
    def deadlock(self) -> list[str]:
        """Two threads that each hold one lock and wait for the other's, forever."""
        a, b = threading.Lock(), threading.Lock()
        both = threading.Barrier(2)

        def grab(first: threading.Lock, second: threading.Lock) -> None:
            with first:
                both.wait()
                with second:
                    pass

        ts = [threading.Thread(target=grab, args=(a, b), name="deadlock-a", daemon=True),
              threading.Thread(target=grab, args=(b, a), name="deadlock-b", daemon=True)]
        for t in ts:
            t.start()
        return [t.name for t in ts]
