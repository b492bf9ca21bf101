"""GPU data path: CUDA tensor arguments and RDMABuffer over CUDA memory, beside floors
measured in the same run.

    python benchmarks/bench_gpu.py [--sizes 64MiB,256MiB,1GiB] [--reps 3]

Prints, in one run:
- endpoint arguments echoed back by an actor on a GPU proc of this host: a CUDA tensor of
  1 MiB / 64 MiB beside a CPU tensor of the same size (GB/s each way);
- RDMABuffer between this process and an owner process on the same GPU host: CUDA->CUDA,
  CPU->CUDA (the owner's host memory into our device), CUDA->CPU, per size, beside the
  floors: a local device-to-device copy, a CUDA IPC copy between two processes (torch's
  own sharing, torch.multiprocessing), and a pinned device-to-host copy;
- each target of docs/gpu.md as met or missed, and by how much.
Without a CUDA device it says so and exits 0. Progress goes to stderr, the table to stdout."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from _ref_common import progress  # noqa: E402

MiB = 1 << 20


def parse_size(text: str) -> int:
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)


def fmt(n: int) -> str:
    if n >= 1 << 30:
        return f"{n >> 30} GiB"
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def timed(fn, reps: int, budget_s: float = 1.0) -> float:
    """Median seconds of fn() (after one untimed run), at least `reps` runs."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < reps or (time.perf_counter() - start < budget_s and len(times) < 20):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sync() -> None:
    torch.cuda.synchronize()


# -- the owner process ------------------------------------------------------------------------
def owner(sizes: list[int], conn) -> None:
    """Export a CUDA and a host buffer per size; share one CUDA tensor the torch way too."""
    import torch.multiprocessing  # noqa: F401 - registers CUDA IPC sharing for conn.send

    from runtime.rdma import RDMABuffer

    gpu = torch.ones(max(sizes), dtype=torch.uint8, device="cuda")
    cpu = torch.ones(max(sizes), dtype=torch.uint8)
    torch.cuda.synchronize()
    conn.send(([RDMABuffer(gpu[:n]) for n in sizes], [RDMABuffer(cpu[:n]) for n in sizes]))
    conn.send(gpu)  # torch.multiprocessing shares it by CUDA IPC: the floor
    conn.recv()


# -- endpoint arguments -------------------------------------------------------------------------
def bench_arguments(reps: int) -> dict:
    from runtime import Actor, endpoint, this_host

    class Echo(Actor):
        @endpoint
        def echo(self, t):
            return t

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    out: dict = {}
    try:
        echo = procs.spawn("echo", Echo)
        for size in (1 * MiB, 64 * MiB):
            for where in ("cuda", "cpu"):
                t = torch.ones(size, dtype=torch.uint8, device=where)
                progress(f"{where} tensor argument, {fmt(size)}")

                def one() -> None:
                    back = echo.echo.call_one(t).get(timeout=120)
                    if back.is_cuda:
                        torch.cuda.synchronize()
                secs = timed(one, reps)
                out[(where, size)] = 2 * size / secs / 1e9  # each way
    finally:
        procs.stop().get(timeout=60)
    return out


# -- the CUDA IPC threshold --------------------------------------------------------------------
def bench_threshold(sizes: list[int], reps: int) -> dict:
    """A CUDA tensor argument sent one way (the endpoint answers its byte count) per size,
    through CUDA IPC (an RDMABuffer the receiver reads) and staged through pinned host
    memory, in one proc: where IPC starts to win is what `cuda_ipc_min_bytes` should be."""
    from runtime import Actor, configured, endpoint, this_host

    class Sink(Actor):
        @endpoint
        def take(self, t):
            torch.cuda.synchronize()
            return t.numel() * t.element_size()

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    out: dict = {}
    try:
        sink = procs.spawn("sink", Sink)
        for size in sizes:
            t = torch.ones(size, dtype=torch.uint8, device="cuda")
            progress(f"threshold sweep, {fmt(size)}")
            for how, limit in (("ipc", 1), ("staged", 1 << 62)):
                with configured(cuda_ipc_min_bytes=limit):
                    def one() -> None:
                        assert sink.take.call_one(t).get(timeout=120) == size
                    out[(how, size)] = timed(one, reps)
    finally:
        procs.stop().get(timeout=60)
    return out


