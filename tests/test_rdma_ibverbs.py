"""The ibverbs transport, as far as a machine without an RDMA device allows.

Where pyverbs imports, the verbs objects the transport builds (queue-pair attributes,
RDMA READ/WRITE work requests) are constructed through pyverbs' real classes. Creating
contexts, queue pairs and memory regions, and moving bytes, needs a device."""

from __future__ import annotations

import ctypes
import json

import time

import pytest

from runtime.rdma import ibverbs


def test_probe_explains_why_ibverbs_is_not_used():
    usable, why = ibverbs.probe()
    if usable:
        pytest.skip(f"RDMA device present: {why}")
    assert why in ("pyverbs found no RDMA device",
                   "pyverbs is not installed (pip install 'monarch-notebook[rdma]')")
    assert ibverbs.list_devices() == []
    assert ibverbs.open_context() is None


def test_is_ibverbs_available_says_whether_a_device_opens(monkeypatch):
    """Monarch's name: True only when our ibverbs backend opens a device. A fresh process
    asked for a device that does not exist answers False (whatever this machine has)."""
    import os
    import subprocess
    import sys

    import runtime.rdma as rdma

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root, "MONARCH_RDMA_IB_DEVICE": "no_such_device_0"}
    p = subprocess.run([sys.executable, "-c", "from runtime.rdma import is_ibverbs_available, "
                        "is_rdma_available; print(is_ibverbs_available(), is_rdma_available())"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0 and p.stdout.split() == ["False", "False"], p.stderr
    monkeypatch.setattr(ibverbs, "shared_context", lambda: object())
    assert rdma.is_ibverbs_available() is True and rdma.is_rdma_available() is True
    monkeypatch.setattr(ibverbs, "shared_context", lambda: None)
    assert rdma.is_ibverbs_available() is False
    assert "is_ibverbs_available" in rdma.__all__


def _pv():
    pv = ibverbs._pyverbs()
    if pv is None:
        pytest.skip("pyverbs is not importable here")
    return pv


@pytest.mark.parametrize("roce", [False, True])
def test_queue_pair_attributes_use_pyverbs_classes(roce):
    pv = _pv()
    e = pv["e"]
    remote = json.loads(json.dumps({"qpn": 77, "psn": 1234, "lid": 9, "mtu": 5,
                                    "gid": "fe80:0000:0000:0000:0202:c9ff:fe00:0001"}))
    attr = ibverbs.qp_attr_for(pv, port=1, mtu=3, roce=roce, gid_index=2, sq_psn=55, remote=remote)
    assert attr.dest_qp_num == 77 and attr.rq_psn == 1234 and attr.sq_psn == 55
    assert attr.path_mtu == 3  # the smaller of the two ends
    assert attr.qp_access_flags & e.IBV_ACCESS_REMOTE_READ
    assert attr.qp_access_flags & e.IBV_ACCESS_REMOTE_WRITE
    ah = attr.ah_attr
    assert ah.port_num == 1
    if roce:
        assert ah.is_global == 1 and ah.sgid_index == 2
        assert ah.dgid == remote["gid"]
    else:
        assert ah.is_global == 0 and ah.dlid == 9


@pytest.mark.parametrize("write", [False, True])
def test_rdma_work_requests_are_one_sided_and_signaled(write):
    pv = _pv()
    e = pv["e"]
    buf = ctypes.create_string_buffer(4096)
    wr = ibverbs.rdma_wr(pv, 3, write, ctypes.addressof(buf), 4096, 0x11, 0x7000, 0x22)
    assert wr.wr_id == 3
    assert wr.opcode == (e.IBV_WR_RDMA_WRITE if write else e.IBV_WR_RDMA_READ)
    assert wr.send_flags & e.IBV_SEND_SIGNALED
    assert wr.num_sge == 1


# -- the transport's orchestration over a stand-in verbs layer ------------------------------
class _FakeMR:
    live: dict[int, "_FakeMR"] = {}

    def __init__(self, addr: int, nbytes: int, remote: bool) -> None:
        self.addr, self.nbytes, self.remote = addr, nbytes, remote
        self.lkey = self.rkey = len(_FakeMR.live) + 100
        _FakeMR.live[self.rkey] = self

    def close(self) -> None:
        _FakeMR.live.pop(self.rkey, None)


class _FakeEndpoint:
    """Plays the NIC: a one-sided copy that only succeeds through a live remote registration."""

    broken = False

    def __init__(self) -> None:
        self.peer = None

    def local_info(self) -> bytes:
        return json.dumps({"qpn": id(self) & 0xFFFFFF}).encode()

    def connect(self, remote: bytes) -> None:
        self.peer = json.loads(remote)

    def transfer(self, local_mr, local_addr, remote_addr, rkey, nbytes, *, write, deadline):
        from runtime.rdma.errors import RDMATransportError

        assert self.peer is not None, "transfer before the queue pair was connected"
        mr = _FakeMR.live.get(rkey)
        if mr is None or not mr.remote or not (mr.addr <= remote_addr <= mr.addr + mr.nbytes - nbytes):
            raise RDMATransportError("work completion status 10 (remote access error)")
        if write:
            ctypes.memmove(remote_addr, local_addr, nbytes)
        else:
            ctypes.memmove(local_addr, remote_addr, nbytes)

    def close(self) -> None:
        pass


class _FakeContext:
    def register(self, addr: int, nbytes: int, *, remote: bool) -> _FakeMR:
        return _FakeMR(addr, nbytes, remote)

    def create_endpoint(self) -> _FakeEndpoint:
        return _FakeEndpoint()


@pytest.mark.timeout(60)
def test_ibverbs_path_exchanges_queue_pairs_and_keys_over_the_data_socket(monkeypatch):
    """With a stand-in verbs layer (no device here): selection, QP info and rkey exchange
    through the data server, registration lifetime, and the drop that revokes access."""
    import dataclasses
    import pickle

    import torch

    from runtime.rdma import RDMABuffer, RDMABufferDroppedError, get_rdma_backend

    monkeypatch.setattr(ibverbs, "shared_context", lambda: _FakeContext())
    monkeypatch.delenv("MONARCH_RDMA_TRANSPORT", raising=False)
    data = torch.arange(50_000, dtype=torch.int32)
    buf = RDMABuffer(data)
    assert buf._h.ib
    remote = pickle.loads(pickle.dumps(buf))
    remote._h = dataclasses.replace(buf._h, host_id="another-host/boot/ns")
    assert get_rdma_backend(remote) == "ibverbs"
    out = torch.empty(50_000, dtype=torch.int32)
    remote.read_into(out).get(timeout=10)
    assert remote.last_transport == "ibverbs"
    assert torch.equal(out, data)
    remote.write_from(torch.full((1000,), -7, dtype=torch.int32), offset=4000).get(timeout=10)
    assert (data[1000:2000] == -7).all() and data[999] == 999 and data[2000] == 2000
    # the local registrations made for each transfer are gone; the owner's stays until drop
    assert [mr.remote for mr in _FakeMR.live.values()] == [True]
    buf.drop()
    # deregistered (a late one-sided access would now fail): at once, or when the data
    # server's thread releases its pin of the last transfer, which may trail the reply
    deadline = time.monotonic() + 5
    while _FakeMR.live and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _FakeMR.live == {}
    with pytest.raises(RDMABufferDroppedError):
        remote.read_into(out).get(timeout=10)
