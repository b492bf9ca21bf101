"""ibverbs transport through pyverbs: memory registration, RC queue pairs, one-sided READ/WRITE.

Used only when pyverbs imports and an RDMA device with an active port exists; otherwise
`open_context()` returns None and callers fall back (with a log line saying why)."""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from typing import Any, Optional

from ..config import config
from .errors import RDMATimeoutError, RDMATransportError

__all__ = [
    "DEPTH", "CHUNK", "list_devices", "probe", "IbvContext", "IbvEndpoint", "qp_attr_for",
    "rdma_wr", "open_context", "shared_context",
]

log = logging.getLogger("runtime.rdma")

DEPTH = 32  # outstanding work requests per queue pair
CHUNK = 64 << 20  # bytes per work request


def _pyverbs() -> Optional[dict[str, Any]]:
    """Import pyverbs' pieces, or None (with the reason logged at debug level)."""
    try:
        from pyverbs.device import Context, get_device_list
        from pyverbs.pd import PD
        from pyverbs.mr import MR
        from pyverbs.cq import CQ
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
        from pyverbs.addr import AHAttr, GID, GlobalRoute
        from pyverbs.wr import SGE, SendWR
        try:
            import pyverbs.enums as e
        except ImportError:  # pyverbs before v46
            import pyverbs.libibverbs_enums as e
    except Exception as exc:  # ImportError, or a missing libibverbs.so behind it
        log.debug("pyverbs unavailable: %s", exc)
        return None
    return dict(Context=Context, get_device_list=get_device_list, PD=PD, MR=MR, CQ=CQ, QP=QP,
                QPAttr=QPAttr, QPCap=QPCap, QPInitAttr=QPInitAttr, AHAttr=AHAttr, GID=GID,
                GlobalRoute=GlobalRoute, SGE=SGE, SendWR=SendWR, e=e)


def list_devices() -> list[str]:
    """Names of the RDMA devices pyverbs sees ([] without pyverbs or without devices)."""
    pv = _pyverbs()
    if pv is None:
        return []
    try:
        return [d.name.decode() if isinstance(d.name, bytes) else str(d.name)
                for d in pv["get_device_list"]()]
    except Exception as exc:
        log.debug("ibv_get_device_list failed: %s", exc)
        return []


def probe() -> tuple[bool, str]:
    """(usable, reason): whether ibverbs can be used here and, if not, why."""
    if _pyverbs() is None:
        return False, "pyverbs is not installed (pip install 'monarch-notebook[rdma]')"
    devices = list_devices()
    if not devices:
        return False, "pyverbs found no RDMA device"
    return True, f"RDMA devices: {', '.join(devices)}"


class IbvContext:
    """An opened device + protection domain + port facts; registers memory, makes endpoints."""

    def __init__(self, name: str, port: int, gid_index: int) -> None:
        pv = _pyverbs()
        assert pv is not None  # opened only for a device that list_devices() found via pyverbs
        self.pv: dict[str, Any] = pv
        e = pv["e"]
        self.name, self.port, self.gid_index = name, port, gid_index
        self.ctx = pv["Context"](name=name)
        self.pd = pv["PD"](self.ctx)
        pattr = self.ctx.query_port(port)
        if pattr.state != e.IBV_PORT_ACTIVE:
            raise RuntimeError(f"port {port} of {name} is not active")
        self.lid = pattr.lid
        self.mtu = pattr.active_mtu
        self.roce = pattr.link_layer == e.IBV_LINK_LAYER_ETHERNET
        self.gid = str(self.ctx.query_gid(port, gid_index))

    def register(self, addr: int, nbytes: int, *, remote: bool) -> Any:
        """Register [addr, addr+nbytes) with the NIC; remote=True lets peers read and write it."""
        e = self.pv["e"]
        access = e.IBV_ACCESS_LOCAL_WRITE
        if remote:
            access |= e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE
        return self.pv["MR"](self.pd, nbytes, access, address=addr)

    def create_endpoint(self) -> "IbvEndpoint":
        return IbvEndpoint(self)


