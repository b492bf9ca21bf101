"""Collectives of mesh tensors with real procs (gloo): every reduction over every dimension
combination against the same computation done locally on the gathered shards, renamed and
split meshes, scatter, in place, to_mesh and slice_mesh, errors at the call site, failures
inside a collective (an input failed on one proc, a proc killed mid-reduce)."""

from __future__ import annotations

import itertools
import os
import signal
import time

import pytest
import torch

import runtime
from runtime import SupervisionError, this_host
from runtime.tensor import MeshDimError, RemoteTensorError, flush, manual_seed, mesh_rank
from _procs import spawn_procs_fixture

pytestmark = pytest.mark.timeout(180)

LOCAL = {"sum": lambda s: s.sum(0), "avg": lambda s: s.mean(0), "product": lambda s: s.prod(0),
         "min": lambda s: s.amin(0), "max": lambda s: s.amax(0), "stack": lambda s: s}


mesh = spawn_procs_fixture({"host": 2, "gpu": 2}, "coll")


def shards(t, shape):
    """{coords tuple: local tensor} for every rank of `shape` (a dict of sizes)."""
    out = {}
    for c in itertools.product(*(range(n) for n in shape.values())):
        out[c] = runtime.inspect(t, dict(zip(shape, c)), timeout=60)
    return out


def expected(values, sizes, dims, reduction):
    """The reduction done locally on the gathered shards, per rank coordinate."""
    names = list(sizes)
    res = {}
    for c in values:
        fixed = {n: c[i] for i, n in enumerate(names) if n not in dims}
        group = [v for k, v in sorted(values.items())
                 if all(k[names.index(n)] == x for n, x in fixed.items())]
        res[c] = LOCAL[reduction](torch.stack(group))
    return res


@pytest.mark.parametrize("dims", [("host",), ("gpu",), ("host", "gpu")])
def test_every_reduction_over_every_dimension_matches_local(mesh, dims):
    sizes = {"host": 2, "gpu": 2}
    with mesh.activate():
        manual_seed(7, per_rank=True)
        x = torch.rand(3, 4) + 0.5
        outs = {red: x.reduce(dims, red) for red in ("sum", "avg", "product", "min", "max")}
        if len(dims) == 1:
            outs["stack"] = runtime.reduce(x, dims, "stack")
    values = shards(x, sizes)
    for red, out in outs.items():
        want = expected(values, sizes, dims, red)
        got = shards(out, sizes)
        for c in values:
            torch.testing.assert_close(got[c], want[c], msg=f"{red} over {dims} at {c}")


def test_reduce_over_renamed_and_split_meshes(mesh):
    renamed = mesh.rename(host="dp", gpu="tp")
    with renamed.activate():
        r = mesh_rank()
        s = (r.float() + 1).reduce("dp")
    # tp coordinate 0 holds ranks 0 and 2 (values 1 and 3); tp 1 holds 2 and 4
    assert [runtime.inspect(s, dp=d, tp=t).item() for d in range(2) for t in range(2)] == \
        [4.0, 6.0, 4.0, 6.0]
    flat = mesh.flatten("procs")
    split = flat.split(procs=("dp", "pp"), pp=2)
    assert split.sizes == {"dp": 2, "pp": 2}
    with split.activate():
        v = mesh_rank().float()  # 2dp + pp
        by_dp = v.reduce("dp", "stack")
        by_pp = v.reduce("pp", "max")
    assert runtime.inspect(by_dp, dp=1, pp=1).tolist() == [1.0, 3.0]
    assert [runtime.inspect(by_pp, dp=d, pp=0).item() for d in range(2)] == [1.0, 3.0]


def test_scatter_inplace_out_and_all_to_all(mesh):
    with mesh.activate():
        r = mesh_rank("gpu").float()
        rows = torch.arange(4.0).reshape(2, 2) + 10 * r  # rank g: [[0,1],[2,3]] + 10g
        scattered = rows.reduce("gpu", scatter=True)
        a2a = rows.reduce("gpu", "stack", scatter=True)
        y = rows.clone()
        same = y.reduce_("gpu", "max")
        out = torch.zeros(2, 2)
        into = rows.reduce("gpu", "min", out=out)
    assert same is y and into is out
    # sum over g of rows: [[10, 12], [14, 16]]; gpu g keeps row g
    assert runtime.inspect(scattered, host=0, gpu=0).tolist() == [10.0, 12.0]
    assert runtime.inspect(scattered, host=1, gpu=1).tolist() == [14.0, 16.0]
    # all-to-all: gpu g receives row g of every member
    assert runtime.inspect(a2a, host=0, gpu=1).tolist() == [[2.0, 3.0], [12.0, 13.0]]
    assert runtime.inspect(y, gpu=0).tolist() == [[10.0, 11.0], [12.0, 13.0]]
    assert runtime.inspect(out, gpu=1).tolist() == [[0.0, 1.0], [2.0, 3.0]]


