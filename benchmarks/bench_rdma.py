"""RDMABuffer throughput per transport, beside single-threaded memcpy measured in the same run.

    python benchmarks/bench_rdma.py [--max-size 1GiB] [--min-size 1MiB] [--transports vm,tcp]

An owner process (spawned) exports one buffer per size; this process reads and writes it
with each transport (forced through MONARCH_RDMA_TRANSPORT). Destinations are warm (touched
before timing), as is the memcpy reference. Figures are medians of repeated runs, after one
untimed run per cell (steady state: connections and registrations are made once and reused).
Progress goes to stderr, the table to stdout."""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from runtime.rdma import RDMABuffer, get_rdma_backend  # noqa: E402
from runtime.rdma import ibverbs  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ref_common import progress  # noqa: E402

UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    if t and t[-1] in UNITS:
        return int(float(t[:-1]) * UNITS[t[-1]])
    return int(t)


def fmt_size(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:g} {unit}"
    return f"{n} B"


def owner(sizes: list[int], conn) -> None:
    """Export one buffer per size (views of one allocation) and wait to be told to exit."""
    big = torch.ones(max(sizes), dtype=torch.uint8)  # touched: pages are resident
    conn.send([RDMABuffer(big[:n]) for n in sizes])
    conn.recv()


def timed(fn, min_reps: int, budget_s: float) -> float:
    """Median seconds of fn() over at least min_reps runs (more while within budget_s)."""
    fn()  # warm-up: connections, pins, page tables
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - start < budget_s and len(times) < 50):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-size", default="1GiB")
    ap.add_argument("--min-size", default="1MiB")
    ap.add_argument("--transports", default="", help="comma list of vm,tcp,ibverbs (default: all usable)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0.8, help="seconds per cell beyond --reps")
    args = ap.parse_args()
    lo, hi = parse_size(args.min_size), parse_size(args.max_size)
    sizes = []
    n = lo
    while n <= hi:
        sizes.append(n)
        n *= 4
    if sizes[-1] != hi:
        sizes.append(hi)
    usable = ["vm", "tcp"] + (["ibverbs"] if ibverbs.probe()[0] else [])
    transports = [t for t in args.transports.split(",") if t] or usable
    ok, why = ibverbs.probe()

    progress(f"starting the owner process ({len(sizes)} buffers up to {fmt_size(hi)})")
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=owner, args=(sizes, there), daemon=True)
    proc.start()
    try:
        buffers = here.recv()
        print(f"# RDMABuffer benchmark: owner pid {proc.pid}, reader pid {os.getpid()}, "
              f"{os.cpu_count()} cpus, load average {os.getloadavg()[0]:.2f} at start; "
              f"ibverbs: {why}; default cross-host backend: {get_rdma_backend()}")
        print("# memcpy = single-threaded libc memmove into warm memory, measured per size in this run")
        head = f"{'size':>9} {'transport':>9} {'read GB/s':>10} {'write GB/s':>11} {'memcpy GB/s':>12} {'read/memcpy':>12} {'write/memcpy':>13}"
        print(head)
        print("-" * len(head))
        for size, buf in zip(sizes, buffers):
            progress(f"{fmt_size(size)}: memcpy, then {', '.join(transports)} read and write")
            dst = torch.ones(size, dtype=torch.uint8)  # warm destination
            src = torch.full((size,), 7, dtype=torch.uint8)
            mc = timed(lambda: ctypes.memmove(dst.data_ptr(), src.data_ptr(), size), args.reps, args.budget)
            mc_gbs = size / mc / 1e9
            for t in transports:
                os.environ["MONARCH_RDMA_TRANSPORT"] = t
                timeout = 30 + size / 2e8
                rd = timed(lambda: buf.read_into(dst, timeout=timeout).get(), args.reps, args.budget)
                wr = timed(lambda: buf.write_from(src, timeout=timeout).get(), args.reps, args.budget)
                assert buf.last_transport == t, (buf.last_transport, t)
                r_gbs, w_gbs = size / rd / 1e9, size / wr / 1e9
                print(f"{fmt_size(size):>9} {t:>9} {r_gbs:>10.2f} {w_gbs:>11.2f} {mc_gbs:>12.2f} "
                      f"{r_gbs / mc_gbs:>12.2f} {w_gbs / mc_gbs:>13.2f}", flush=True)
        progress("done")
        print(f"# load average {os.getloadavg()[0]:.2f} at end (other work on these cpus skews both columns)")
    finally:
        os.environ.pop("MONARCH_RDMA_TRANSPORT", None)
        try:
            here.send("exit")
        except OSError:
            pass
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


if __name__ == "__main__":
    main()
