"""RDMABuffer over CUDA memory: the transport choice (pure, runs anywhere), the clear errors,
and, where a GPU is present, CUDA IPC between processes, pinned staging, drop and death."""

from __future__ import annotations

import dataclasses
import os
import signal

import pytest
import torch

from runtime.rdma import RDMABuffer, RDMABufferDroppedError, RDMAError, RDMAOwnerDiedError
from runtime.rdma import client, cuda
from runtime.rdma.choice import choose_transport
from test_rdma import Owner, pattern, sha

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def pick(**kw):
    base = dict(mode="auto", same_process=False, same_host=True, remote_cuda=False,
                cuda_here=False, vm_ok=True, ib_ok=False)
    return choose_transport(**{**base, **kw})


def test_transport_choice_table():
    assert pick() == "vm"
    assert pick(vm_ok=False) == "tcp"
    assert pick(same_process=True, remote_cuda=True) == "local"
    assert pick(remote_cuda=True, cuda_here=True) == "cuda-ipc"
    assert pick(remote_cuda=True, cuda_here=False) == "tcp"  # reader without CUDA: owner stages
    assert pick(same_host=False, ib_ok=True) == "ibverbs"
    assert pick(same_host=False, ib_ok=True, remote_cuda=True) == "tcp"  # no GPUDirect
    assert pick(same_host=False, ib_ok=True, remote_cuda=True, gpudirect=True) == "ibverbs"
    assert pick(mode="ibverbs", remote_cuda=True, gpudirect=True) == "ibverbs"
    assert pick(same_host=False) == "tcp"
    assert pick(mode="tcp", remote_cuda=True, cuda_here=True) == "tcp"
    assert pick(mode="vm") == "vm"
    assert pick(mode="ibverbs") == "ibverbs"


def test_forced_transports_that_cannot_work_say_why():
    with pytest.raises(RDMAError, match="CUDA memory, which process_vm_readv cannot read"):
        pick(mode="vm", remote_cuda=True, cuda_here=True)
    with pytest.raises(RDMAError, match="another host"):
        pick(mode="vm", same_host=False)
    with pytest.raises(RDMAError, match="refused: Yama"):
        pick(mode="vm", vm_ok=False, vm_refused="Yama ptrace_scope is 3")
    with pytest.raises(RDMAError, match="GPUDirect RDMA is off"):
        pick(mode="ibverbs", remote_cuda=True)


def test_ipc_description_is_checked_json():
    good = {"device": 0, "handle": "ab", "size": 4, "offset": 0, "ref": "cd", "ref_offset": 8,
            "event": None, "buf_offset": 2}
    import json

    d = cuda.decode_ipc(json.dumps(good).encode())
    assert d["handle"] == b"\xab" and d["ref"] == b"\xcd" and d["event"] == b""
    with pytest.raises(ValueError, match="lacks 'size'"):
        cuda.decode_ipc(json.dumps({**good, "size": "4"}).encode())
    with pytest.raises(ValueError):
        cuda.decode_ipc(b"\x80\x04not json")


@pytest.fixture
def owner():
    o = Owner()
    yield o
    o.kill()


@pytest.mark.timeout(60)
def test_forced_vm_on_a_cuda_buffer_fails_clearly_before_touching_it(owner, monkeypatch):
    """A handle that says CUDA (faked here on a CPU buffer) under MONARCH_RDMA_TRANSPORT=vm."""
    key, buf = owner.make(4096, seed=3)
    buf._h = dataclasses.replace(buf._h, device="cuda:0")
    monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", "vm")
    with pytest.raises(RDMAError, match=r"buffer \d+ \(cuda:0 of pid \d+\) is in CUDA memory"):
        buf.read_into(torch.empty(4096, dtype=torch.uint8)).get(timeout=30)


@pytest.mark.timeout(60)
def test_a_reader_without_cuda_is_served_by_the_owners_staging(owner, monkeypatch):
    key, buf = owner.make(6 << 20, seed=4)
    buf._h = dataclasses.replace(buf._h, device="cuda:0")  # faked: the owner stages it
    monkeypatch.delenv("MONARCH_RDMA_TRANSPORT", raising=False)
    monkeypatch.setattr(cuda, "cuda_usable", lambda: False)
    assert buf.transport() == "tcp"
    dst = torch.empty(6 << 20, dtype=torch.uint8)
    buf.read_into(dst).get(timeout=30)
    assert buf.last_transport == "tcp" and sha(dst) == owner.call("sha", key)


# -- with a GPU ----------------------------------------------------------------------------
SIZES = [1, 3 << 20, (2 * cuda.STAGE) + 12345]


