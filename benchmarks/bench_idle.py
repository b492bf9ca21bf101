"""Wake-ups of idle processes: voluntary context switches of every thread, per second.

Targets (issue 36): an idle proc at most 2 per second; an idle controller at most 2 per
second plus what its peers' heartbeats bring. Run: python benchmarks/bench_idle.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def switches(pid: int) -> int:
    """Voluntary context switches of all threads of `pid` so far."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total


def rates(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Wake-ups per second of each process over `seconds`."""
    before = {k: switches(p) for k, p in pids.items()}
    time.sleep(seconds)
    return {k: (switches(p) - before[k]) / seconds for k, p in pids.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--procs", type=int, default=2)
    args = ap.parse_args()
    from runtime import Actor, endpoint, this_host
    from runtime.config import config

    class Pid(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

    pm = this_host().spawn_procs(per_host={"procs": args.procs})
    try:
        m = pm.spawn("idle", Pid)
        pids = {f"proc {i}": p for i, p in enumerate(m.pid.call().get(timeout=60).values())}
        import psutil

        zygote = psutil.Process(pids["proc 0"]).ppid()  # procs fork from the agent's zygote
        pids["host agent"] = psutil.Process(zygote).ppid()
        pids["controller"] = os.getpid()
        time.sleep(1.0)  # start-up done
        got = rates(pids, args.seconds)
        hb = 1 / config.heartbeat_interval
        print(f"| process | wake-ups per second over {args.seconds:g} s | target |")
        print("|---|---|---|")
        for k, v in got.items():
            target = {"controller": f"<= 2 + heartbeats in ({hb * (args.procs + 1):g}/s)",
                      "host agent": "(no target)"}.get(k, "<= 2")
            print(f"| {k} | {v:.1f} | {target} |")
    finally:
        pm.stop().get(timeout=30)


if __name__ == "__main__":
    main()