class IbvEndpoint:
    """One reliable-connected queue pair and its completion queue."""

    def __init__(self, ctx: IbvContext) -> None:
        pv, e = ctx.pv, ctx.pv["e"]
        self.c = ctx
        self.cq = pv["CQ"](ctx.ctx, DEPTH * 2)
        cap = pv["QPCap"](max_send_wr=DEPTH, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        init = pv["QPInitAttr"](qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap,
                                sq_sig_all=1)
        self.qp = pv["QP"](ctx.pd, init)
        self.psn = random.getrandbits(24)
        self.broken = False

    def local_info(self) -> bytes:
        """What the peer needs to connect to us, sent over the data-server socket."""
        return json.dumps({"qpn": self.qp.qp_num, "psn": self.psn, "lid": self.c.lid,
                           "gid": self.c.gid, "mtu": int(self.c.mtu)}).encode()

    def connect(self, remote: bytes) -> None:
        """Move the QP through INIT, RTR and RTS towards the peer described by `remote`."""
        c = self.c
        attr = qp_attr_for(c.pv, port=c.port, mtu=int(c.mtu), roce=c.roce, gid_index=c.gid_index,
                           sq_psn=self.psn, remote=json.loads(remote))
        self.qp.to_rts(attr)

    def transfer(self, local_mr: Any, local_addr: int, remote_addr: int, rkey: int, nbytes: int,
                 *, write: bool, deadline: float) -> None:
        """One-sided RDMA READ (or WRITE) of nbytes, pipelined in CHUNK-sized work requests."""
        pv, e = self.c.pv, self.c.pv["e"]
        posted = completed = 0
        pos = 0
        wr_id = 0
        while completed < posted or pos < nbytes:
            while pos < nbytes and posted - completed < DEPTH:
                n = min(CHUNK, nbytes - pos)
                self.qp.post_send(rdma_wr(pv, wr_id, write, local_addr + pos, n, local_mr.lkey,
                                          remote_addr + pos, rkey))
                posted += 1
                wr_id += 1
                pos += n
            npolled, wcs = self.cq.poll(num_entries=DEPTH)
            for wc in wcs[:npolled]:
                if wc.status != e.IBV_WC_SUCCESS:
                    self.broken = True
                    raise RDMATransportError(
                        f"RDMA {'write' if write else 'read'} failed: work completion status "
                        f"{wc.status} (remote buffer dropped or deregistered, or link error)")
            completed += npolled
            if npolled == 0:
                if time.monotonic() > deadline:
                    self.broken = True  # outstanding requests: the QP cannot be reused safely
                    raise RDMATimeoutError(
                        f"RDMA {'write' if write else 'read'} of {nbytes} bytes timed out "
                        f"({completed}/{posted} work requests completed)")
                time.sleep(0)

    def close(self) -> None:
        for obj in (self.qp, self.cq):
            try:
                obj.close()
            except Exception:
                pass


def qp_attr_for(pv: dict[str, Any], *, port: int, mtu: int, roce: bool, gid_index: int,
                sq_psn: int, remote: dict[str, Any]) -> Any:
    """QPAttr carrying everything INIT->RTR->RTS needs for an RC QP towards `remote`."""
    e = pv["e"]
    attr = pv["QPAttr"](port_num=port, path_mtu=min(mtu, int(remote["mtu"])))
    attr.qp_access_flags = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ
                            | e.IBV_ACCESS_REMOTE_WRITE)
    attr.dest_qp_num = remote["qpn"]
    attr.rq_psn = remote["psn"]
    attr.sq_psn = sq_psn
    attr.max_dest_rd_atomic = 16
    attr.max_rd_atomic = 16
    attr.min_rnr_timer = 12
    attr.timeout = 14
    attr.retry_cnt = 7
    attr.rnr_retry = 7
    if roce:  # Ethernet link layer: address by GID through a global route header
        gr = pv["GlobalRoute"](dgid=pv["GID"](remote["gid"]), sgid_index=gid_index, hop_limit=64)
        attr.ah_attr = pv["AHAttr"](port_num=port, is_global=1, gr=gr)
    else:  # InfiniBand: address by LID
        attr.ah_attr = pv["AHAttr"](port_num=port, dlid=remote["lid"])
    return attr


def rdma_wr(pv: dict[str, Any], wr_id: int, write: bool, local_addr: int, nbytes: int,
            lkey: int, remote_addr: int, rkey: int) -> Any:
    """A signaled one-sided RDMA READ or WRITE work request of one scatter-gather entry."""
    e = pv["e"]
    sge = pv["SGE"](local_addr, nbytes, lkey)
    wr = pv["SendWR"](wr_id=wr_id, opcode=e.IBV_WR_RDMA_WRITE if write else e.IBV_WR_RDMA_READ,
                      num_sge=1, sg=[sge], send_flags=e.IBV_SEND_SIGNALED)
    wr.set_wr_rdma(rkey, remote_addr)
    return wr


def open_context() -> Optional[IbvContext]:
    """Open the configured (or first usable) RDMA device, or None with a log line saying why."""
    ok, why = probe()
    if not ok:
        log.info("rdma: ibverbs not used: %s", why)
        return None
    wanted = config.rdma_ib_device  # MONARCH_RDMA_IB_DEVICE, _PORT, _GID_INDEX
    port = config.rdma_ib_port
    gid_index = config.rdma_ib_gid_index
    names = [wanted] if wanted else list_devices()
    for name in names:
        try:
            ctx = IbvContext(name, port, gid_index)
            log.info("rdma: using ibverbs device %s port %d", name, port)
            return ctx
        except Exception as exc:
            log.info("rdma: ibverbs device %s unusable: %s", name, exc)
    return None


_shared: Optional[IbvContext] = None
_shared_done = False
_shared_lock = threading.Lock()


def shared_context() -> Optional[IbvContext]:
    """This process's ibverbs context, opened once (None when ibverbs is not usable)."""
    global _shared, _shared_done
    with _shared_lock:
        if not _shared_done:
            _shared = open_context()
            _shared_done = True
        return _shared


def _after_fork() -> None:
    global _shared, _shared_done, _shared_lock
    _shared, _shared_done, _shared_lock = None, False, threading.Lock()  # verbs objects do not survive fork


os.register_at_fork(after_in_child=_after_fork)
