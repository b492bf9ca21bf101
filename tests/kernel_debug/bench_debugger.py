"""Debugger latencies next to a plain endpoint call measured in the same run:
`PYTHONPATH=. python tests/kernel_debug/bench_debugger.py [N]`. Prints medians and ratios."""

from __future__ import annotations

import statistics
import sys
import time

import runtime
from runtime import Actor, endpoint, this_host


class Bench(Actor):
    @endpoint
    def echo(self, x):
        return x

    @endpoint
    def stop_here(self, x):
        y = x
        breakpoint()
        return y


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def main(n: int = 200) -> None:
    m = this_host().spawn_procs(per_host={"procs": 1}, name="bench").spawn("bench", Bench)
    reg = runtime.debugging.get_registry()
    m.echo.call_one(0).get(10)
    calls = []
    for i in range(n):
        t = time.perf_counter()
        m.echo.call_one(i).get(10)
        calls.append(time.perf_counter() - t)
    pauses, cmds, conts = [], [], []
    for i in range(max(5, n // 10)):
        t = time.perf_counter()
        fut = m.stop_here.call_one(i)
        while not reg.paused():
            time.sleep(0.0002)
        pauses.append(time.perf_counter() - t)
        s = reg.paused()[0]
        reg.wait(s, 5)
        for _ in range(10):
            t = time.perf_counter()
            reg.run_command(s, "p y")
            cmds.append(time.perf_counter() - t)
        t = time.perf_counter()
        reg.run_command(s, "c")
        fut.get(10)
        conts.append(time.perf_counter() - t)
    ref = _median_ms(calls)
    rows = [("endpoint call_one round trip (reference)", ref, len(calls)),
            ("call -> breakpoint registered in controller", _median_ms(pauses), len(pauses)),
            ("pdb command round trip (`p y`)", _median_ms(cmds), len(cmds)),
            ("`c` -> call result", _median_ms(conts), len(conts))]
    print(f"{'operation':46s} {'median ms':>10s} {'x ref':>7s} {'n':>5s}")
    for name, ms, k in rows:
        print(f"{name:46s} {ms:10.3f} {ms / ref:7.2f} {k:5d}")
    runtime.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
