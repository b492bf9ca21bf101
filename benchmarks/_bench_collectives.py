"""Collectives rows of bench_tensor_engine.py, each beside its floor measured in the same run:
`reduce_` of 64 MiB over 4 procs against raw torch.distributed all_reduce (gloo) on 4
processes torch starts; `to_mesh` of 64 MiB between two procs against an RDMABuffer
same-host read between two procs. Rounds alternate (floor, ours, floor, ours ...) so both
see the same load; medians are of per-operation times."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import statistics
import tempfile
import time

import torch

import runtime
from runtime import Actor, endpoint, this_host
from runtime.rdma import RDMABuffer

MiB = 1 << 20


def _raw_worker(rank: int, n: int, path: str, nbytes: int, conn) -> None:
    """One rank of the raw floor: a gloo group over loopback; times `k` all_reduces on
    command (after a barrier) and sends rank 0's per-op times back."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.FileStore(path, n)
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    opts._timeout = datetime.timedelta(seconds=300)
    pg = dist.ProcessGroupGloo(store, rank, n, opts)
    t = torch.ones(nbytes // 4)
    pg.allreduce([t]).wait()
    conn.send("ready")
    while True:
        k = conn.recv()
        if k is None:
            return
        times = []
        for _ in range(k):
            pg.barrier().wait()
            t0 = time.perf_counter()
            pg.allreduce([t]).wait()
            times.append(time.perf_counter() - t0)
        conn.send(times)


class RawGroup:
    """`n` processes started by torch.multiprocessing, joined in one gloo group."""

    def __init__(self, n: int, nbytes: int) -> None:
        self.dir = tempfile.mkdtemp(prefix="bench-raw-")
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for r in range(n):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_raw_worker, args=(r, n, os.path.join(self.dir, "s"),
                                                      nbytes, b), daemon=True)
            p.start()
            self.conns.append(a)
            self.procs.append(p)
        for c in self.conns:
            if not c.poll(120):
                raise TimeoutError("raw torch.distributed ranks did not start")
            c.recv()

    def run(self, k: int) -> list[float]:
        for c in self.conns:
            c.send(k)
        times = [c.recv() for c in self.conns]
        return times[0]

    def close(self) -> None:
        for c in self.conns:
            c.send(None)
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        import shutil

        shutil.rmtree(self.dir, True)


