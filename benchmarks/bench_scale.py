"""Scale: a call + gather to 64 vs 1,024 actors on 16 host agents (LocalJob), side by side.

16 agents x 4 procs = 64 procs; 16 actor meshes of 64 actors = 1,024 actors. For each size
it prints the median time of `call()` + gather of every reply, and the messages the
controller sends per cast (runtime stats["sent"]): with per-host fan-out that is one per
host agent (16), not one per actor. The reference row is the 64-actor case of the same run.

    PYTHONPATH=. python benchmarks/bench_scale.py [--hosts 16] [--procs 4] [--meshes 16]
"""
from __future__ import annotations

import argparse
import statistics
import time

import runtime
from runtime import Actor, endpoint
from runtime.job import LocalJob


class Echo(Actor):
    """Replies with its rank: the smallest real endpoint."""

    @endpoint
    def ping(self, x: int) -> int:
        return x


def timed(fn, iters: int, warmup: int = 3) -> tuple[list[float], list[float]]:
    """Wall times and this process's CPU times (all threads: user + I/O) of `iters` runs."""
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(iters):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--procs", type=int, default=4, help="procs per host")
    ap.add_argument("--meshes", type=int, default=16, help="actor meshes (one actor per proc each)")
    ap.add_argument("--iters", type=int, default=30)
    a = ap.parse_args()
    rt = runtime.get_runtime()
    t0 = time.perf_counter()
    job = LocalJob(hosts=a.hosts, progress=False)
    try:
        hosts = job.state().hosts
        procs = hosts.spawn_procs(per_host={"procs": a.procs}, name="bench")
        procs.initialized.get(timeout=300)
        meshes = [procs.spawn(f"echo{i}", Echo) for i in range(a.meshes)]
        for m in meshes:
            m.initialized.get(timeout=300)
        n_procs = a.hosts * a.procs
        setup = time.perf_counter() - t0

        def one() -> None:
            assert len(meshes[0].ping.call(1).get(timeout=60)) == n_procs

        def all_() -> None:
            futs = [m.ping.call(1) for m in meshes]
            assert sum(len(f.get(timeout=60)) for f in futs) == n_procs * a.meshes

        def sent_per_cast(fn, casts: int) -> float:
            before = rt.stats["sent"]
            fn()
            return (rt.stats["sent"] - before) / casts

        rows = []
        for label, fn, casts in (("1 mesh", one, 1), (f"{a.meshes} meshes", all_, a.meshes)):
            times, cpu = timed(fn, a.iters)
            msgs = statistics.median(sent_per_cast(fn, casts) for _ in range(5))
            rows.append((label, casts * n_procs, casts, statistics.median(times) * 1e3, msgs,
                         statistics.median(cpu) * 1e3))
    finally:
        job.kill()
    ref = rows[0][3]
    print(f"LocalJob: {a.hosts} host agents, {a.hosts * a.procs} procs, set-up {setup:.1f} s")
    print(f"{'actor meshes':>14} {'actors':>7} {'casts':>6} {'median call+gather ms':>22} "
          f"{'x ref':>6} {'controller CPU ms':>18} {'msgs sent/cast':>15} {'actors/cast':>12}")
    for label, actors, casts, ms, msgs, cpu_ms in rows:
        print(f"{label:>14} {actors:>7} {casts:>6} {ms:>22.1f} {ms / ref:>6.2f} {cpu_ms:>18.1f} "
              f"{msgs:>15.1f} {actors // casts:>12}")
    print("ref = the 1-mesh row of this run; msgs sent/cast counts the controller's sends "
          "(runtime stats['sent']): one per host agent with per-host fan-out.")


if __name__ == "__main__":
    main()
