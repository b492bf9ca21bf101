"""The ibverbs transport, as far as a machine without an RDMA device allows.

Where pyverbs imports, the verbs objects the transport builds (queue-pair attributes,
RDMA READ/WRITE work requests) are constructed through pyverbs' real classes. Creating
contexts, queue pairs and memory regions, and moving bytes, needs a device."""

from __future__ import annotations

import ctypes
import json

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
