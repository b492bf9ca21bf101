"""Soak: N cycles of each churn pattern in one controller; what grows per cycle.

    python benchmarks/bench_soak.py [--cycles 2000] [--every 100] [--patterns mesh,actor,rdma]

Patterns (each in the same controller, one after the other):
- mesh:  spawn 2 procs and 1 actor mesh, call it, stop the proc mesh;
- actor: on one persistent 2-proc mesh, spawn an actor mesh, call it, stop it;
- rdma:  create an RDMABuffer of 64 KiB, have an actor read it, drop it.

For each pattern, after a warm-up, it samples every `--every` cycles: controller and proc
RSS, open fds and threads (the host agent's for `mesh`, whose procs do not persist), files
under the runtime root, the size of every runtime table (controller and proc) and the
number of objects the garbage collector tracks (controller and persistent proc). RSS and
objects grow by the least-squares slope over the last three quarters of the cycles
(cycles 500-2,000 of 2,000: the first quarter is warm-up). Targets: files and tables flat;
RSS per cycle under 0.5 KB in the controller (`mesh`, `actor`) and under 1 KB per actor
mesh in the proc (`actor`). RSS depends on the allocator (glibc arenas, trim threshold,
huge pages: `keep_message_memory`, `hugepages`); the object counts do not. Progress goes
to stderr, the tables to stdout.
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil  # noqa: E402

import runtime  # noqa: E402
from runtime import Actor, endpoint, rundir, this_host  # noqa: E402

PATTERNS = ("mesh", "actor", "rdma")


class Echo(Actor):
    """The churned actor."""

    @endpoint
    def ping(self, x: int) -> int:
        return x


def object_counts() -> dict[str, int]:
    """Objects the garbage collector tracks in this process, by type (`module.qualname`),
    after a collection; plus `fds` and `threads` (what churn must not grow)."""
    gc.collect()
    out: dict[str, int] = {}
    for t, n in collections.Counter(map(type, gc.get_objects())).items():  # names once a type
        name = f"{t.__module__}.{t.__qualname__}"
        out[name] = out.get(name, 0) + n
    me = psutil.Process()
    out["fds"], out["threads"] = me.num_fds(), me.num_threads()
    return out


class Probe(Actor):
    """Reports its proc's table sizes and objects; reads RDMA buffers for the rdma
    pattern."""

    @endpoint
    def tables(self) -> dict:
        return runtime.get_runtime().table_sizes()

    @endpoint
    def objects(self) -> dict:
        """This proc's `object_counts()`."""
        return object_counts()

    @endpoint
    def usage(self) -> dict:
        """This proc's RSS, fds, threads and number of gc-tracked objects."""
        gc.collect()
        return {**_usage(psutil.Process()), "objects": len(gc.get_objects())}

    @endpoint
    def hold(self) -> bool:
        """Export a buffer from this proc (it starts the proc's data server)."""
        import torch

        from runtime.rdma import RDMABuffer

        self.held = RDMABuffer(torch.ones(8, dtype=torch.uint8))
        return True

    @endpoint
    def read(self, buf) -> int:
        import torch

        dst = torch.empty(buf.size(), dtype=torch.uint8)
        buf.read_into(dst).get()
        return int(dst[0])


@dataclass
class Sample:
    """What was measured after `cycle` cycles."""

    cycle: int
    t: float
    ctl: dict
    other: dict  # the persistent proc (actor, rdma) or the host agent (mesh)
    files: int
    tables: dict = field(default_factory=dict)


def _usage(p: psutil.Process) -> dict:
    try:
        return {"rss": p.memory_info().rss, "fds": p.num_fds(), "threads": p.num_threads()}
    except psutil.Error:
        return {"rss": 0, "fds": 0, "threads": 0}


def _ctl_usage() -> dict:
    gc.collect()  # before RSS: what cycles of garbage held is freed
    objs = gc.get_objects()
    mine = list(map(type, objs)).count(Sample)  # the samples this benchmark keeps
    return {**_usage(psutil.Process()), "objects": len(objs) - mine}


