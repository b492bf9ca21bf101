"""Chaos across hosts: two caller threads pipeline calls (10 deep) to random actors of a
2 hosts x 2 procs mesh (`LocalJob` agents over CurveZMQ TCP, the code of SLURM and SSH
agents) while a random proc is SIGKILLed every `--every` seconds for `--seconds`
(tests/_chaos.py, which the test suite runs for 8 s). Prints what happened: calls
answered and failed, and the invariants (none wrong, none hung, no answer lost that a
killed proc had sent, every kill detected naming SIGKILL).

    PYTHONPATH=. python benchmarks/bench_chaos.py [--seconds 60] [--every 2] [--hosts 2]
        [--cluster]

`--cluster` (root): on the namespaced test cluster instead (tests/multihost/mhcluster.py),
agents in network namespaces, every message across the test bridge; brought up and torn
down here.
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
    p.add_argument("--cluster", action="store_true")
    a = p.parse_args()
    runtime.unhandled_fault_hook = lambda failure: None  # the kills are the point
    logs = tempfile.mkdtemp(prefix="chaos-")
    where = "LocalJob agents over CurveZMQ TCP"
    try:
        if a.cluster:
            out = _on_cluster(a, logs)
            where = "the namespaced cluster"
        else:
            path = os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH", "")]))
            job = LocalJob(a.hosts, progress=False, env={"PYTHONPATH": path})
            try:
                out = run(job.state().hosts, logs, seconds=a.seconds, every=a.every)
            finally:
                job.kill()
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    rows = [("calls", out.calls), ("answered", out.answered),
            ("failed (SupervisionError)", out.failed), ("procs killed", len(out.kills)),
            ("wrong answers", len(out.wrong)), ("hung calls", len(out.hung)),
            ("other errors", len(out.other_errors)),
            ("answers sent by a killed proc and not counted", len(out.lost)),
            ("kills not detected (naming SIGKILL)", len(out.undetected))]
    print(f"chaos: {a.hosts} hosts x 2 procs ({where}), a SIGKILL every {a.every:g} s for "
          f"{a.seconds:g} s, 2 caller threads")
    for name, n in rows:
        print(f"  {name:48s} {n:>10,}")
    ok = not (out.wrong or out.hung or out.other_errors or out.lost or out.undetected)
    print("  invariants:", "hold" if ok else "BROKEN", flush=True)
    os._exit(0 if ok else 1)  # the runtime's own exit would wait for agents already gone


def _on_cluster(a, logs: str):
    """The chaos on `a.hosts` nodes of the namespaced cluster, brought up and down here."""
    import subprocess
    from pathlib import Path

    import cloudpickle

    import runtime
    import _chaos
    from multihost.agents import Agents
    from multihost.mhcluster import Cluster, unavailable

    reason = unavailable()
    if reason:
        sys.exit(f"the namespaced cluster cannot run: {reason}")
    cloudpickle.register_pickle_by_value(_chaos)  # the agents' procs cannot import tests/
    os.chmod(logs, 0o777)
    c = Cluster(n=3)
    c.up()
    tmp = Path(tempfile.mkdtemp())
    tmp.chmod(0o700)
    agents = Agents(c, tmp / "cluster.key", tmp)
    try:
        subprocess.run([sys.executable, "-m", "runtime.transport.auth", "keygen",
                        str(tmp / "cluster.key")], check=True, capture_output=True)
        addrs = [agents.start(n) for n in c.nodes[:a.hosts]]
        hosts = runtime.attach_to_workers(addrs, key_file=str(tmp / "cluster.key"))
        return _chaos.run(hosts, logs, seconds=a.seconds, every=a.every)
    finally:
        agents.stop()
        c.down(check=False)
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"cluster left behind: {c.leftovers() or 'nothing'}", file=sys.stderr)


if __name__ == "__main__":
    main()
