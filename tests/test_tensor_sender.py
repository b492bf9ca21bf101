"""The tensor engine's sender thread (runtime/tensor/_engine.py): every queued command is
sent without waiting for a later one, in issue order, batched (no procs: `_send` records)."""

from __future__ import annotations

import random
import threading
import time

from runtime.tensor._engine import Sender
from _util import wait_until


class Recording(Sender):
    def __init__(self) -> None:
        super().__init__()
        self.got: list = []
        self.batches = 0

    def _send(self, entry: tuple, batch: list, plain: bool = False) -> None:
        self.got.extend(batch)
        self.batches += 1


def test_a_lone_command_is_sent_without_another_put():
    s = Recording()
    rng = random.Random(7)
    for i in range(300):  # each put lands at a different point of the loop's cycle
        time.sleep(rng.random() * 0.003)
        s.put(("cmd", None, "k", None, i, True))
        wait_until(lambda: len(s.got) == i + 1, 2.0, what=f"command {i} was not sent",
                   every=0.0005)
    assert s.got == list(range(300))


def test_commands_from_threads_arrive_whole_in_each_threads_order_and_batched():
    s = Recording()
    n, threads = 5000, 4

    def issue(t: int) -> None:
        for i in range(n):
            s.put(("cmd", None, "k", None, (t, i), True))
            if i % 500 == 0:
                time.sleep(0.001)

    ts = [threading.Thread(target=issue, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    wait_until(lambda: len(s.got) == n * threads, 5.0, what=lambda: f"{len(s.got)} sent",
               every=0.0005)
    for t in range(threads):
        assert [i for (u, i) in s.got if u == t] == list(range(n))
    assert s.batches < n * threads / 10  # gathered, not one message per command


def test_a_mark_is_set_after_the_commands_before_it_are_sent():
    s = Recording()
    for i in range(100):
        s.put(("cmd", None, "k", None, i, True))
    s.flush(timeout=5)
    assert s.got == list(range(100))