def test_errors_at_the_call_site_name_the_mesh_dims(mesh):
    with mesh.activate():
        x = torch.ones(3)
        with pytest.raises(MeshDimError, match=r"no dimension 'dp'.*'host': 2, 'gpu': 2"):
            x.reduce("dp")
        with pytest.raises(ValueError, match="one dimension only"):
            x.reduce(("host", "gpu"), "stack")
        with pytest.raises(ValueError, match="outermost dimension"):
            x.reduce("gpu", scatter=True)
        with pytest.raises(ValueError, match="adds a dimension"):
            x.reduce_("gpu", "stack")
        with pytest.raises(TypeError, match="floating-point"):
            torch.ones(3, dtype=torch.int64).reduce("gpu", "avg")
        w = torch.ones(3, requires_grad=True)
        with pytest.raises(ValueError, match="autograd"):
            (w * 2).reduce("gpu")
        with pytest.raises(ValueError, match="out has shape"):
            x.reduce("gpu", out=torch.zeros(4))
    with pytest.raises(TypeError, match="needs a mesh tensor"):
        runtime.reduce(torch.ones(3), "gpu")
    sub = mesh.slice(host=0)
    with sub.activate():
        other = torch.zeros(3)
    with pytest.raises(ValueError, match="out lives on"):
        x.reduce("gpu", out=other)


@pytest.mark.parametrize("path", ["auto", "tcp"])  # auto: process_vm_readv; tcp: gloo send
def test_to_mesh_round_trip_broadcast_and_slice_mesh(mesh, path):
    stage0, stage1 = mesh.slice(host=0), mesh.slice(host=1)
    with runtime.configured(rdma_transport=path), mesh.activate():
        r = mesh_rank().float()
        a = runtime.slice_mesh(r * 10, host=0)  # on stage0: 0, 10
        assert a.mesh.sizes == {"gpu": 2}
        b = a.to_mesh(stage1)
        back = (b + 1).to_mesh(stage0)
        everywhere = a.to_mesh(mesh)  # broadcast along host
    assert [runtime.inspect(b, gpu=g).item() for g in range(2)] == [0.0, 10.0]
    assert b.mesh.procs[0].proc_id == stage1.procs[0].proc_id
    assert [runtime.inspect(back, gpu=g).item() for g in range(2)] == [1.0, 11.0]
    assert [runtime.inspect(everywhere, host=h, gpu=g).item()
            for h in range(2) for g in range(2)] == [0.0, 10.0, 0.0, 10.0]
    with pytest.raises(ValueError, match="size 2 on the source"):
        a.to_mesh(mesh.slice(host=1, gpu=slice(0, 1)))
    with mesh.activate():
        tree = runtime.to_mesh(runtime.slice_mesh({"a": r, "n": 3, "l": [r + 1]}, host=1),
                               stage0)
    assert tree["n"] == 3 and tree["a"].mesh.sizes == {"gpu": 2}
    assert runtime.inspect(tree["l"][0], gpu=1).item() == 4.0
    with pytest.raises(TypeError, match="needs a mesh tensor"):
        runtime.to_mesh([1, 2], stage0)
    with mesh.activate():
        kept = runtime.reduce(mesh_rank().float(), "host", mesh=stage0)
    assert kept.mesh.sizes == {"gpu": 2}
    assert [runtime.inspect(kept, gpu=g).item() for g in range(2)] == [2.0, 4.0]


def test_an_input_failed_on_one_proc_fails_the_outputs_not_the_group(mesh):
    with mesh.activate():
        idx = mesh_rank() * 5  # index 0 is fine, 5 and more are out of range
        bad = torch.arange(4.0).index_select(0, idx.reshape(1))
        out = bad.reduce(("host", "gpu"))
        with pytest.raises(RemoteTensorError, match="failed on another proc|index"):
            runtime.inspect(out, host=0, gpu=0)
        with pytest.raises(RemoteTensorError, match="index"):
            runtime.inspect(out, host=1, gpu=1)
        ok = torch.ones(2).reduce(("host", "gpu"))
        assert runtime.inspect(ok, host=1, gpu=0).tolist() == [4.0, 4.0]


