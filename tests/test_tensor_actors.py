"""Actors and the tensor engine together: Monarch's `rref` adverb (an endpoint's results as
mesh tensors), `send(remote_fn, ..., port=)`, and temporary mesh tensors passed to actors."""

from __future__ import annotations

import pytest
import torch

import runtime
from runtime import Channel, send
from runtime.tensor import mesh_rank
from _procs import spawn_procs_fixture

pytestmark = pytest.mark.timeout(120)


mesh = spawn_procs_fixture({"procs": 2}, "te_actors")


def test_rref_makes_mesh_tensors_from_an_endpoint(mesh):
    from _actors import Linear

    lin = mesh.spawn("linear", Linear)
    with mesh.activate():
        x = torch.ones(2, 3) * (mesh_rank().float() + 1)
        y = lin.forward.rref(x)           # nothing waits: shapes from propagate
        assert isinstance(y, runtime.Tensor) and y.shape == (2, 3)
        z = torch.relu(y) + 1             # ops on it follow in order
    # rank r: ones * (r + 1) @ eye * (r + 1) = (r + 1)^2
    assert runtime.inspect(z, procs=0).tolist() == [[2.0] * 3] * 2
    assert runtime.inspect(z, procs=1).tolist() == [[5.0] * 3] * 2
    assert list(lin.times_called.call().get(timeout=30).values()) == [1, 1]
    with pytest.raises(ValueError, match=r"rref\(\) needs the shapes.*propagate"):
        lin.plain.rref(x)
    with mesh.activate():
        bad = lin.forward.rref(torch.ones(2, 4))  # x @ w fails on the procs: (2,4) @ (3,3)
    with pytest.raises(runtime.RemoteTensorError, match="mat1 and mat2|size"):
        runtime.inspect(bad)


def test_send_a_remote_function_to_a_port(mesh):
    @runtime.remote
    def where(k):
        return (runtime.current_rank().rank, k)

    port, recv = Channel.open()
    with mesh.activate():
        send(where, args=(7,), kwargs={}, port=port)
    got = sorted(recv.recv().get(timeout=30) for _ in range(2))
    assert got == [(0, 7), (1, 7)]
    with pytest.raises(TypeError, match="runtime.remote function"):
        send(len, args=(), kwargs={})


def test_a_temporary_mesh_tensor_outlives_the_call_that_takes_it(mesh):
    from _actors import ShardUser

    users = mesh.spawn("users", ShardUser)
    with mesh.activate():
        d = torch.ones(4, 4) * (mesh_rank().float() + 1)
        for _ in range(20):  # the temporary row is freed as soon as it is pickled
            got = users.describe.call(d[0] * 2).get(timeout=30)
            assert [v["sum"] for v in got.values()] == [8.0, 16.0]


def test_a_call_waiting_for_its_shard_lets_the_engine_run(mesh):
    """An actor's call that unpickles a mesh tensor whose op has not run yet waits for the
    engine's worker, which must still be able to unpickle its next batch of commands (actor
    threads take turns unpickling; a waiting one lets the others go): no 60 s stall."""
    import time

    from _actors import ShardUser

    from runtime.tensor import flush

    users = mesh.spawn("waiting_users", ShardUser)
    with mesh.activate():
        big = torch.ones(1200, 1200)
        for _ in range(3):
            slow = big @ big @ big  # keeps the worker busy with this batch
            flush()
            x = torch.ones(4) * 2   # its op comes in the next batch, behind the slow one
            got = users.describe.call(x).get(timeout=30)  # behind the slow batch, no hang
            assert [v["sum"] for v in got.values()] == [8.0, 8.0]
            del slow
