"""The tensor engine with real procs: activate, shapes and errors at the call site, per-rank
values, failure isolation, freeing, autograd and optimizers against local torch."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import runtime
from runtime import SupervisionError, get_runtime, this_host
from runtime.tensor import RemoteTensorError, engine_stats, flush, manual_seed, tensor_state
from _procs import spawn_procs_fixture

pytestmark = pytest.mark.timeout(120)


mesh = spawn_procs_fixture({"procs": 4}, "te")


def _stats(pm, rank=0):
    return engine_stats(pm).get(timeout=30).item(procs=rank)


def test_activate_is_per_thread_and_reentrant(mesh):
    assert runtime.get_active_mesh() is None
    seen = []
    with mesh.activate() as m:
        assert m is mesh and runtime.get_active_mesh() is mesh
        t = threading.Thread(target=lambda: seen.append(runtime.get_active_mesh()))
        t.start()
        t.join()
        sub = mesh.slice(procs=slice(0, 2))
        with sub.activate():
            assert runtime.get_active_mesh() is sub
            assert torch.ones(2).mesh is sub
        assert runtime.get_active_mesh() is mesh
        with runtime.no_mesh():
            assert runtime.get_active_mesh() is None
            local = torch.ones(3)
            assert type(local) is torch.Tensor and local.sum().item() == 3.0
        x = torch.zeros(2, 3)
        assert isinstance(x, runtime.Tensor) and x.mesh is mesh
    assert seen == [None]
    assert runtime.get_active_mesh() is None
    assert type(torch.zeros(2)) is torch.Tensor


def test_factories_and_ops_make_mesh_tensors(mesh):
    with mesh.activate():
        made = [torch.rand(3, 4), torch.randn(3, 4), torch.zeros(3, 4), torch.ones(3, 4),
                torch.full((3, 4), 2.0), torch.empty(3, 4), torch.arange(12).reshape(3, 4),
                torch.tensor([[1.0] * 4] * 3)]
        assert all(isinstance(t, runtime.Tensor) and t.shape == (3, 4) for t in made)
        assert made[6].dtype == torch.int64
        with runtime.no_mesh():
            local = torch.ones(3, 4)
        like = torch.zeros_like(local)  # *_like of a local tensor lands on the mesh too
        assert isinstance(like, runtime.Tensor)
        w = torch.rand(4, 4)
        y = (w @ w.T).relu().sum(dim=0)
        assert isinstance(y, runtime.Tensor) and y.shape == (4,) and y.device.type == "cpu"
        assert "runtime.Tensor(shape=(4,)" in repr(y) and "'te'" in repr(y)
        deadline = time.monotonic() + 30  # the ops run on the procs meanwhile
        while "ranks: 4 ready" not in y._repr_html_() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "procs: 4" in y._repr_html_() and "ranks: 4 ready" in y._repr_html_()
    wv, yv = runtime.inspect(w, procs=2), runtime.inspect(y, procs=2)
    torch.testing.assert_close(yv, (wv @ wv.T).relu().sum(dim=0))
    assert torch.equal(runtime.inspect(made[6]), torch.arange(12).reshape(3, 4))
    assert torch.equal(runtime.inspect(made[4], procs=3), torch.full((3, 4), 2.0))
    # ops on mesh tensors work outside the with block too (the tensor knows its mesh)
    z = y * 2
    torch.testing.assert_close(runtime.fetch_shard(z, procs=2).get(timeout=30), yv * 2)


def test_shape_error_raises_at_call_site_before_sending(mesh):
    with mesh.activate():
        a, b, c = torch.rand(3, 4), torch.rand(5, 6), torch.rand(7)
        before = _stats(mesh)["ops"]
        with pytest.raises(RuntimeError, match="must have same reduction dim|shapes cannot"):
            a @ b
        with pytest.raises(RuntimeError):
            a + c
        assert _stats(mesh)["ops"] == before
        with pytest.raises(ValueError, match="different meshes"):
            with mesh.slice(procs=0).activate():
                d = torch.rand(3, 4)
            a + d


def test_per_rank_values(mesh):
    with mesh.activate():
        r = torch.rand(8)
        data = torch.tensor([1.0, 2.0, 3.0])
        manual_seed(7)
        s = torch.rand(5)
        manual_seed(7, per_rank=True)
        p = torch.rand(5)
    rs = [runtime.inspect(r, procs=i) for i in range(4)]
    assert len({tuple(v.tolist()) for v in rs}) == 4, "random factories must differ per rank"
    assert all(torch.equal(runtime.inspect(data, procs=i), torch.tensor([1.0, 2.0, 3.0]))
               for i in range(4))
    ss = [runtime.inspect(s, procs=i) for i in range(4)]
    assert all(torch.equal(v, ss[0]) for v in ss)
    assert torch.equal(ss[0], torch.rand(5, generator=torch.Generator().manual_seed(7)))
    ps = [runtime.inspect(p, procs=i) for i in range(4)]
    assert len({tuple(v.tolist()) for v in ps}) == 4
    with pytest.raises(KeyError, match="gpu"):
        runtime.fetch_shard(r, gpu=1)
    both = runtime.fetch_shard({"r": r, "s": [s, 5]}, {"procs": 2}).get(timeout=30)
    assert torch.equal(both["r"], rs[2]) and torch.equal(both["s"][0], ss[0])
    assert both["s"][1] == 5
    with pytest.raises(TypeError, match="needs a runtime.Tensor"):
        runtime.fetch_shard([1, 2])


def test_failed_op_fails_dependents_only_and_proc_lives(mesh, capsys):
    with mesh.activate():
        a = torch.rand(3)
        bad = a[torch.tensor([5])]          # fake shapes cannot see the bad index
        worse = (bad * 2).sum()
        fine = a + 1
    with pytest.raises(RemoteTensorError) as ei:
        runtime.inspect(worse, procs=1)
    err = ei.value
    assert err.op == "aten::index.Tensor" and err.rank == 1
    assert "IndexError" in str(err) and "index 5 is out of bounds" in str(err)
    assert "Traceback" in err.remote_traceback
    with pytest.raises(RemoteTensorError, match="aten::index"):
        runtime.inspect(bad)
    assert tensor_state(worse) == ["failed: aten::index.Tensor"] * 4
    assert "4 failed: aten::index.Tensor" in worse._repr_html_()
    torch.testing.assert_close(runtime.inspect(fine), runtime.inspect(a) + 1)
    with mesh.activate():  # and work goes on after the failure
        after = torch.ones(2) * 3
    assert torch.equal(runtime.inspect(after, procs=3), torch.full((2,), 3.0))
    assert _stats(mesh, 1)["failed"] >= 2  # bad and worse (bad * 2 was freed)
    runtime.show(fine, procs=2)
    out = capsys.readouterr().out
    assert "te [procs=2] (3,) torch.float32" in out


def test_freeing_keeps_live_count_flat(mesh):
    with mesh.activate():
        x = torch.zeros(16, 16)
        flush()
        base = _stats(mesh)["live"]
        for _ in range(3000):
            x = x + 1
        assert runtime.inspect(x, procs=3)[0, 0].item() == 3000.0
        st = engine_stats(mesh).get(timeout=30)
    for s in st.values():
        assert s["live"] <= base + 2, s
    del x
    flush()
    assert _stats(mesh)["live"] <= base


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def test_engine_memory_reaches_the_dashboards_proc_stats(mesh):
    rt = get_runtime()
    proc = mesh.procs[0].proc_id

    def held() -> int:
        st = rt.health.proc_stats(proc)
        return -1 if st is None or st.tensor_bytes is None else st.tensor_bytes

    def wait(pred) -> int:
        deadline = time.monotonic() + 20
        while not pred(held()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return held()

    assert wait(lambda b: 0 <= b < 1 << 18) < 1 << 18  # small tensors of earlier tests at most
    with mesh.activate():
        big = torch.zeros(1024, 256)  # 1 MiB on each proc
        flush()
        assert wait(lambda b: b >= 1 << 20) >= 1 << 20
        del big
        flush()
    assert wait(lambda b: b < 1 << 18) < 1 << 18


@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
def test_autograd_and_optimizer_match_local_torch(mesh, opt_name):
    gen = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(10, 6, generator=gen), torch.randn(10, 3, generator=gen)
    torch.manual_seed(1)
    local = _mlp()
    state = {k: v.clone() for k, v in local.state_dict().items()}
    opt_cls = getattr(torch.optim, opt_name)
    sub = mesh.slice(procs=slice(1, 3))
    with sub.activate():
        model = _mlp()
        assert all(isinstance(p, runtime.Tensor) and isinstance(p, torch.nn.Parameter)
                   for p in model.parameters())
        with torch.no_grad():
            for k, p in model.named_parameters():
                p.copy_(torch.tensor(state[k].tolist()))  # a mesh tensor of the same values
                assert not (p * 2).requires_grad
        opt = opt_cls(model.parameters(), lr=0.05)
        x, y = torch.tensor(xs.tolist()), torch.tensor(ys.tolist())
        for _ in range(2):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            assert isinstance(loss, runtime.Tensor) and loss.requires_grad
            loss.backward()
            opt.step()
        grads = {k: runtime.inspect(p.grad, procs=1) for k, p in model.named_parameters()}
        params = {k: runtime.inspect(p, procs=0) for k, p in model.named_parameters()}
        remote_loss = runtime.inspect(loss)
    lopt = opt_cls(local.parameters(), lr=0.05)
    for _ in range(2):
        lopt.zero_grad()
        lloss = torch.nn.functional.mse_loss(local(xs), ys)
        lloss.backward()
        lopt.step()
    torch.testing.assert_close(remote_loss, lloss.detach())
    for k, p in local.named_parameters():
        torch.testing.assert_close(grads[k], p.grad)
        torch.testing.assert_close(params[k], p.detach())


def test_item_blocks_and_fetches_rank0(mesh):
    with mesh.activate():
        t = torch.tensor(2.5) * 2
        assert t.item() == 5.0
        assert float(t) == 5.0


def test_dead_proc_fails_its_tensors():
    pm = this_host().spawn_procs(per_host={"procs": 2}, name="te_doomed")
    try:
        with pm.activate():
            t = torch.ones(3)
            assert runtime.inspect(t, procs=1).sum().item() == 3.0
        get_runtime().kill_proc(pm.procs[1].proc_id)
        deadline = time.monotonic() + 20
        while get_runtime().proc_state(pm.procs[1].proc_id) != "failed":
            assert time.monotonic() < deadline, "the killed proc was not declared failed"
            time.sleep(0.05)
        with pytest.raises(SupervisionError):
            runtime.inspect(t, procs=1, timeout=20)
        with pytest.raises(SupervisionError):
            with pm.activate():
                u = t + 1
                runtime.inspect(u, timeout=20)
    finally:
        pm.stop().get(timeout=30)


def test_mesh_tensor_arrives_as_local_shard_in_an_actor(mesh):
    from _actors import ShardUser

    users = mesh.spawn("shard_users", ShardUser)
    with mesh.activate():
        r = torch.rand(3)
        t = torch.zeros(2)
    got = users.describe.call(r).get(timeout=60)
    for i in range(4):
        d = got.item(procs=i)
        assert d["is_plain"] and d["rank"] == i
        assert d["sum"] == pytest.approx(runtime.inspect(r, procs=i).sum().item())
    users.add_one_in_place.call(t).get(timeout=60)  # the actor's change is the engine's
    assert runtime.inspect(t, procs=2).tolist() == [1.0, 1.0]
    with mesh.slice(procs=1).activate():
        elsewhere = torch.ones(2)
    with pytest.raises(runtime.ActorError, match="only on the procs of its mesh"):
        users.slice(procs=0).describe.call_one(elsewhere).get(timeout=60)
    users.stop().get(timeout=30)


def test_each_proc_of_a_gpu_dimension_is_given_its_own_gpu():
    """On CPU this checks the selection (CUDA_VISIBLE_DEVICES per proc, made at spawn; the
    device count is faked), not a GPU."""
    from _actors import ShardUser

    with runtime.configured(gpu_count=2):
        pm = this_host().spawn_procs(per_host={"gpu": 2}, name="te_gpus")
    try:
        with pm.activate():
            t = torch.ones(1)
        for r in range(2):
            runtime.inspect(t, gpu=r)  # both workers have started
        seen = pm.spawn("env_reader", ShardUser).env.call("CUDA_VISIBLE_DEVICES").get(timeout=60)
        assert list(seen.values()) == ["0", "1"]
    finally:
        pm.stop().get(timeout=30)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (and torch with CUDA)")
def test_cuda_tensors_on_one_gpu_per_proc():
    n = min(2, torch.cuda.device_count())
    pm = this_host().spawn_procs(per_host={"gpu": n}, name="te_cuda")
    try:
        with pm.activate():
            t = torch.ones(3, device="cuda")
            u = (t * 2).sum()
            assert u.device.type == "cuda"
        for r in range(n):
            got = runtime.inspect(u, gpu=r)
            assert got.device.type == "cpu" and got.item() == 6.0
    finally:
        pm.stop().get(timeout=30)


def test_active_meshes_are_named_for_views_and_shown_by_the_dashboard(mesh):
    from monarch_widgets.widget import Dashboard

    w = Dashboard(get_runtime().health, max_rate=20)
    try:
        assert runtime.active_mesh_names() == [] and w.state["active"] == []
        with mesh.activate():
            with mesh.activate():  # re-entrant: still one name
                seen = []
                t = threading.Thread(target=lambda: seen.append(runtime.active_mesh_names()))
                t.start()
                t.join()
                assert seen == [["te"]]  # any thread's activation counts
            deadline = time.monotonic() + 10
            while w.state["active"] != ["te"] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert w.state["active"] == ["te"]
        assert runtime.active_mesh_names() == []
        deadline = time.monotonic() + 10
        while w.state["active"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert w.state["active"] == []
    finally:
        w.close()
