"""What a line breakpoint (the Jupyter Debugger panel's gutter) costs the endpoints it does
not stop: an endpoint's time with no breakpoint set, against the same endpoint while a
breakpoint is armed in a different function of its file, and in another file.

    PYTHONPATH=. python benchmarks/bench_debug_lines.py [--calls 200] [--n 20000] [--quick]

`echo` is a call round trip (the per-call arming: a hook and sys.settrace); `work(n)` makes
n Python calls inside the endpoint, timed in the actor (the trace function sees each call).
Modes alternate over several rounds; medians and ratios to "none" are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import runtime  # noqa: E402
from runtime import Actor, endpoint, this_host  # noqa: E402
from runtime.debugging import set_line_breakpoints  # noqa: E402


def _f(i):
    return i + 1


class Bench(Actor):
    @endpoint
    def echo(self, x):
        return x

    @endpoint
    def work(self, n):
        t0 = time.perf_counter()
        s = 0
        for i in range(n):
            s += _f(i)
        return time.perf_counter() - t0

    @endpoint
    def elsewhere(self, x):
        y = x + 1  # ARMED
        return y


ARMED = next(i for i, ln in enumerate(open(__file__), 1) if ln.rstrip().endswith("# ARMED"))
OTHER_FILE = "/nonexistent/other_cell.py"
MODES = {"none": {}, "same file, other function": {__file__: [ARMED]},
         "other file": {OTHER_FILE: [3]}}


def _set(table: dict) -> None:
    for path in (__file__, OTHER_FILE):
        set_line_breakpoints(path, table.get(path, []))
    time.sleep(0.3)  # the table reaches the proc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.calls, a.n, a.rounds = 60, 5000, 2
    procs = this_host().spawn_procs(per_host={"procs": 1}, name="benchdbg")
    m = procs.spawn("bench", Bench)
    one = m.slice(procs=0)
    rt: dict = {k: [] for k in MODES}
    inner: dict = {k: [] for k in MODES}
    try:
        for _ in range(a.rounds):
            for mode, table in MODES.items():
                _set(table)
                for _ in range(10):
                    one.echo.call_one(0).get(10)  # warm, and armed
                for _ in range(a.calls):
                    t0 = time.perf_counter()
                    one.echo.call_one(0).get(10)
                    rt[mode].append(time.perf_counter() - t0)
                for _ in range(max(5, a.calls // 10)):
                    inner[mode].append(one.work.call_one(a.n).get(30))
    finally:
        _set({})
        runtime.shutdown()
    base_rt = statistics.median(rt["none"])
    base_in = statistics.median(inner["none"]) / a.n
    print(f"{'mode':28s} {'echo round trip':>16s} {'ratio':>6s} "
          f"{'ns per Python call in work()':>30s} {'ratio':>6s}")
    for mode in MODES:
        r = statistics.median(rt[mode])
        w = statistics.median(inner[mode]) / a.n
        print(f"{mode:28s} {r * 1e6:13.0f} us {r / base_rt:6.2f} {w * 1e9:27.0f} ns "
              f"{w / base_in:6.2f}")


if __name__ == "__main__":
    main()
