"""Actors for tests/test_proc_logs.py (importable by procs)."""
from __future__ import annotations

import ctypes
import os
import sys

from runtime import Actor, current_rank, endpoint


class Writer(Actor):
    """Writes numbered lines from Python and from C, and a last line without a newline."""

    @endpoint
    def write(self, n: int) -> int:
        r = current_rank().rank
        for i in range(n):
            print(f"py rank {r} line {i}")
        sys.stdout.flush()
        libc = ctypes.CDLL(None)
        msg = f"c stdout rank {r}\n".encode()
        libc.write(1, msg, len(msg))
        os.write(2, f"c stderr rank {r}\n".encode())
        os.write(1, f"unfinished rank {r}".encode())  # no newline: kept until the proc ends
        return os.getpid()

    @endpoint
    def fill(self, lines: int, width: int) -> None:
        for i in range(lines):
            os.write(1, f"{i:06d} {'x' * width}\n".encode())
