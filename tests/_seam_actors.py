"""Actors for tests/test_io_thread_seams.py (imported by the procs by reference)."""

from __future__ import annotations

import os
import time

import numpy as np

from runtime import Actor, current_rank, endpoint


def slow_value(seconds: float, value: str) -> str:
    """Unpickling a `SlowToUnpickle` runs this: the receiver's thread is busy `seconds`."""
    time.sleep(seconds)
    return value


class SlowToUnpickle:
    """A value whose unpickling takes `seconds` wherever it lands."""

    def __init__(self, seconds: float, value: str) -> None:
        self.seconds, self.value = seconds, value

    def __reduce__(self):
        return slow_value, (self.seconds, self.value)


class Worker(Actor):
    @endpoint
    def rank(self) -> int:
        return current_rank().rank

    @endpoint
    def nap(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    @endpoint
    def echo_size(self, blob, seconds: float) -> int:
        time.sleep(seconds)
        return len(blob)

    @endpoint
    def slow_reply(self, seconds: float) -> SlowToUnpickle:
        return SlowToUnpickle(seconds, f"slow from {current_rank().rank}")

    @endpoint
    def many_arrays(self, n: int) -> dict:
        """A state_dict-like answer: `n` small arrays."""
        return {f"layer{i}.weight": np.full(3, i, dtype=np.float32) for i in range(n)}

    @endpoint
    def blob(self, n: int) -> np.ndarray:
        return np.ones(n, dtype=np.uint8)

    @endpoint
    def note(self, path: str, seconds: float, blob=None) -> None:
        """Sleep, then append a line to `path`: the sender counts what was handled."""
        time.sleep(seconds)
        with open(path, "a") as f:
            f.write("x\n")

    @endpoint
    def exit_now(self, code: int) -> None:
        os._exit(code)

    @endpoint
    def total(self, arrays: dict) -> float:
        return float(sum(a.sum() for a in arrays.values()))

    @endpoint
    def send_to(self, port, chars: int) -> str:
        port.send("y" * chars)
        return "sent"

    @endpoint
    def big_error(self, chars: int) -> None:
        raise ValueError("x" * chars)

    @endpoint
    def say(self, lines: int, width: int = 60) -> int:
        for i in range(lines):
            print(f"line {i} " + "x" * width, flush=True)
        return lines


class Holder(Actor):
    """Keeps what it was spawned with."""

    def __init__(self, blob: bytes = b"") -> None:
        self.size = len(blob)

    @endpoint
    def held(self) -> int:
        return self.size