# -- RDMABuffer ----------------------------------------------------------------------------------
def bench_rdma(sizes: list[int], reps: int) -> tuple[dict, dict]:
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=owner, args=(sizes, there), daemon=True)
    proc.start()
    res: dict = {}
    floors: dict = {}
    try:
        gbufs, cbufs = here.recv()
        shared = here.recv()  # the owner's CUDA tensor, mapped here by torch
        for size, gbuf, cbuf in zip(sizes, gbufs, cbufs):
            progress(f"RDMABuffer and floors at {fmt(size)}")
            dev = torch.empty(size, dtype=torch.uint8, device="cuda")
            dev2 = torch.ones(size, dtype=torch.uint8, device="cuda")
            host = torch.empty(size, dtype=torch.uint8)
            host.fill_(1)
            pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            t = 60 + size / 1e8
            floors[("d2d", size)] = size / timed(lambda: (dev.copy_(dev2), sync()), reps) / 1e9
            floors[("ipc", size)] = size / timed(
                lambda: (dev.copy_(shared[:size]), sync()), reps) / 1e9
            floors[("d2h", size)] = size / timed(lambda: (pinned.copy_(dev2), sync()), reps) / 1e9
            res[("cuda->cuda", size)] = size / timed(
                lambda: gbuf.read_into(dev, timeout=t).get(), reps) / 1e9
            res[("cuda->cuda", size, "via")] = gbuf.last_transport
            res[("cpu->cuda", size)] = size / timed(
                lambda: cbuf.read_into(dev, timeout=t).get(), reps) / 1e9
            res[("cpu->cuda", size, "via")] = cbuf.last_transport
            res[("cuda->cpu", size)] = size / timed(
                lambda: gbuf.read_into(host, timeout=t).get(), reps) / 1e9
            res[("cuda->cpu", size, "via")] = gbuf.last_transport
            dev = dev2 = host = pinned = None  # freed (not `del`: the lambdas above name them)
            torch.cuda.empty_cache()
        shared = None
    finally:
        try:
            here.send("exit")
        except OSError:
            pass
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    return res, floors


def verdict(ok: bool, have: float, want: float) -> str:
    return "met" if ok else f"MISSED ({have / want:.0%} of the target)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="64MiB,256MiB,1GiB")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sweep", default="64KiB,256KiB,1MiB,2MiB,4MiB,16MiB,64MiB",
                    help="sizes of the CUDA IPC threshold sweep ('' to skip it)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("# bench_gpu.py: no CUDA device here (torch.cuda.is_available() is False); "
              "nothing to measure")
        return 0
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    print(f"# GPU data path: {torch.cuda.get_device_name(0)}, {torch.cuda.device_count()} "
          f"GPU(s), {os.cpu_count()} cpus, torch {torch.__version__}")
    arg = bench_arguments(args.reps)
    print("\n## endpoint argument echoed back (GB/s each way)")
    print(f"{'size':>8} {'CUDA tensor':>12} {'CPU tensor':>11}")
    for size in (1 * MiB, 64 * MiB):
        print(f"{fmt(size):>8} {arg[('cuda', size)]:>12.2f} {arg[('cpu', size)]:>11.2f}")
    sweep = [parse_size(x) for x in args.sweep.split(",") if x]
    if sweep:
        from runtime.config import config

        th = bench_threshold(sweep, args.reps)
        print("\n## CUDA tensor argument, one way: CUDA IPC vs staged through pinned host "
              f"(median us; cuda_ipc_min_bytes is now {fmt(config.cuda_ipc_min_bytes)})")
        print(f"{'size':>8} {'IPC us':>9} {'staged us':>10} {'IPC GB/s':>9} {'staged GB/s':>12}"
              "  faster")
        for s in sweep:
            ipc, staged = th[("ipc", s)], th[("staged", s)]
            print(f"{fmt(s):>8} {ipc * 1e6:>9.0f} {staged * 1e6:>10.0f} {s / ipc / 1e9:>9.2f} "
                  f"{s / staged / 1e9:>12.2f}  {'IPC' if ipc < staged else 'staged'}")
        wins = [s for s in sweep if th[("ipc", s)] < th[("staged", s)]]
        first = next((s for s in sweep if all(w in wins for w in sweep if w >= s)), None)
        print("IPC wins from " + (fmt(first) if first else "no size swept") + " up")
    res, floors = bench_rdma(sizes, args.reps)
    print("\n## RDMABuffer, this process <- owner process on this host (GB/s)")
    head = (f"{'size':>8} {'CUDA->CUDA':>11} {'CPU->CUDA':>10} {'CUDA->CPU':>10} "
            f"{'d2d floor':>10} {'IPC floor':>10} {'pinned d2h':>11}  transports")
    print(head)
    print("-" * len(head))
    for s in sizes:
        via = "/".join(str(res[(k, s, "via")]) for k in ("cuda->cuda", "cpu->cuda", "cuda->cpu"))
        print(f"{fmt(s):>8} {res[('cuda->cuda', s)]:>11.2f} {res[('cpu->cuda', s)]:>10.2f} "
              f"{res[('cuda->cpu', s)]:>10.2f} {floors[('d2d', s)]:>10.2f} "
              f"{floors[('ipc', s)]:>10.2f} {floors[('d2h', s)]:>11.2f}  {via}")
    print("\n## targets (docs/gpu.md)")
    a_cuda, a_cpu = arg[("cuda", 64 * MiB)], arg[("cpu", 64 * MiB)]
    print(f"64 MiB CUDA argument >= CPU argument ({a_cpu:.2f}): "
          f"{verdict(a_cuda >= a_cpu, a_cuda, a_cpu)}")
    print(f"64 MiB CUDA argument >= 20 GB/s: {verdict(a_cuda >= 20, a_cuda, 20)}")
    for s in sizes:
        want = 0.5 * floors[("ipc", s)]
        have = res[("cuda->cuda", s)]
        print(f"{fmt(s)} CUDA->CUDA >= 50% of IPC floor: {verdict(have >= want, have, want)}")
        want = 0.5 * floors[("d2h", s)]
        for k in ("cpu->cuda", "cuda->cpu"):
            have = res[(k, s)]
            print(f"{fmt(s)} {k} >= 50% of pinned d2h: {verdict(have >= want, have, want)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