def test_a_proc_killed_mid_reduce_fails_the_reduce_without_a_hang():
    pm = this_host().spawn_procs(per_host={"procs": 3}, name="coll_doomed")
    try:
        with pm.activate():
            big = torch.ones(8 << 20)
            big.reduce_("procs")
            assert runtime.inspect(big[:1], procs=0).item() == 3.0
            for _ in range(30):
                big.reduce_("procs")
            flush()
        os.kill(pm.procs[2].pid, signal.SIGKILL)
        # fails within 20 s (a TimeoutError otherwise), not at the collective timeout
        with pytest.raises((RemoteTensorError, SupervisionError)) as info:
            runtime.inspect(big[:1], procs=0, timeout=20)
        if isinstance(info.value, RemoteTensorError):  # gloo saw the peer go
            assert "reduce_(procs" in str(info.value) and "Connection" in str(info.value)
        survivors = pm.slice(procs=slice(0, 2))
        with survivors.activate():
            fresh = torch.ones(4).reduce("procs")
        assert runtime.inspect(fresh, procs=1, timeout=60).tolist() == [2.0] * 4
    finally:
        pm.stop().get(timeout=30)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_cuda
def test_cuda_reduce_with_nccl_on_one_gpu_per_proc():
    gpus = this_host().spawn_procs(per_host={"gpus": 1}, name="coll_nccl")
    try:
        with gpus.activate():
            x = torch.full((1024,), 3.0, device="cuda")
            s = x.reduce("gpus", "sum")
            x.reduce_("gpus", "max")
        got = runtime.inspect(s)
        assert got.device.type == "cpu" and got.tolist() == [3.0] * 1024
        assert runtime.inspect(x)[:2].tolist() == [3.0, 3.0]
    finally:
        gpus.stop().get(timeout=30)


@needs_cuda
def test_cuda_tensors_on_procs_sharing_a_gpu_use_gloo():
    pm = this_host().spawn_procs(per_host={"procs": 2}, name="coll_cuda_gloo")
    try:
        with pm.activate():
            r = mesh_rank().float().cuda()
            x = torch.ones(4, device="cuda") * (r + 1)
            s = x.reduce("procs")
            big = torch.ones(4 << 20, device="cuda").reduce("procs", "avg")
            moved = runtime.slice_mesh(x, procs=0).to_mesh(pm.slice(procs=1))
        assert runtime.inspect(s, procs=1).tolist() == [3.0] * 4
        assert runtime.inspect(big[:2], procs=0).tolist() == [1.0, 1.0]
        assert runtime.inspect(moved).tolist() == [1.0] * 4
    finally:
        pm.stop().get(timeout=30)


def test_a_stopped_mesh_leaves_no_rendezvous_directory():
    from runtime import rundir

    def dirs():
        return {p.name for p in rundir.socket_root().iterdir() if p.name.startswith("collectives-")}

    before = dirs()
    pm = this_host().spawn_procs(per_host={"procs": 2}, name="coll_gone")
    with pm.activate():
        s = torch.ones(2).reduce("procs")
    assert runtime.inspect(s).tolist() == [2.0, 2.0]
    made = dirs() - before
    assert len(made) == 1
    pm.stop().get(timeout=30)
    other = this_host().spawn_procs(per_host={"procs": 1}, name="coll_next")
    try:
        with other.activate():  # a new engine sweeps the engines of stopped meshes
            torch.ones(1)
        assert not made & dirs()
    finally:
        other.stop().get(timeout=30)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(*[m for _ in range(3)
                                            for m in (torch.nn.Linear(4, 4), torch.nn.ReLU())])

    def forward(self, x, target):
        return torch.nn.functional.cross_entropy(self.layers(x), target)


def _train(model, x, target, comms=None):
    """Monarch's DDP walkthrough: reduce each gradient as the backward pass yields it, then
    step the parameter; with `comms`, the reduction runs on a borrowed copy on that stream."""
    loss = model(x, target)
    rparams = list(reversed(list(model.parameters())))
    with torch.no_grad():
        for param, grad in zip(rparams, runtime.grad_generator(loss, rparams)):
            if comms is None:
                grad.reduce_("dp", "sum")
            else:
                comm_grad, borrow = comms.borrow(grad, mutable=True)
                with comms.activate():
                    comm_grad.reduce_("dp", "sum")
                borrow.drop()
            param += 0.01 * grad