class Soak:
    """Runs the churn patterns in this controller and samples what they leave."""

    def __init__(self) -> None:
        self.rt = runtime.get_runtime()
        self.host = this_host()
        self.me = psutil.Process()
        self.cycle_pids: list[int] = []
        self.procs = self.host.spawn_procs(per_host={"procs": 2}, name="soak-keep")
        self.probe = self.procs.spawn("soak-probe", Probe)
        self.probe.initialized.get(60)
        deadline = time.monotonic() + 30
        while not self.procs.procs[0].pid:  # known once the proc's hello is handled
            if time.monotonic() > deadline:
                raise TimeoutError("the soak proc never said hello")
            time.sleep(0.01)
        self.proc_ps = psutil.Process(self.procs.procs[0].pid)
        self.agent_ps = self.proc_ps.parent().parent()  # proc <- zygote <- host agent
        import torch

        self.data = torch.ones(64 << 10, dtype=torch.uint8)

    def cycle(self, pattern: str, i: int) -> None:
        """One cycle of `pattern` (its `i`-th)."""
        if pattern == "mesh":
            pm = self.host.spawn_procs(per_host={"procs": 2}, name="soak-mesh")
            try:
                am = pm.spawn("soak-echo", Echo)
                assert list(am.ping.call(i).get(60).values()) == [i, i]
            finally:
                self.cycle_pids = [p.pid for p in pm.procs if p.pid]  # for a clean-up
            pm.stop().get(60)
        elif pattern == "actor":
            am = self.procs.spawn("soak-echo", Echo)
            assert list(am.ping.call(i).get(60).values()) == [i, i]
            am.stop().get(60)
        elif pattern == "rdma":
            from runtime.rdma import RDMABuffer

            buf = RDMABuffer(self.data)
            assert self.probe.slice(procs=0).read.call_one(buf).get(60) == 1
            buf.drop().get(60)
        else:
            raise ValueError(f"unknown pattern {pattern!r}")

    def pids(self) -> list[int]:
        """Pids of the persistent procs and of the last mesh cycle's (a test's clean-up)."""
        return [p.pid for p in self.procs.procs if p.pid] + self.cycle_pids

    def counts(self) -> dict[str, dict[str, int]]:
        """Objects by type, fds, threads and tables (`table.<name>`) of the controller
        ("ctl") and of the persistent proc 0 ("proc")."""
        time.sleep(0.05)  # late replies and exit reports land
        ctl = object_counts()
        ctl.update({f"table.{k}": v for k, v in self.rt.table_sizes().items()})
        probe = self.probe.slice(procs=0)
        proc = probe.objects.call_one().get(60)
        proc.update({f"table.{k}": v for k, v in probe.tables.call_one().get(60).items()})
        return {"ctl": ctl, "proc": proc}

    def sample(self, pattern: str, cycle: int, objects: bool = True) -> Sample:
        """What `cycle` cycles of `pattern` left; without `objects`, the controller's usage
        leaves out its number of objects (a walk of its whole heap: `counts()` has them)."""
        gc.collect()  # weakly held table entries, and sockets only garbage holds (their fds)
        time.sleep(0.05)  # late replies and exit reports land
        tables = {f"ctl.{k}": v for k, v in self.rt.table_sizes().items()}
        proc_tables = self.probe.slice(procs=0).tables.call_one().get(60)
        tables.update({f"proc.{k}": v for k, v in proc_tables.items()})
        from runtime.rdma.server import current_server

        srv = current_server()
        tables["ctl.rdma_buffers"] = len(srv.registry) if srv is not None else 0
        other = (_usage(self.agent_ps) if pattern == "mesh"
                 else self.probe.slice(procs=0).usage.call_one().get(60))
        ctl = _ctl_usage() if objects else _usage(self.me)
        return Sample(cycle, time.monotonic(), ctl, other, rundir.count_files(), tables)

    def run(self, pattern: str, cycles: int, every: int, warmup: int,
            objects: bool = True) -> tuple[Optional[Sample], list[Sample]]:
        """Warm up (sampled before), then `cycles` cycles with a sample at the start and
        every `every`: (the sample before the warm-up or None, the samples after it);
        `objects` as for `sample`."""
        before = self.sample(pattern, -warmup, objects) if warmup else None
        for i in range(warmup):
            self.cycle(pattern, i)
            if (i + 1) % 100 == 0:
                print(f"  {pattern}: warm-up {i + 1}/{warmup}", file=sys.stderr, flush=True)
        samples = [self.sample(pattern, 0, objects)]
        t0 = time.monotonic()
        for i in range(1, cycles + 1):
            self.cycle(pattern, i)
            if i % every == 0 or i == cycles:
                samples.append(self.sample(pattern, i, objects))
            if i % max(1, min(every, 100)) == 0:
                rate = i / (time.monotonic() - t0)
                print(f"  {pattern}: {i}/{cycles} cycles ({rate:.0f}/s)", file=sys.stderr,
                      flush=True)
        return before, samples

    def close(self) -> None:
        self.procs.stop().get(60)


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (0 with fewer than two points)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def growth(samples: list[Sample], since: int = 0) -> dict:
    """RSS KB/cycle and objects/cycle (least-squares slopes over the samples from cycle
    `since` on), and the change of every other figure from the first sample."""
    first, last = samples[0], samples[-1]
    tail = [s for s in samples if s.cycle >= since] or samples
    xs = [s.cycle for s in tail]
    out = {
        "ctl_rss_kb_per_cycle": slope(xs, [s.ctl["rss"] / 1024 for s in tail]),
        "other_rss_kb_per_cycle": slope(xs, [s.other["rss"] / 1024 for s in tail]),
        "ctl_objects_per_cycle": slope(xs, [s.ctl.get("objects", 0) for s in tail]),
        "other_objects_per_cycle": slope(xs, [s.other.get("objects", 0) for s in tail]),
        "ctl_fds": last.ctl["fds"] - first.ctl["fds"],
        "ctl_threads": last.ctl["threads"] - first.ctl["threads"],
        "other_fds": last.other["fds"] - first.other["fds"],
        "other_threads": last.other["threads"] - first.other["threads"],
        "files": last.files - first.files,
        "tables": {k: last.tables.get(k, 0) - v for k, v in first.tables.items()
                   if last.tables.get(k, 0) != v},
    }
    return out


