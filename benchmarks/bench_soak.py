"""Soak: N cycles of each churn pattern in one controller; what grows per 1,000 cycles.

    python benchmarks/bench_soak.py [--cycles 2000] [--every 1000] [--patterns mesh,actor,rdma]

Patterns (each in the same controller, one after the other):
- mesh:  spawn 2 procs and 1 actor mesh, call it, stop the proc mesh;
- actor: on one persistent 2-proc mesh, spawn an actor mesh, call it, stop it;
- rdma:  create an RDMABuffer of 64 KiB, have an actor read it, drop it.

For each pattern, after a warm-up, it samples every `--every` cycles: controller and proc
RSS, open fds and threads (the host agent's for `mesh`, whose procs do not persist), files
under the runtime root, and the size of every runtime table (controller and proc). The
table gives growth per 1,000 cycles (RSS: KB per cycle, least-squares slope). Targets:
files and tables flat, RSS under 0.5 KB per cycle. Progress goes to stderr, the table to
stdout.
"""

from __future__ import annotations

import argparse
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


class Probe(Actor):
    """Reports its proc's table sizes; reads RDMA buffers for the rdma pattern."""

    @endpoint
    def tables(self) -> dict:
        return runtime.get_runtime().table_sizes()

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


class Soak:
    """Runs the churn patterns in this controller and samples what they leave."""

    def __init__(self) -> None:
        self.rt = runtime.get_runtime()
        self.host = this_host()
        self.me = psutil.Process()
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
        if pattern == "mesh":
            pm = self.host.spawn_procs(per_host={"procs": 2}, name="soak-mesh")
            am = pm.spawn("soak-echo", Echo)
            assert list(am.ping.call(i).get(60).values()) == [i, i]
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

    def sample(self, pattern: str, cycle: int) -> Sample:
        import gc

        gc.collect()
        time.sleep(0.05)  # late replies and exit reports land
        tables = {f"ctl.{k}": v for k, v in self.rt.table_sizes().items()}
        proc_tables = self.probe.slice(procs=0).tables.call_one().get(60)
        tables.update({f"proc.{k}": v for k, v in proc_tables.items()})
        from runtime.rdma.server import current_server

        srv = current_server()
        tables["ctl.rdma_buffers"] = len(srv.registry) if srv is not None else 0
        other = _usage(self.agent_ps if pattern == "mesh" else self.proc_ps)
        return Sample(cycle, time.monotonic(), _usage(self.me), other, rundir.count_files(),
                      tables)

    def run(self, pattern: str, cycles: int, every: int,
            warmup: int) -> tuple[Optional[Sample], list[Sample]]:
        """Warm up (sampled before), then `cycles` cycles with a sample at the start and
        every `every`: (the sample before the warm-up or None, the samples after it)."""
        before = self.sample(pattern, -warmup) if warmup else None
        for i in range(warmup):
            self.cycle(pattern, i)
            if (i + 1) % 100 == 0:
                print(f"  {pattern}: warm-up {i + 1}/{warmup}", file=sys.stderr, flush=True)
        samples = [self.sample(pattern, 0)]
        t0 = time.monotonic()
        for i in range(1, cycles + 1):
            self.cycle(pattern, i)
            if i % every == 0 or i == cycles:
                samples.append(self.sample(pattern, i))
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


def growth(samples: list[Sample]) -> dict:
    """RSS KB/cycle and the change of every other figure from the first sample."""
    first, last = samples[0], samples[-1]
    xs = [s.cycle for s in samples]
    out = {
        "ctl_rss_kb_per_cycle": slope(xs, [s.ctl["rss"] / 1024 for s in samples]),
        "other_rss_kb_per_cycle": slope(xs, [s.other["rss"] / 1024 for s in samples]),
        "ctl_fds": last.ctl["fds"] - first.ctl["fds"],
        "ctl_threads": last.ctl["threads"] - first.ctl["threads"],
        "other_fds": last.other["fds"] - first.other["fds"],
        "other_threads": last.other["threads"] - first.other["threads"],
        "files": last.files - first.files,
        "tables": {k: last.tables.get(k, 0) - v for k, v in first.tables.items()
                   if last.tables.get(k, 0) != v},
    }
    return out


def print_table(pattern: str, samples: list[Sample], before: Optional[Sample] = None) -> None:
    other = "agent" if pattern == "mesh" else "proc"
    print(f"\n## {pattern}: {samples[-1].cycle} cycles")
    print(f"| cycles | ctl RSS MB | ctl fds | ctl thr | {other} RSS MB | {other} fds | "
          f"{other} thr | files | changed tables (vs. start) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    base = samples[0].tables
    for s in samples:
        diff = ", ".join(f"{k} {base.get(k, 0)}->{v}" for k, v in s.tables.items()
                         if v != base.get(k, 0)) or "none"
        print(f"| {s.cycle} | {s.ctl['rss'] / 2**20:.1f} | {s.ctl['fds']} | "
              f"{s.ctl['threads']} | {s.other['rss'] / 2**20:.1f} | {s.other['fds']} | "
              f"{s.other['threads']} | {s.files} | {diff} |")
    g = growth(samples)
    if before is not None:  # what the warm-up cycles added: allocator and caches filling
        n = -before.cycle
        print(f"\nper cycle during the {n} warm-up cycles: controller RSS "
              f"{(samples[0].ctl['rss'] - before.ctl['rss']) / 1024 / n:+.3f} KB, {other} RSS "
              f"{(samples[0].other['rss'] - before.other['rss']) / 1024 / n:+.3f} KB")
    print(f"\nper cycle after warm-up: controller RSS {g['ctl_rss_kb_per_cycle']:+.3f} KB, "
          f"{other} RSS {g['other_rss_kb_per_cycle']:+.3f} KB (target < 0.5 KB)")
    tables = ", ".join(f"{k} {samples[0].tables[k]}" for k in sorted(samples[0].tables))
    print(f"table sizes at start: {tables}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=2000)
    ap.add_argument("--every", type=int, default=1000, help="sample every N cycles")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    args = ap.parse_args(argv)
    patterns = [p for p in args.patterns.split(",") if p]
    for p in patterns:
        if p not in PATTERNS:
            ap.error(f"unknown pattern {p!r} (have {', '.join(PATTERNS)})")
    print(f"# bench_soak: {args.cycles} cycles per pattern, sample every {args.every}, "
          f"warm-up {args.warmup}; runtime root {rundir.root()}")
    soak = Soak()
    try:
        for p in patterns:
            print(f"{p}: warm-up {args.warmup} cycles", file=sys.stderr, flush=True)
            before, samples = soak.run(p, args.cycles, args.every, args.warmup)
            print_table(p, samples, before)
            sys.stdout.flush()
    finally:
        soak.close()
        runtime.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