def test_a_monarch_style_program_runs(mesh):
    """The flow of Monarch's distributed-tensors walkthrough, on CPU: the mesh as a table,
    renamed and split meshes, a pipeline of slices under no_grad, DDP with grad_generator,
    and the same with a comms stream."""
    table = mesh.to_table()
    assert table.splitlines()[0].split()[:3] == ["rank", "host", "gpu"]
    assert len(table.splitlines()) == 5
    assert mesh.rename(host="dp", gpu="tp").sizes == {"dp": 2, "tp": 2}
    assert mesh.split(host=("dp", "pp"), gpu=("tp",), pp=2).sizes == {"dp": 1, "pp": 2, "tp": 2}

    pipeline_mesh = mesh.rename(host="pp")
    meshes = [pipeline_mesh.slice(pp=i) for i in range(pipeline_mesh.size("pp"))]
    stages = []
    for stage_mesh in meshes:
        with stage_mesh.activate():
            stages.append(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    with meshes[0].activate():
        x = torch.rand(3, 4)
    with torch.no_grad():
        for stage_mesh, stage in zip(meshes, stages):
            x = x.to_mesh(stage_mesh)
            with stage_mesh.activate():
                x = stage(x)
    assert x.mesh is meshes[1] and runtime.inspect(x).shape == (3, 4)

    dp = mesh.rename(gpu="dp")
    assert runtime.get_active_stream().name == "main"
    comms = runtime.Stream("comms")
    for stream in (None, comms):
        with dp.activate():
            manual_seed(0)
            model = _Net()
            manual_seed(5, per_rank=True)
            _train(model, torch.rand(3, 4), torch.full((3,), 1, dtype=torch.int64), stream)
        w = [runtime.inspect(model.layers[0].weight, host=0, dp=d) for d in range(2)]
        assert torch.equal(w[0], w[1]), "the dp replicas diverged"
    _, b = comms.borrow(x)
    b.drop()
    with pytest.raises(RuntimeError, match="already dropped"):
        b.drop()


def test_coalescing_fuses_consecutive_reductions_and_keeps_order(mesh):
    with mesh.activate():
        r = mesh_rank().float()
        a, b = torch.ones(3) * (r + 1), torch.ones(2, 2) * (r + 10)
        c = torch.ones(4, dtype=torch.int64)
        with runtime.coalescing():
            a.reduce_(("host", "gpu"))           # these two fuse (same groups, sum, float)
            s = b.reduce(("host", "gpu"))
            m = b.reduce("gpu", "max")           # another group: its own command
            d = c.reduce(("host", "gpu"))        # int64: its own command
            used = a * 2                         # an op reading a: sends what is pending first
            with runtime.coalescing():           # nested: joins the outer block
                e = (r + 1).reduce(("host", "gpu"), "avg")
    assert runtime.inspect(a, host=1, gpu=1).tolist() == [10.0] * 3
    assert runtime.inspect(used).tolist() == [20.0] * 3
    assert runtime.inspect(s, gpu=1).tolist() == [[46.0, 46.0]] * 2
    assert runtime.inspect(m, host=1, gpu=0).tolist() == [[13.0, 13.0]] * 2
    assert runtime.inspect(d).tolist() == [4] * 4
    assert runtime.inspect(e).item() == 2.5
    with mesh.activate():
        x = torch.ones(2)
        with runtime.coalescing():
            x.reduce_("gpu")
        bad_idx = mesh_rank() * 5
        broken = torch.arange(4.0).index_select(0, bad_idx.reshape(1))
        one = torch.ones(1)
        with runtime.coalescing():  # fused: one input failed on rank 1 fails both outputs
            f1 = broken.reduce(("host", "gpu"))
            f2 = one.reduce(("host", "gpu"))
    assert runtime.inspect(x).tolist() == [2.0, 2.0]
    with pytest.raises(RemoteTensorError, match="coalesced"):
        runtime.inspect(f2, host=0, gpu=0)
    with pytest.raises(RemoteTensorError):
        runtime.inspect(f1, host=1, gpu=1)
