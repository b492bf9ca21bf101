"""How late remote output arrives relative to the reply of the call that printed it.

Not a test: `PYTHONPATH=. python tests/kernel/measure_output_lag.py [N]` prints the
distribution. It motivates the end-of-cell grace in the kernel and the %%mesh end marks."""

from __future__ import annotations

import statistics
import sys
import threading
import time

import runtime
from runtime import Actor, endpoint


class Printer(Actor):
    @endpoint
    def say(self, token: str) -> str:
        print(token)
        return token


def main(n: int = 300) -> None:
    arrived: dict[str, float] = {}
    cond = threading.Condition()

    def sink(label: str, stream: str, text: str) -> None:
        now = time.monotonic()
        with cond:
            for line in text.splitlines():
                arrived.setdefault(line.strip(), now)
            cond.notify_all()

    rt = runtime.get_runtime()
    rt.set_output_sink(sink)
    procs = runtime.this_host().spawn_procs(per_host={"procs": 1})
    p = procs.spawn("printer", Printer)
    p.say.call_one("warm-up").get(timeout=30)
    lags = []
    for i in range(n):
        token = f"t{i}"
        p.say.call_one(token).get(timeout=30)
        replied = time.monotonic()
        with cond:
            cond.wait_for(lambda: token in arrived, timeout=5)
        lags.append((arrived.get(token, replied + 5) - replied) * 1000)
    procs.stop().get(timeout=30)
    runtime.shutdown()
    lags.sort()
    after = [x for x in lags if x > 0]
    print(f"{n} calls; output arrival minus reply, ms:")
    print(f"  median {statistics.median(lags):.2f}  p90 {lags[int(0.9 * n)]:.2f}  "
          f"p99 {lags[int(0.99 * n) - 1]:.2f}  max {lags[-1]:.2f}")
    print(f"  after the reply: {len(after)} of {n}; more than 30 ms after: "
          f"{sum(1 for x in lags if x > 30)}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
