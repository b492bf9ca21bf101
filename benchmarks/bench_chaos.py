"""Chaos across hosts: two caller threads pipeline calls (10 deep) to random actors of a
2 hosts x 2 procs mesh (`LocalJob` agents over CurveZMQ TCP, the code of SLURM and SSH
agents) while a random proc is SIGKILLed every `--every` seconds for `--seconds`
(tests/_chaos.py, which the test suite runs for 8 s). Prints what happened: calls
answered and failed, and the invariants (none wrong, none hung, no answer lost that a
killed proc had sent, every kill detected naming SIGKILL).

    PYTHONPATH=. python benchmarks/bench_chaos.py [--seconds 60] [--every 2] [--hosts 2]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")
sys.path.insert(0, TESTS)


def main() -> None:
    import runtime
    from runtime.job import LocalJob
    from _chaos import run

    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--every", type=float, default=2.0)
    p.add_argument("--hosts", type=int, default=2)
    a = p.parse_args()
    runtime.unhandled_fault_hook = lambda failure: None  # the kills are the point
    path = os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH", "")]))
    job = LocalJob(a.hosts, progress=False, env={"PYTHONPATH": path})
    logs = tempfile.mkdtemp(prefix="chaos-")
    try:
        out = run(job.state().hosts, logs, seconds=a.seconds, every=a.every)
    finally:
        job.kill()
        shutil.rmtree(logs, ignore_errors=True)
    rows = [("calls", out.calls), ("answered", out.answered),
            ("failed (SupervisionError)", out.failed), ("procs killed", len(out.kills)),
            ("wrong answers", len(out.wrong)), ("hung calls", len(out.hung)),
            ("other errors", len(out.other_errors)),
            ("answers sent by a killed proc and not counted", len(out.lost)),
            ("kills not detected (naming SIGKILL)", len(out.undetected))]
    print(f"chaos: {a.hosts} hosts x 2 procs, a SIGKILL every {a.every:g} s for "
          f"{a.seconds:g} s, 2 caller threads")
    for name, n in rows:
        print(f"  {name:48s} {n:>10,}")
    ok = not (out.wrong or out.hung or out.other_errors or out.lost or out.undetected)
    print("  invariants:", "hold" if ok else "BROKEN")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