def reduce_rows(nbytes: int, rounds: int, k: int, progress) -> tuple[float, float]:
    """Median seconds per 64 MiB all-reduce over 4 procs: (raw gloo, reduce_ of a mesh
    tensor, timed from issue to the result fetched on rank 0)."""
    progress("reduce_: starting 4 raw torch.distributed ranks and a 4-proc mesh ...")
    raw = RawGroup(4, nbytes)
    mesh = this_host().spawn_procs(per_host={"procs": 4}, name="bench_reduce")
    try:
        with mesh.activate():
            big = torch.ones(nbytes // 4)
            big.reduce_("procs")
            runtime.inspect(big[:1])
            raw_t, ours = [], []
            for i in range(rounds):
                progress(f"reduce_ round {i + 1}/{rounds}")
                raw_t += raw.run(k)
                for _ in range(k):
                    t0 = time.perf_counter()
                    big.reduce_("procs", "max")  # max: the values stay finite
                    runtime.inspect(big[:1])
                    ours.append(time.perf_counter() - t0)
    finally:
        raw.close()
        mesh.stop().get(timeout=30)
    return statistics.median(raw_t), statistics.median(ours)


class Owner(Actor):
    """Holds a tensor and hands out an RDMABuffer of it."""

    @endpoint
    def buffer(self, nbytes: int) -> RDMABuffer:
        self.t = torch.ones(nbytes // 4)
        return RDMABuffer(self.t.view(torch.uint8).flatten())


class Reader(Actor):
    """Reads an RDMABuffer into its own memory, timing each read."""

    @endpoint
    def read(self, buf: RDMABuffer, nbytes: int, k: int) -> list[float]:
        dst = torch.zeros(nbytes, dtype=torch.uint8)
        buf.read_into(dst).get()
        times = []
        for _ in range(k):
            t0 = time.perf_counter()
            buf.read_into(dst).get()
            times.append(time.perf_counter() - t0)
        return times


def to_mesh_rows(nbytes: int, rounds: int, k: int, progress) -> tuple[float, float]:
    """Median seconds per 64 MiB copy between two procs of one host: (RDMABuffer read,
    to_mesh timed from issue to a fetch of one element on the destination)."""
    progress("to_mesh: a 2-proc mesh ...")
    mesh = this_host().spawn_procs(per_host={"procs": 2}, name="bench_to_mesh")
    try:
        src, dst = mesh.slice(procs=0), mesh.slice(procs=1)
        owner = src.spawn("owner", Owner)
        reader = dst.spawn("reader", Reader)
        buf = owner.buffer.call_one(nbytes).get(timeout=60)
        with src.activate():
            t = torch.ones(nbytes // 4)
        runtime.inspect(t.to_mesh(dst)[:1])
        rdma, ours = [], []
        for i in range(rounds):
            progress(f"to_mesh round {i + 1}/{rounds}")
            rdma += reader.read.call_one(buf, nbytes, k).get(timeout=120)
            for _ in range(k):
                t0 = time.perf_counter()
                moved = t.to_mesh(dst)
                runtime.inspect(moved[:1])
                ours.append(time.perf_counter() - t0)
                del moved
    finally:
        mesh.stop().get(timeout=30)
    return statistics.median(rdma), statistics.median(ours)


class ToyModel(torch.nn.Module):
    """notebooks/ddp.ipynb's model."""

    def __init__(self) -> None:
        super().__init__()
        self.net1 = torch.nn.Linear(10, 10)
        self.relu = torch.nn.ReLU()
        self.net2 = torch.nn.Linear(10, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))


class DDPActor(Actor):
    """notebooks/ddp.ipynb's actor: one DDP rank (gloo), one optimizer step per call."""

    @endpoint
    def setup(self, rank: int, world: int, init: str, batch: int) -> None:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        torch.manual_seed(0)
        self.target = torch.randn(10, 5, generator=torch.Generator().manual_seed(42)) / 3
        self.model = DDP(ToyModel())
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.2)
        self.batch = batch

    @endpoint
    def train_step(self) -> float:
        x = torch.randn(self.batch, 10)
        loss = torch.nn.functional.mse_loss(self.model(x), x @ self.target)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.item()

    @endpoint
    def cleanup(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()


def ddp_rows(steps: int, progress, batch: int = 20) -> tuple[float, float, float]:
    """Median seconds per DDP step on 2 procs, each step ending with rank 0's loss here:
    (actor-based DDP as in notebooks/ddp.ipynb, mesh tensors with grad_generator + reduce_,
    mesh tensors with backward() + one coalesced reduce_ of all gradients)."""
    from runtime.tensor import coalescing, grad_generator, manual_seed

    progress("DDP: two 2-proc meshes (actor DDP, mesh-tensor DDP) ...")
    actors_pm = this_host().spawn_procs(per_host={"procs": 2}, name="bench_ddp_actors")
    mesh = this_host().spawn_procs(per_host={"procs": 2}, name="bench_ddp_mesh")
    d = tempfile.mkdtemp(prefix="bench-ddp-")
    try:
        ddp = actors_pm.spawn("ddp", DDPActor)
        futs = [ddp.slice(procs=r).setup.call_one(r, 2, f"file://{d}/store", batch)
                for r in range(2)]
        for f in futs:
            f.get(timeout=120)
        with mesh.activate():
            manual_seed(0)
            model = ToyModel()
            target = torch.randn(10, 5) / 3
            opt = torch.optim.SGD(model.parameters(), lr=0.2)
            manual_seed(1, per_rank=True)
            params = list(model.parameters())[::-1]

            def mesh_step() -> float:
                x = torch.randn(batch, 10)
                loss = torch.nn.functional.mse_loss(model(x), x @ target)
                for p, g in zip(params, grad_generator(loss, params)):
                    g.reduce_("procs", "avg")
                    p.grad = g
                opt.step()
                opt.zero_grad()
                return loss.item()

            def bucket_step() -> float:
                x = torch.randn(batch, 10)
                loss = torch.nn.functional.mse_loss(model(x), x @ target)
                loss.backward()
                with coalescing():
                    for p in params:
                        p.grad.reduce_("procs", "avg")
                opt.step()
                opt.zero_grad()
                return loss.item()

            actor_t, mesh_t, bucket_t = [], [], []
            for i in range(steps + 3):
                t0 = time.perf_counter()
                ddp.train_step.call().get(timeout=60)
                t1 = time.perf_counter()
                mesh_step()
                t2 = time.perf_counter()
                bucket_step()
                t3 = time.perf_counter()
                if i >= 3:
                    actor_t.append(t1 - t0)
                    mesh_t.append(t2 - t1)
                    bucket_t.append(t3 - t2)
        ddp.cleanup.call().get(timeout=30)
    finally:
        actors_pm.stop().get(timeout=30)
        mesh.stop().get(timeout=30)
        import shutil

        shutil.rmtree(d, True)
    return statistics.median(actor_t), statistics.median(mesh_t), statistics.median(bucket_t)
