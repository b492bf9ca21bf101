"""RDMABuffer between actors and the controller: endpoints hand out handles, bytes move on
the data plane (checksummed), the owner's endpoint code is not involved."""

from __future__ import annotations

import hashlib
import time

import pytest
import torch

from runtime import Actor, endpoint, get_runtime, this_host
from runtime.rdma import RDMAAction, RDMABuffer, RDMABufferDroppedError, RDMAOwnerDiedError
from _procs import spawn_procs_fixture


def sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


class Owner(Actor):
    """Holds a float32 tensor and exports it."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(1234)
        self.t = torch.randn(n, generator=g)
        self.buf = RDMABuffer(self.t.view(torch.uint8))

    @endpoint
    def handle(self) -> RDMABuffer:
        return self.buf

    @endpoint
    def checksum(self) -> str:
        return sha(self.t)

    @endpoint
    def busy(self, marker: str) -> str:
        """Hold the actor's only handler thread (transfers must still go through): make
        `marker`.in, then wait until `marker`.go exists (at most 60 s)."""
        import os

        open(marker + ".in", "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(marker + ".go") and time.monotonic() < deadline:
            time.sleep(0.01)
        return "released" if os.path.exists(marker + ".go") else "gave up"

    @endpoint
    def live_buffers(self) -> int:
        from runtime.rdma.server import current_server

        return len(current_server().registry)


class Reader(Actor):
    """Pulls another actor's buffer into its own memory."""

    @endpoint
    def pull(self, buf: RDMABuffer) -> str:
        dst = torch.empty(buf.size(), dtype=torch.uint8)
        buf.read_into(dst, timeout=20).get()
        return sha(dst)

    @endpoint
    async def pull_async(self, buf: RDMABuffer) -> str:
        dst = torch.empty(buf.size(), dtype=torch.uint8)
        await buf.read_into(dst, timeout=20)
        return sha(dst)

    @endpoint
    def push_ones(self, buf: RDMABuffer) -> str:
        src = torch.ones(buf.size() // 4, dtype=torch.float32)
        buf.write_from(src.view(torch.uint8), timeout=20).get()
        return sha(src)


N = 1 << 20  # floats: 4 MiB


procs = spawn_procs_fixture({"procs": 2}, "rdma_test_procs")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["vm", "tcp"])
def test_controller_reads_and_writes_an_actor_tensor(procs, transport, monkeypatch):
    monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", transport)
    owners = procs.spawn(f"owner_{transport}", Owner, N)
    buf = owners.handle.choose().get(timeout=60)
    assert buf.size() == 4 * N
    assert buf.owner.actor and "owner_" in buf.owner.actor
    ref = torch.randn(N, generator=torch.Generator().manual_seed(1234))
    dst = torch.empty(N, dtype=torch.float32)
    buf.read_into(dst.view(torch.uint8), timeout=20).get(timeout=30)
    assert buf.last_transport == transport
    assert torch.equal(dst, ref)
    # write: every rank's own buffer, then each rank checks its tensor
    handles = list(owners.handle.call().get(timeout=60).values())  # rank order
    assert len({h.owner.pid for h in handles}) == 2
    for rank_buf in handles:
        new = torch.arange(N, dtype=torch.float32) * rank_buf.owner.pid
        rank_buf.write_from(new.view(torch.uint8), timeout=20).get(timeout=30)
    sums = list(owners.checksum.call().get(timeout=60).values())
    for rank_buf, value in zip(handles, sums):
        assert value == sha(torch.arange(N, dtype=torch.float32) * rank_buf.owner.pid)
    owners.stop().get(timeout=30)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["vm", "tcp"])
