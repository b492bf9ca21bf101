"""CUDA tensors as endpoint arguments and return values (runtime/transport/cuda_tensors.py):
never torch's default pickling; a proc without CUDA names the argument it cannot take.
The CUDA tests run where torch.cuda.is_available(); the rest runs anywhere."""

from __future__ import annotations

import pytest
import torch

from runtime import ActorError, configured
from runtime.transport import cuda_tensors, serialization
from _gpu_actors import FakeCUDATensor, Taker
from _procs import spawn_procs_fixture

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
pytestmark = pytest.mark.timeout(120)


procs = spawn_procs_fixture({"gpus": 1})


@pytest.fixture(scope="module")
def taker(procs):
    return procs.spawn("taker", Taker)


def test_finding_the_argument_that_holds_a_cuda_tensor():
    def fn(self, a, weights, opts=None):
        pass

    m = cuda_tensors.MissingCUDA("shape (2,), float32, cuda:0")
    assert cuda_tensors.name_argument(fn, (1, [0, m]), {}) == ("'weights'[1]", m.desc)
    assert cuda_tensors.name_argument(fn, (1, 2), {"opts": {"w": m}}) == ("'opts'['w']", m.desc)
    assert cuda_tensors.name_argument(fn, (1, 2), {}) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests a proc without CUDA")
def test_a_cuda_tensor_sent_to_a_proc_without_cuda_names_argument_and_proc(taker):
    with pytest.raises(ActorError) as ei:
        taker.take.call_one(FakeCUDATensor(4), scale=2.0).get(timeout=60)
    text = str(ei.value)
    assert "argument 'weights' of take() is a CUDA tensor (shape (4,), float32, cuda:0)" in text
    assert "has no CUDA device" in text and "rank 0 of taker" in text
    with pytest.raises(ActorError) as e2:
        taker.take.call_one(1.0, scale=FakeCUDATensor(2)).get(timeout=60)
    assert "argument 'scale' of take()" in str(e2.value)
    # the actor is still serving
    assert taker.take.call_one(torch.ones(3)).get(timeout=60) == "cpu 3.0"


@needs_cuda
@pytest.mark.parametrize("nbytes", [4 << 10, 64 << 20])  # staged / CUDA IPC (same host)
def test_cuda_argument_arrives_on_the_receivers_device(taker, nbytes):
    n = nbytes // 4
    t = torch.ones(n, device="cuda")
    fut = taker.take.call_one(t)
    del t  # copy semantics: the sender may free its tensor once the call is made
    torch.cuda.synchronize()
    assert fut.get(timeout=60) == f"cuda:0 {float(n)}"


@needs_cuda
@pytest.mark.parametrize("n", [1000, 16 << 20])
def test_cuda_return_value(taker, n):
    got = taker.make.call_one(n).get(timeout=60)
    assert got.is_cuda and torch.equal(got.cpu(), torch.arange(n, dtype=torch.float32))


@needs_cuda
def test_cuda_tensors_never_use_torchs_pickling():
    t = torch.arange(10, dtype=torch.float32, device="cuda")
    body, bufs = serialization.dumps(t)
    assert b"rebuild_cuda_tensor" not in body and b"_rebuild_staged" in body and bufs
    back = serialization.loads(body, bufs)
    assert back.is_cuda and torch.equal(back, t)
    with configured(cuda_ipc_min_bytes=1):
        keep: list = []
        with cuda_tensors.sending(keep):
            body, bufs = serialization.dumps(t)
        assert len(keep) == 1 and b"_rebuild_shared" in body
        cuda_tensors.release(keep)
        assert not keep
