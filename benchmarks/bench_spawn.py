"""Spawn at scale: N host agents (LocalJob, one proc each), then `spawn_procs`, the actors,
and a first call to all of them, each timed, with the memory in use at the end.

Issue 50's target: the procs of 256 real agents spawned in under 10 s on the 2-core machine
(starting the agents themselves is measured apart: it is N Python processes importing the
runtime). Progress goes to stderr, the figures to stdout.

    PYTHONPATH=. python benchmarks/bench_spawn.py [--hosts 256]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import psutil

import runtime
from runtime import Actor, endpoint
from runtime.job import LocalJob

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ref_common import progress  # noqa: E402


class Echo(Actor):
    """Answers with its rank."""

    @endpoint
    def ping(self) -> int:
        return runtime.current_rank().rank


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=256)
    a = ap.parse_args()
    t0 = time.perf_counter()
    progress(f"starting {a.hosts} host agents (LocalJob)")
    job = LocalJob(a.hosts, progress=False)
    try:
        hosts = job.state().hosts
        t1 = time.perf_counter()
        progress(f"spawn_procs: {a.hosts} procs")
        pm = hosts.spawn_procs(per_host={"procs": 1}, name="spawned")
        pm.initialized.get(timeout=600)
        t2 = time.perf_counter()
        progress("spawning the actors")
        m = pm.spawn("echo", Echo)
        m.initialized.get(timeout=600)
        t3 = time.perf_counter()
        assert len(m.ping.call().get(timeout=120)) == a.hosts
        t4 = time.perf_counter()
        used = psutil.virtual_memory().used / 2**30
    finally:
        progress("stopping the job")
        job.cleanup()
    print(f"{a.hosts} host agents, one proc each: agents up {t1 - t0:.1f} s, spawn_procs "
          f"{t2 - t1:.1f} s, actors {t3 - t2:.1f} s, first call to all {1e3 * (t4 - t3):.0f} "
          f"ms; memory in use {used:.1f} GiB (the whole machine)")


if __name__ == "__main__":
    main()