def test_resubmit_and_a_smaller_write_across_processes(procs, transport, monkeypatch):
    """Monarch's semantics over each transport: an RDMAAction submitted again transfers
    again; a write smaller than the remote buffer fills its first bytes only."""
    monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", transport)
    owners = procs.spawn(f"sizes_{transport}", Owner, 1024)
    buf = owners.handle.choose().get(timeout=60)
    got = torch.zeros(4096, dtype=torch.uint8)
    action = RDMAAction().read_remote(got, buf)
    action.submit(timeout=20).get(timeout=30)
    assert buf.last_transport == transport
    ref = got.clone()
    got.zero_()
    action.submit(timeout=20).get(timeout=30)
    assert torch.equal(got, ref) and ref.any()
    assert buf.write_from(torch.full((100,), 7, dtype=torch.uint8), timeout=20) \
        .get(timeout=30) == 100
    action.submit(timeout=20).get(timeout=30)
    assert (got[:100] == 7).all() and torch.equal(got[100:], ref[100:])
    owners.stop().get(timeout=30)


@pytest.mark.timeout(120)
def test_actor_to_actor_transfer_without_the_controller(procs):
    owners = procs.spawn("owner_a2a", Owner, N)
    readers = procs.spawn("reader_a2a", Reader)
    bufs = list(owners.handle.call().get(timeout=60).values())
    want = list(owners.checksum.call().get(timeout=60).values())
    # reader rank 1 pulls owner rank 0's buffer: a different process on this host
    got = readers.slice(procs=1).pull.call_one(bufs[0]).get(timeout=60)
    assert got == want[0]
    assert readers.slice(procs=1).pull_async.call_one(bufs[0]).get(timeout=60) == want[0]
    wrote = readers.slice(procs=0).push_ones.call_one(bufs[1]).get(timeout=60)
    assert list(owners.checksum.call().get(timeout=60).values())[1] == wrote
    assert wrote != want[1]
    owners.stop().get(timeout=30)
    readers.stop().get(timeout=30)


@pytest.mark.timeout(120)
def test_transfers_proceed_while_the_owner_endpoint_is_busy(procs, tmp_path):
    owners = procs.spawn("owner_busy", Owner, N)
    buf = owners.slice(procs=0).handle.call_one().get(timeout=60)
    want = owners.slice(procs=0).checksum.call_one().get(timeout=60)
    marker = tmp_path / "busy"
    busy = owners.slice(procs=0).busy.call_one(str(marker))
    deadline = time.monotonic() + 30
    while not (tmp_path / "busy.in").exists():  # the actor's handler is inside busy() now
        assert time.monotonic() < deadline and not busy.done()
        time.sleep(0.01)
    dst = torch.empty(4 * N, dtype=torch.uint8)
    for transport in ("vm", "tcp"):
        import os

        os.environ["MONARCH_RDMA_TRANSPORT"] = transport
        try:
            buf.read_into(dst, timeout=2.0).get(timeout=5)
        finally:
            del os.environ["MONARCH_RDMA_TRANSPORT"]
        assert sha(dst) == want
    assert not busy.done(), "the reads finished while busy() still runs"
    (tmp_path / "busy.go").touch()
    assert busy.get(timeout=30) == "released"
    owners.stop().get(timeout=30)


@pytest.mark.timeout(120)
def test_drop_through_a_handle_and_dead_owner_proc():
    pm = this_host().spawn_procs(per_host={"procs": 1}, name="rdma_doomed")
    try:
        pm.initialized.get(timeout=60)
        owners = pm.spawn("owner_doomed", Owner, 1024)
        buf = owners.handle.choose().get(timeout=60)
        extra = owners.handle.choose().get(timeout=60)
        assert owners.live_buffers.choose().get(timeout=60) == 1
        buf.drop().get(timeout=10)
        assert owners.live_buffers.choose().get(timeout=60) == 0
        with pytest.raises(RDMABufferDroppedError):
            extra.read_into(torch.empty(4096, dtype=torch.uint8)).get(timeout=10)
        # a fresh buffer, then the proc dies
        owners2 = pm.spawn("owner_doomed2", Owner, 1024)
        live = owners2.handle.choose().get(timeout=60)
        get_runtime().kill_proc(pm.procs[0].proc_id)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                live.read_into(torch.empty(4096, dtype=torch.uint8), timeout=2).get(timeout=5)
            except RDMAOwnerDiedError as e:
                assert str(live.owner.pid) in str(e)
                break
            time.sleep(0.1)
        else:
            pytest.fail("reads of a killed owner's buffer kept succeeding")
    finally:
        pm.stop().get(timeout=30)
