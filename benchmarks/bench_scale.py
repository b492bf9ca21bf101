"""Scale: a call + gather to 64 vs 1,024 actors on 16 host agents (LocalJob), side by side,
1,024 again with the replies gathered per host (gather_replies='on'), and 1,024 through a
cast tree of the agents (cast_fanout=--fanout, default 4: the controller sends 4 messages
per cast and gets 4 batches back), and the same with the answers summed on the way up
(`Accumulator(..., associative=True)`: the agents fold, the controller gets 4 partial sums).
With --payload KIB every actor answers a float32 array of that size instead of an int.

16 agents x 4 procs = 64 procs; 16 actor meshes of 64 actors = 1,024 actors. For each size
it prints the median time of `call()` + gather of every reply, the controller's CPU time
(all its threads: process_time) per iteration and per cast, and the messages the controller
sends per cast (runtime stats["sent"]): with per-host fan-out that is one per host agent
(16), not one per actor. The reference row is the 64-actor case of the same run. Progress
goes to stderr, the table to stdout.

    PYTHONPATH=. python benchmarks/bench_scale.py [--hosts 16] [--procs 4] [--meshes 16] [--fanout 4]
        [--payload 0]
"""
from __future__ import annotations

import argparse
import operator
import os
import statistics
import sys
import time

import runtime
from runtime import Actor, endpoint
from runtime.job import LocalJob

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ref_common import progress  # noqa: E402


class Echo(Actor):
    """Replies with its rank: the smallest real endpoint."""

    @endpoint
    def ping(self, x: int) -> int:
        return x

    @endpoint
    def blob(self, kib: int):
        import numpy

        return numpy.ones(kib * 256, dtype=numpy.float32)


def timed(fn, iters: int, warmup: int = 3) -> tuple[list[float], list[float]]:
    """Wall times and this process's CPU times (all threads: user + I/O) of `iters` runs,
    after `warmup` runs that reach the steady state (the first casts to a mesh open the
    agents' connections to its procs: a once-per-mesh cost, not a per-cast one)."""
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
    ap.add_argument("--fanout", type=int, default=4,
                    help="cast_fanout of the tree row (the other rows: one FANOUT per agent)")
    ap.add_argument("--payload", type=int, default=0,
                    help="KiB of float32 each actor answers (0: an int)")
    a = ap.parse_args()
    rt = runtime.get_runtime()
    t0 = time.perf_counter()
    progress(f"starting {a.hosts} host agents (LocalJob)")
    job = LocalJob(hosts=a.hosts, progress=False)
    try:
        hosts = job.state().hosts
        progress(f"spawning {a.hosts * a.procs} procs")
        procs = hosts.spawn_procs(per_host={"procs": a.procs}, name="bench")
        procs.initialized.get(timeout=300)
        progress(f"spawning {a.meshes} actor meshes")
        meshes = [procs.spawn(f"echo{i}", Echo) for i in range(a.meshes)]
        for m in meshes:
            m.initialized.get(timeout=300)
        n_procs = a.hosts * a.procs
        setup = time.perf_counter() - t0

        def ep(m):
            return m.blob if a.payload else m.ping

        arg = a.payload or 1

        def one() -> None:
            assert len(ep(meshes[0]).call(arg).get(timeout=60)) == n_procs

        def all_() -> None:
            futs = [ep(m).call(arg) for m in meshes]
            assert sum(len(f.get(timeout=60)) for f in futs) == n_procs * a.meshes

        sums = [runtime.Accumulator(ep(m), 0, operator.add, associative=True) for m in meshes]

        def folded() -> None:
            futs = [s.accumulate(arg) for s in sums]
            for f in futs:
                got = f.get(timeout=60)
                assert (got == n_procs).all() if a.payload else got == n_procs

        from runtime.transport.framing import Kind

        kinds = rt.loop.stats.by_kind

        def replies() -> int:
            return kinds[Kind.REPLY] + kinds[Kind.REPLY_BATCH]

        def msgs_per_cast(fn, casts: int) -> tuple[float, float]:
            """(messages the casts put on the wire, answers received: single replies and
            batches) per cast; heartbeats are not counted."""
            sent, received = rt.messenger.cast_messages, replies()
            fn()
            return ((rt.messenger.cast_messages - sent) / casts, (replies() - received) / casts)

        rows = []
        star = max(a.hosts, 16)  # cast_fanout at least the hosts: one FANOUT per agent
        cases = (("1 mesh", one, 1, "off", star),
                 (f"{a.meshes} meshes", all_, a.meshes, "off", star),
                 (f"{a.meshes} meshes, gathered", all_, a.meshes, "on", star),
                 (f"{a.meshes} meshes, tree fan-out {a.fanout}", all_, a.meshes, "auto",
                  a.fanout),
                 (f"{a.meshes} meshes, tree, summed", folded, a.meshes, "auto", a.fanout))
        for label, fn, casts, gather, fanout in cases:
            progress(f"{label}: {a.iters} x call + gather to {casts * n_procs} actors")
            with runtime.configured(gather_replies=gather, cast_fanout=fanout):
                times, cpu = timed(fn, a.iters)
                counts = [msgs_per_cast(fn, casts) for _ in range(5)]
            msgs = (statistics.median(c[0] for c in counts), statistics.median(c[1] for c in counts))
            rows.append((label, casts * n_procs, casts, statistics.median(times) * 1e3, msgs,
                         statistics.median(cpu) * 1e3,
                         statistics.median(c / casts for c in cpu) * 1e3))
    finally:
        progress("stopping the job")
        job.cleanup()  # kill, and remove the job's directory
    ref = rows[0][3]
    print(f"LocalJob: {a.hosts} host agents, {a.hosts * a.procs} procs, set-up {setup:.1f} s, "
          f"answers: {f'{a.payload} KiB of float32 each' if a.payload else 'an int each'}")
    print(f"{'actor meshes':>24} {'actors':>7} {'casts':>6} {'median call+gather ms':>22} "
          f"{'x ref':>6} {'controller CPU ms':>18} {'controller CPU ms/cast':>22} "
          f"{'msgs sent/cast':>15} {'msgs received/cast':>19} {'actors/cast':>12}")
    for label, actors, casts, ms, msgs, cpu_ms, cpu_cast in rows:
        print(f"{label:>24} {actors:>7} {casts:>6} {ms:>22.1f} {ms / ref:>6.2f} {cpu_ms:>18.1f} "
              f"{cpu_cast:>22.2f} {msgs[0]:>15.1f} {msgs[1]:>19.1f} {actors // casts:>12}")
    print("ref = the 1-mesh row of this run. controller CPU = CPU time of the controller "
          "process (all threads) per iteration (all its casts and gathers), median; per cast = "
          "that divided by the casts. msgs sent/received per cast: one sent per host agent with "
          "per-host fan-out. gathered: each "
          "host agent sends the replies of its procs to a call as one message "
          "(gather_replies='on'; the default 'auto' gathers for agents on other hosts only: "
          "here the agents' extra work competes with the controller for the same cores). "
          "tree: casts go down a tree of agents with at most --fanout children each and the "
          "replies come back up it (docs/transport.md, 'The cast tree'). sent: the messages "
          "the casts put on the wire; received: replies and reply batches (heartbeats and "
          "other traffic not counted), medians over 5 rounds of one iteration. summed: "
          "Accumulator(endpoint, 0, operator.add, associative=True).accumulate() on each "
          "mesh: the agents add their subtree's answers (docs/runtime.md, 'Reducing on the "
          "way up').")


if __name__ == "__main__":
    main()