#: RSS targets per cycle (KB): the controller's, and the proc's per actor mesh
TARGETS = {"ctl": 0.5, "proc": 1.0}


def print_table(pattern: str, samples: list[Sample], before: Optional[Sample] = None,
                since: int = 0) -> dict:
    """Print one pattern's samples and slopes; returns `growth(samples, since)`."""
    other = "agent" if pattern == "mesh" else "proc"
    print(f"\n## {pattern}: {samples[-1].cycle} cycles")
    print(f"| cycles | ctl RSS MB | ctl objects | ctl fds | ctl thr | {other} RSS MB | "
          f"{other} objects | {other} fds | {other} thr | files | changed tables (vs. start) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    base = samples[0].tables
    for s in samples:
        diff = ", ".join(f"{k} {base.get(k, 0)}->{v}" for k, v in s.tables.items()
                         if v != base.get(k, 0)) or "none"
        print(f"| {s.cycle} | {s.ctl['rss'] / 2**20:.2f} | {s.ctl.get('objects', '-')} | "
              f"{s.ctl['fds']} | {s.ctl['threads']} | {s.other['rss'] / 2**20:.2f} | "
              f"{s.other.get('objects', '-')} | {s.other['fds']} | {s.other['threads']} | "
              f"{s.files} | {diff} |")
    g = growth(samples, since)
    if before is not None:  # what the warm-up cycles added: allocator and caches filling
        n = -before.cycle
        print(f"\nper cycle during the {n} warm-up cycles: controller RSS "
              f"{(samples[0].ctl['rss'] - before.ctl['rss']) / 1024 / n:+.3f} KB, {other} RSS "
              f"{(samples[0].other['rss'] - before.other['rss']) / 1024 / n:+.3f} KB")
    last = samples[-1].cycle
    ctl_ok = "met" if g["ctl_rss_kb_per_cycle"] < TARGETS["ctl"] else "MISSED"
    print(f"\n{pattern}: slope over cycles {since}-{last}: controller RSS "
          f"{g['ctl_rss_kb_per_cycle']:+.3f} KB/cycle (target < {TARGETS['ctl']}: {ctl_ok}), "
          f"objects {g['ctl_objects_per_cycle']:+.3f}/cycle")
    if pattern == "mesh":
        print(f"{pattern}: slope over cycles {since}-{last}: agent RSS "
              f"{g['other_rss_kb_per_cycle']:+.3f} KB/cycle")
    else:
        proc_ok = ("met" if g["other_rss_kb_per_cycle"] < TARGETS["proc"] or pattern != "actor"
                   else "MISSED")
        target = f" (target < {TARGETS['proc']}: {proc_ok})" if pattern == "actor" else ""
        print(f"{pattern}: slope over cycles {since}-{last}: proc RSS "
              f"{g['other_rss_kb_per_cycle']:+.3f} KB/cycle{target}, objects "
              f"{g['other_objects_per_cycle']:+.3f}/cycle")
    tables = ", ".join(f"{k} {samples[0].tables[k]}" for k in sorted(samples[0].tables))
    print(f"table sizes at start: {tables}")
    return g


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=2000, help="cycles per pattern")
    ap.add_argument("--every", type=int, default=100, help="sample every N cycles")
    ap.add_argument("--warmup", type=int, default=0,
                    help="cycles before the first sample (the slopes skip the first quarter "
                         "of the cycles anyway)")
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    args = ap.parse_args(argv)
    since = args.cycles // 4  # slopes over the last three quarters: 500-2,000 of 2,000
    patterns = [p for p in args.patterns.split(",") if p]
    for p in patterns:
        if p not in PATTERNS:
            ap.error(f"unknown pattern {p!r} (have {', '.join(PATTERNS)})")
    from runtime.config import config

    print(f"# bench_soak: {args.cycles} cycles per pattern, sample every {args.every}, "
          f"warm-up {args.warmup}, slopes over cycles {since}-{args.cycles}; runtime root "
          f"{rundir.root()}; procs' malloc: keep_message_memory={config.keep_message_memory}"
          f", hugepages={config.hugepages}; {time.strftime('%Y-%m-%d')}")
    soak = Soak()
    try:
        for p in patterns:
            print(f"{p}: warm-up {args.warmup} cycles", file=sys.stderr, flush=True)
            before, samples = soak.run(p, args.cycles, args.every, args.warmup)
            print_table(p, samples, before, since)
            sys.stdout.flush()
    finally:
        soak.close()
        runtime.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