@needs_cuda
@pytest.mark.timeout(120)
@pytest.mark.parametrize("nbytes", SIZES)
def test_cuda_to_cuda_between_processes_by_ipc(owner, nbytes, monkeypatch):
    monkeypatch.delenv("MONARCH_RDMA_TRANSPORT", raising=False)
    key, buf = owner.make(nbytes, seed=nbytes % 97, kind="cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    buf.read_into(dst).get(timeout=60)
    assert buf.last_transport == "cuda-ipc" and sha(dst) == owner.call("sha", key)
    src = pattern(nbytes, 7).cuda()
    buf.write_from(src).get(timeout=60)
    assert owner.call("sha", key) == sha(src)
    assert len(cuda.ipc_cache) >= 1  # opened once, kept for the next transfer
    buf.drop().get(timeout=30)
    assert cuda.ipc_cache.get(client._ipc_key(buf._h)) is None  # closed on drop()
    with pytest.raises(RDMABufferDroppedError):
        buf.read_into(dst).get(timeout=30)


@needs_cuda
@pytest.mark.timeout(120)
@pytest.mark.parametrize("nbytes", SIZES)
def test_cpu_and_cuda_on_the_same_host(owner, nbytes, monkeypatch):
    monkeypatch.delenv("MONARCH_RDMA_TRANSPORT", raising=False)
    key, gbuf = owner.make(nbytes, seed=5, kind="cuda")  # CUDA there, host memory here
    host = torch.empty(nbytes, dtype=torch.uint8)
    gbuf.read_into(host).get(timeout=60)
    assert gbuf.last_transport == "cuda-ipc" and sha(host) == owner.call("sha", key)
    src = pattern(nbytes, 6)
    gbuf.write_from(src).get(timeout=60)
    assert owner.call("sha", key) == sha(src)
    key2, cbuf = owner.make(nbytes, seed=8)  # host memory there, CUDA here
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    cbuf.read_into(dev).get(timeout=60)
    assert cbuf.last_transport.endswith("+cuda-staged") and sha(dev) == owner.call("sha", key2)
    src = pattern(nbytes, 9).cuda()
    cbuf.write_from(src).get(timeout=60)
    assert owner.call("sha", key2) == sha(src)


@needs_cuda
@pytest.mark.timeout(120)
def test_cuda_over_tcp_is_staged_on_both_sides(owner, monkeypatch):
    monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", "tcp")
    n = 2 * cuda.STAGE + 999
    key, buf = owner.make(n, seed=10, kind="cuda")
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    buf.read_into(dst).get(timeout=60)
    assert buf.last_transport == "tcp+cuda-staged" and sha(dst) == owner.call("sha", key)


@needs_cuda
@pytest.mark.timeout(120)
def test_owner_death_fails_the_read_and_closes_the_mapping(monkeypatch):
    monkeypatch.delenv("MONARCH_RDMA_TRANSPORT", raising=False)
    o = Owner()
    try:
        key, buf = o.make(1 << 20, seed=11, kind="cuda")
        dst = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        buf.read_into(dst).get(timeout=60)
        assert cuda.ipc_cache.get(client._ipc_key(buf._h)) is not None
        os.kill(o.pid, signal.SIGKILL)
        o.proc.wait(10)
        with pytest.raises(RDMAOwnerDiedError):
            buf.read_into(dst).get(timeout=30)
        assert cuda.ipc_cache.get(client._ipc_key(buf._h)) is None
    finally:
        o.kill()


@needs_cuda
@pytest.mark.timeout(60)
def test_same_process_cuda_buffer_is_a_local_copy(monkeypatch):
    monkeypatch.delenv("MONARCH_RDMA_TRANSPORT", raising=False)
    own = torch.arange(1000, dtype=torch.float32, device="cuda")
    buf = RDMABuffer(own)
    out = torch.empty(1000, dtype=torch.float32)
    buf.read_into(out).get(timeout=30)
    assert buf.last_transport == "local" and torch.equal(out, own.cpu())


class _FakeStream:
    def __init__(self, device=None):
        pass

    def wait_stream(self, other):
        pass

    def synchronize(self):
        pass


class _FakeEvent:
    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


@pytest.mark.parametrize("n,chunk", [(1, 7), (7, 7), (8, 7), (2 * 7 + 3, 7), (100, 7)])
def test_pinned_pipelines_move_every_chunk_in_place(monkeypatch, n, chunk):
    """The two-buffer pipelines' chunking and buffer reuse, run on CPU tensors with the CUDA
    stream/event calls made no-ops (copies are synchronous there, so order is exercised)."""
    import contextlib

    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(cuda, "pinned", lambda k: torch.empty(k, dtype=torch.uint8))
    src = pattern(n, n)
    out = torch.zeros(n, dtype=torch.uint8)
    seen = []

    def consume(addr, k, pos):
        seen.append((pos, k))
        cuda.memmove_to(out.data_ptr())(addr, k, pos)

    cuda.device_to_host(src, consume, chunk=chunk)
    assert torch.equal(out, src)
    assert seen == [(p, min(chunk, n - p)) for p in range(0, n, chunk)]
    back = torch.zeros(n, dtype=torch.uint8)
    cuda.host_to_device(back, cuda.memmove_from(src.data_ptr()), chunk=chunk)
    assert torch.equal(back, src)
