"""Remote functions (`runtime.remote`) and the incremental backward (`runtime.grad_generator`)
on a real mesh: values per rank against local torch, failures, and gradients against
`loss.backward()`."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import runtime
from runtime import SerializationError, ValueMesh, this_host
from runtime.tensor import (RemoteTensorError, call_on_shard_and_fetch, engine_stats, flush,
                            grad_generator, remote, tensor_state)
from _procs import spawn_procs_fixture

pytestmark = pytest.mark.timeout(120)


mesh = spawn_procs_fixture({"procs": 4}, "tr")


def _ops(pm, rank=0):
    return engine_stats(pm).get(timeout=30).item(procs=rank)["ops"]


def test_remote_by_path_with_propagate(mesh):
    relu = remote("torch.nn.functional.relu", propagate="inspect")
    add = remote("_remote_fns.scaled_add", propagate=lambda x, y, k=1.0: x + y)
    stats = remote("_remote_fns.split_stats", propagate=lambda x: {
        "mean": x.mean(dim=0), "max": x.max(dim=0).values, "n": x.shape[0]})
    with mesh.activate():
        x = torch.randn(5, 3)
        y = relu(x)
        z = add(y, x, k=3.0)
        s = stats(z)
        w = (z * 2).sum()  # ordinary ops go on from remote outputs
    assert isinstance(y, runtime.Tensor) and y.shape == (5, 3) and y.mesh is mesh
    assert isinstance(s["mean"], runtime.Tensor) and s["mean"].shape == (3,) and s["n"] == 5
    for r in range(4):
        xv = runtime.inspect(x, procs=r)
        zv = torch.relu(xv) + 3.0 * xv
        torch.testing.assert_close(runtime.inspect(z, procs=r), zv)
        torch.testing.assert_close(runtime.inspect(s["max"], procs=r), zv.max(dim=0).values)
        torch.testing.assert_close(runtime.inspect(w, procs=r), (zv * 2).sum())


def test_notebook_style_function_and_decorator(mesh):
    offset = 10.0  # captured: the function travels by value (cloudpickle)

    def shift_and_norm(t: torch.Tensor, scale: float):
        return t + offset, (t * scale).norm()

    shift_and_norm.__module__ = "__main__"  # as if defined in a notebook cell
    shifted = remote(shift_and_norm, propagate="inspect")

    @remote(propagate=lambda a, b: torch.cat([a, b]))
    def cat_local(a, b):
        return torch.cat([a, b])

    @remote
    def total(t):
        return float(t.sum())

    cell = {"__name__": "__main__", "torch": torch}  # a function defined in a notebook cell
    exec("def cubed(t):\n    return torch.pow(t, 3)\n", cell)
    assert cell["cubed"].__module__ == "__main__" and cell["cubed"].__qualname__ == "cubed"
    cubed = remote(cell["cubed"], propagate="inspect")

    assert repr(shifted).startswith("runtime.remote(") and cat_local.__name__ == "cat_local"
    with mesh.activate():
        x = torch.rand(4)
        a, n = shifted(x, 2.0)
        c = cat_local(a, x)
        fut = total(c)  # no propagate: a Future of every rank's value
        k = cubed(x)
    assert a.shape == (4,) and n.shape == () and c.shape == (8,)
    vm = fut.get(timeout=30)
    assert isinstance(vm, ValueMesh) and len(vm) == 4
    for r in range(4):
        xv = runtime.inspect(x, procs=r)
        torch.testing.assert_close(runtime.inspect(n, procs=r), (xv * 2.0).norm())
        torch.testing.assert_close(runtime.inspect(c, procs=r), torch.cat([xv + 10.0, xv]))
        torch.testing.assert_close(runtime.inspect(k, procs=r), xv ** 3)
        assert vm.item(procs=r) == pytest.approx(float((xv + 10.0).sum() + xv.sum()), rel=1e-5)


def test_remote_without_propagate_fetches_values(mesh):
    rank = remote("_remote_fns.my_rank")
    scaled = remote("_remote_fns.scaled_add")
    with mesh.activate():
        ranks = rank.call().get(timeout=30)  # no tensor arguments: the active mesh
        x = torch.ones(2)
        vals = scaled(x, x, k=2.0).get(timeout=30)
        one = call_on_shard_and_fetch(scaled, x, x, shard={"procs": 2}, k=0.5).get(timeout=30)
        with mesh.slice(procs=3).activate():
            assert rank.call_one().get(timeout=30) == 0  # the point in the slice called
    assert list(ranks.values()) == [0, 1, 2, 3]
    assert all(type(v) is torch.Tensor and v.tolist() == [3.0, 3.0] for v in vals.values())
    assert one.tolist() == [1.5, 1.5]
    with pytest.raises(ValueError, match="one proc"):
        scaled.call_one(x, x)
    # broadcast: for effects only; an in-place change is seen by later ops
    remote("torch.Tensor.mul_").broadcast(x, 5.0)
    assert runtime.inspect(x, procs=3).tolist() == [5.0, 5.0]
    with pytest.raises(RuntimeError, match="needs an active mesh"):
        rank.call()


def test_failures_mark_outputs_and_raise_at_fetch(mesh):
    fail = remote("_remote_fns.fail_on_rank", propagate=lambda x, rank: x * 2)
    with mesh.activate():
        x = torch.ones(3)
        y = fail(x, 1)
        dep = y + 1
        ok = x + 1
        m = torch.ones(2, 3)
        before = _ops(mesh)
        with pytest.raises(RuntimeError, match=r"(?s)same reduction dim.*remote\(torch.matmul"):
            remote(torch.matmul, propagate="inspect")(m, m)
        assert _ops(mesh) == before  # a shape error in propagate sends nothing
        wrong = remote("_remote_fns.scaled_add", propagate=lambda x, y: x.sum())(x, x)
        fut = remote("_remote_fns.fail_on_rank").call(x, 2)
        from_failed = remote("_remote_fns.scaled_add").call(y, x)  # y failed on rank 1
    assert runtime.inspect(y, procs=0).tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(RemoteTensorError) as ei:
        runtime.inspect(dep, procs=1)
    err = ei.value
    assert err.op == "remote(_remote_fns.fail_on_rank)" and err.rank == 1
    assert "ValueError: rank 1 refuses" in str(err)
    assert "Traceback" in err.remote_traceback and "fail_on_rank" in err.remote_traceback
    assert tensor_state(y) == ["ready", "failed: remote(_remote_fns.fail_on_rank)",
                               "ready", "ready"]
    assert runtime.inspect(ok, procs=1).tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(RemoteTensorError, match=r"result 0 is \(3,\) .* propagate gave \(\)"):
        runtime.inspect(wrong)
    with pytest.raises(RemoteTensorError, match="rank 2 refuses") as ei:
        fut.get(timeout=30)
    assert ei.value.rank == 2
    with pytest.raises(RemoteTensorError, match="rank 1 refuses") as ei:
        from_failed.get(timeout=30)
    assert ei.value.op == "remote(_remote_fns.fail_on_rank)"


def test_unpicklable_function_fails_at_call_site(mesh):
    lock = threading.Lock()

    def holds_a_lock(t):
        with lock:
            return t + 1

    with mesh.activate():
        x = torch.ones(2)
        before = _ops(mesh)
        with pytest.raises(SerializationError, match="holds_a_lock.*cannot be pickled"):
            remote(holds_a_lock, propagate="inspect")(x)
        with pytest.raises(SerializationError, match="cannot be pickled"):
            remote(holds_a_lock).call(x)
        assert _ops(mesh) == before
    with pytest.raises(ValueError, match="propagate must be"):
        remote(holds_a_lock, propagate="mocked")
    with pytest.raises(TypeError, match="takes a function"):
        remote(3)


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8),
                               torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _data():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(10, 6, generator=gen), torch.randn(10, 3, generator=gen)


def test_grad_generator_matches_backward_on_local_tensors():
    xs, ys = _data()
    torch.manual_seed(1)
    model = _mlp()
    params = list(model.parameters())

    def loss_fn():
        return torch.nn.functional.mse_loss(model(xs), ys)

    for order in (params[::-1], params, [params[2], params[0]]):
        model.zero_grad()
        gens = list(grad_generator(loss_fn(), order))
        assert all(p.grad is None for p in params)  # .grad is not touched
        loss_fn().backward()
        assert len(gens) == len(order)
        for g, p in zip(gens, order):
            torch.testing.assert_close(g, p.grad)
    unused = torch.zeros(2, requires_grad=True)
    assert list(grad_generator(loss_fn(), [params[-1], unused]))[1] is None
    with pytest.raises(ValueError, match="requires grad"):
        grad_generator(loss_fn(), [xs])
    # stopping early ends the backward pass's thread (close(), or leaving a for loop)
    it = grad_generator(loss_fn(), params[::-1])
    next(it)
    it.close()
    assert not [t for t in threading.enumerate() if t.name == "grad-generator"]
    for _ in grad_generator(loss_fn(), params[::-1]):
        break
    assert not [t for t in threading.enumerate() if t.name == "grad-generator"]


def test_grad_generator_pauses_the_backward_even_when_it_reaches_a_hook_first(monkeypatch):
    """The loop body runs while the backward pass waits, also when the backward thread got
    to a gradient before the loop asked for it (on a loaded machine the thread that
    started it may wait its turn: here it sleeps after starting the backward thread)."""
    xs, ys = _data()
    model = _mlp()
    first, middle, last = model[0], model[2], model[4]
    steps: list[str] = []  # gradients of the activations, as the backward pass reaches them
    h = first(xs)
    h.register_hook(lambda g: steps.append("first"))
    h = middle(torch.tanh(h))
    h.register_hook(lambda g: steps.append("middle"))
    loss = torch.nn.functional.mse_loss(last(torch.tanh(h)), ys)
    start = threading.Thread.start

    def start_then_lag(self):
        start(self)
        if self.name == "grad-generator":
            time.sleep(0.3)  # the backward thread reaches the last layer's hook meanwhile

    monkeypatch.setattr(threading.Thread, "start", start_then_lag)
    seen = []
    for g in grad_generator(loss, [last.weight, middle.weight, first.weight]):
        before = list(steps)
        time.sleep(0.2)  # the loop body: the backward pass must not move meanwhile
        assert steps == before, (seen, before, steps)
        seen.append(list(steps))
    assert seen == [[], ["middle"], ["middle", "first"]]


class _BadBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1

    @staticmethod
    def backward(ctx, g):
        raise ArithmeticError("backward refuses")


def test_grad_generator_raises_the_backward_error_in_order():
    a = torch.ones(3, requires_grad=True)
    b = torch.ones(3, requires_grad=True)
    loss = _BadBackward.apply(b).sum() + (a * 2).sum()  # autograd runs a's branch first
    it = grad_generator(loss, [a, b])
    torch.testing.assert_close(next(it), torch.full((3,), 2.0))  # a's came before the error
    with pytest.raises(ArithmeticError, match="backward refuses"):
        next(it)


def test_grad_generator_on_mesh_yields_early_and_matches_backward(mesh):
    xs, ys = _data()
    torch.manual_seed(1)
    local = _mlp()
    state = {k: v.clone() for k, v in local.state_dict().items()}
    sub = mesh.slice(procs=slice(1, 3))
    with sub.activate():
        model = _mlp()
        with torch.no_grad():
            for k, p in model.named_parameters():
                p.copy_(torch.tensor(state[k].tolist()))
        x, y = torch.tensor(xs.tolist()), torch.tensor(ys.tolist())
        params = list(model.parameters())[::-1]  # last layer first: the order grads appear
        loss = torch.nn.functional.mse_loss(model(x), y)
        flush()
        start = _ops(sub)
        seen_ops, doubled = [], []
        for g in grad_generator(loss, params):
            assert isinstance(g, runtime.Tensor) and g.mesh is sub
            flush()
            seen_ops.append(_ops(sub))
            time.sleep(0.2)  # the backward pass is paused while the loop body runs
            flush()
            assert _ops(sub) == seen_ops[-1]
            doubled.append(g * 2)  # the loop's own ops interleave with the backward pass
        flush()
        end = _ops(sub)
        grads = [runtime.inspect(g, procs=1) / 2 for g in doubled]
    # the first gradient came before most of the backward pass was issued
    assert start < seen_ops[0] < seen_ops[-1] <= end
    assert seen_ops == sorted(seen_ops) and len(set(seen_ops)) >= 3
    assert seen_ops[0] - start < (end - start) / 2
    lloss = torch.nn.functional.mse_loss(local(xs), ys)
    lloss.backward()
    for g, p in zip(grads, list(local.parameters())[::-1]):
        torch.testing.assert_close(g, p.grad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (and torch with CUDA)")
def test_remote_and_grad_generator_on_cuda():
    pm = this_host().spawn_procs(per_host={"gpu": 1}, name="tr_cuda")
    try:
        with pm.activate():
            x = torch.randn(4, 3, device="cuda")
            y = remote("torch.nn.functional.relu", propagate="inspect")(x)
            assert y.device.type == "cuda"
            lin = torch.nn.Linear(3, 2, device="cuda")
            loss = lin(y).sum()
            grads = list(grad_generator(loss, [lin.bias, lin.weight]))
        xv = runtime.inspect(x)
        torch.testing.assert_close(runtime.inspect(grads[0]), torch.full((2,), 4.0))
        torch.testing.assert_close(runtime.inspect(grads[1]),
                                   torch.relu(xv).sum(0).expand(2, 3))
    finally:
        pm.stop().get(timeout=30)
