"""Backpressure: calls flooding an actor that answers slowly (issue 48).

600 calls of 1 MiB to one actor that takes 20 a second: how long the sender runs ahead
(how long until its last call() returned), the proc's resident memory before and at its
peak, and whether every call was answered, under the default call window
(`mailbox_limit`, `mailbox_bytes`) and with a window wide enough to let everything in
(the behaviour before the window existed). Run: python benchmarks/bench_backpressure.py
[--calls 600] [--rate 20]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import numpy as np  # noqa: E402
import psutil  # noqa: E402

import runtime  # noqa: E402
from runtime import this_host  # noqa: E402
from _seam_actors import Worker  # noqa: E402


def flood(calls: int, rate: float) -> tuple[float, float, float, bool]:
    """(seconds until the last call() returned, RSS before, peak RSS in MiB, all answered)."""
    pm = this_host().spawn_procs(per_host={"procs": 1}, name="flood")
    try:
        m = pm.spawn("w", Worker)
        m.initialized.get(timeout=60)
        proc = psutil.Process(pm.procs[0].pid)
        before = proc.memory_info().rss
        peak = [before]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], proc.memory_info().rss)
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        blob = np.zeros(1 << 20, dtype=np.uint8)
        t0 = time.monotonic()
        futs = [m.echo_size.call_one(blob, 1.0 / rate) for _ in range(calls)]
        ahead = time.monotonic() - t0
        ok = [f.get(timeout=calls / rate * 4 + 60) for f in futs] == [1 << 20] * calls
        done.set()
        sampler.join()
        return ahead, before / 2**20, peak[0] / 2**20, ok
    finally:
        pm.stop().get(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=600)
    ap.add_argument("--rate", type=float, default=20.0)
    args = ap.parse_args()
    print(f"{args.calls} calls of 1 MiB to an actor taking {args.rate:g} a second")
    print(f"{'window':<34} {'sender ahead':>12} {'proc RSS':>16} {'answered':>9}")
    rows = [("default (%d calls, %d MiB)" % (runtime.config.config.mailbox_limit,
                                             runtime.config.config.mailbox_bytes >> 20), {}),
            ("unbounded (everything in flight)", {"mailbox_limit": 1 << 30,
                                                  "mailbox_bytes": 1 << 60})]
    for label, settings in rows:
        with runtime.configured(**settings):
            ahead, before, peak, ok = flood(args.calls, args.rate)
        print(f"{label:<34} {ahead:>10.1f} s {before:>6.0f} -> {peak:>4.0f} MiB {str(ok):>9}")
    runtime.shutdown()


if __name__ == "__main__":
    main()
