"""The tensor engine's costs, measured in one run.

    python benchmarks/bench_tensor_engine.py [--ops 10000] [--steps 20] [--quick]
    python benchmarks/bench_tensor_engine.py --only dispatch [--ops 10000] [--repeat 3]

(1) dispatch: `x = x + 1` on a 4x4 tensor, N times on a 4-proc mesh after one untimed op
    (the first runs on meta tensors, ~1 s with torch's lazy imports): ops per second issued
    by the controller, and until the last has run (a fetch of x returns N + 1).
(2) real work: forward + backward + SGD step of a 3-layer 512-wide MLP at batch 512 on a
    1-proc mesh, against the same step run locally in this process; median step times and
    their ratio (the mesh step ends with a fetch of the loss, so it includes the work;
    mesh and local steps alternate, so both see the same load).
(3) memory: the engine's live shards and bytes on a proc when idle, and after the loop.
(4) collectives (benchmarks/_bench_collectives.py): `reduce_` of 64 MiB over 4 procs against
    raw torch.distributed all_reduce (gloo) on 4 processes torch starts in the same run;
    `to_mesh` of 64 MiB between two procs against an RDMABuffer same-host read between two
    procs; rounds alternate floor and ours. DDP step time of notebooks/ddp.ipynb's actors
    (torch DDP, gloo) against the same model and batch as mesh tensors with grad_generator
    and reduce_, and with backward() and one coalesced reduce_ of all gradients, steps
    alternating.
`--only dispatch` runs section (1) alone, `--repeat` times on one mesh, and prints the
median and the spread (min-max) of each figure.
Progress goes to stderr, the table to stdout."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import psutil  # noqa: E402
import torch  # noqa: E402

import runtime  # noqa: E402
from runtime import this_host  # noqa: E402
from runtime.tensor import engine_stats, flush  # noqa: E402


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def dispatch(mesh, n: int) -> tuple[float, float, dict, dict, float, float]:
    with mesh.activate():
        x = torch.zeros(4, 4)
        x = x + 1  # warm-up: the first op runs on meta tensors (and imports torch._dynamo)
        runtime.inspect(x)
        idle = engine_stats(mesh).get(timeout=60).item(procs=0)
        rss0 = rss_mib(mesh.procs[0].pid)
        t0 = time.perf_counter()
        for _ in range(n):
            x = x + 1
        t_issue = time.perf_counter() - t0
        val = runtime.inspect(x, procs=3)[0, 0].item()
        t_all = time.perf_counter() - t0
        assert val == n + 1, val
        flush()
        after = engine_stats(mesh).get(timeout=60).item(procs=0)
        rss1 = rss_mib(mesh.procs[0].pid)
    return n / t_issue, n / t_all, idle, after, rss0, rss1


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 512))


def one_step(model, opt, x, y, fetch) -> float:
    t0 = time.perf_counter()
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    fetch(loss)
    return time.perf_counter() - t0


def real_work(steps: int) -> tuple[float, float]:
    """Median step times (mesh, local), the two alternating so that both see the same load
    of this shared machine; two untimed warm-up steps each."""
    one = this_host().spawn_procs(per_host={"procs": 1}, name="bench_mlp")
    try:
        with one.activate():
            rmodel = mlp()
            ropt = torch.optim.SGD(rmodel.parameters(), lr=0.01)
            rx, ry = torch.randn(512, 512), torch.randn(512, 512)
        lmodel = mlp()
        lopt = torch.optim.SGD(lmodel.parameters(), lr=0.01)
        lx, ly = torch.randn(512, 512), torch.randn(512, 512)
        remote, local = [], []
        for i in range(steps + 2):
            r = one_step(rmodel, ropt, rx, ry, runtime.inspect)
            loc = one_step(lmodel, lopt, lx, ly, lambda t: t.item())
            if i >= 2:
                remote.append(r)
                local.append(loc)
    finally:
        one.stop().get(timeout=30)
    return statistics.median(remote), statistics.median(local)


def dispatch_only(ops: int, repeat: int) -> None:
    """Section (1) alone, `repeat` times on one 4-proc mesh: median and spread."""
    mesh = this_host().spawn_procs(per_host={"procs": 4}, name="bench_te")
    issued, e2e = [], []
    try:
        mesh.initialized.get(timeout=60)
        for i in range(repeat):
            progress(f"dispatch {i + 1}/{repeat}: {ops} ops on 4 procs ...")
            a, b, *_ = dispatch(mesh, ops)
            issued.append(a)
            e2e.append(b)
    finally:
        mesh.stop().get(timeout=30)
    print("| measure | median | min - max | runs, in order |")
    print("|---|---|---|---|")
    for name, xs in (("issued", issued), ("end to end", e2e)):
        print(f"| `x = x + 1` {name}, 4 procs | {statistics.median(xs):,.0f} ops/s | "
              f"{min(xs):,.0f} - {max(xs):,.0f} | {', '.join(f'{x:,.0f}' for x in xs)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="1,000 ops, 5 steps")
    ap.add_argument("--only", choices=["dispatch"], help="run one section alone")
    ap.add_argument("--repeat", type=int, default=3, help="runs of --only's section")
    a = ap.parse_args()
    if a.quick:
        a.ops, a.steps = 1000, 5
    if a.only == "dispatch":
        dispatch_only(a.ops, a.repeat)
        return
    mesh = this_host().spawn_procs(per_host={"procs": 4}, name="bench_te")
    try:
        mesh.initialized.get(timeout=60)
        progress(f"dispatch: {a.ops} ops on 4 procs ...")
        issued, e2e, idle, after, rss0, rss1 = dispatch(mesh, a.ops)
    finally:
        mesh.stop().get(timeout=30)
    progress(f"MLP step: {a.steps} steps, 1 proc vs local ...")
    remote, local = real_work(a.steps)
    from _bench_collectives import ddp_rows, reduce_rows, to_mesh_rows

    rounds, k = (2, 3) if a.quick else (5, 4)
    raw_red, our_red = reduce_rows(64 << 20, rounds, k, progress)
    rdma_t, our_move = to_mesh_rows(64 << 20, rounds, k, progress)
    ddp_actor, ddp_mesh, ddp_bucket = ddp_rows(a.steps * 2, progress)
    print("| measure | value | target |")
    print("|---|---|---|")
    print(f"| `x = x + 1` issued, 4 procs | {issued:,.0f} ops/s | |")
    print(f"| `x = x + 1` end to end, 4 procs | {e2e:,.0f} ops/s | >= 10,000 ops/s |")
    print(f"| MLP 3x512, batch 512, fwd+bwd+SGD on 1 proc | {remote * 1e3:.1f} ms | |")
    print(f"| same step, local | {local * 1e3:.1f} ms | |")
    print(f"| ratio mesh / local | {remote / local:.2f}x | <= 1.3x |")
    print(f"| engine on a proc, idle | {idle['live']} shards, {idle['bytes']} B; "
          f"proc RSS {rss0:.0f} MiB | |")
    print(f"| raw torch.distributed all_reduce 64 MiB, 4 procs (gloo) | "
          f"{raw_red * 1e3:.0f} ms | floor |")
    print(f"| `t.reduce_(\"procs\")` 64 MiB, 4 procs | {our_red * 1e3:.0f} ms "
          f"({our_red / raw_red:.2f}x) | <= 1.25x |")
    gbs = (64 << 20) / 1e9
    print(f"| RDMABuffer read 64 MiB, proc to proc, same host | {gbs / rdma_t:.2f} GB/s | "
          "reference |")
    print(f"| `t.to_mesh(other)` 64 MiB, proc to proc | {gbs / our_move:.2f} GB/s "
          f"({rdma_t / our_move:.2f}x of RDMABuffer) | |")
    print(f"| DDP step, notebooks/ddp.ipynb's actors (DDP, gloo), 2 procs | "
          f"{ddp_actor * 1e3:.1f} ms | reference |")
    print(f"| DDP step, mesh tensors: grad_generator + `reduce_(\"procs\", \"avg\")` | "
          f"{ddp_mesh * 1e3:.1f} ms ({ddp_mesh / ddp_actor:.2f}x) | |")
    print(f"| DDP step, mesh tensors: backward() + coalesced `reduce_` | "
          f"{ddp_bucket * 1e3:.1f} ms ({ddp_bucket / ddp_actor:.2f}x) | |")
    print(f"| after the {a.ops:,}-op loop | {after['live']} shards, {after['bytes']} B; "
          f"proc RSS {rss1:.0f} MiB | flat |")


if __name__ == "__main__":
    main()
    runtime.shutdown()
