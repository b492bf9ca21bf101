"""The per-process data server: serves this process's buffers on its own sockets and threads.

Started lazily by the first RDMABuffer; transfers never run in actor endpoint code."""

from __future__ import annotations

import atexit
import logging
import os
import socket
import struct
import threading
import time
from typing import TYPE_CHECKING, Optional

from .. import rundir
from ..config import config
from ..transport.accept import AcceptGuard
from . import protocol as P
from .identity import process_start_time, session_secret
from .memory import view_of
from .registry import Entry, Registry

if TYPE_CHECKING:  # imported when a peer asks for a queue pair
    from .ibverbs import IbvEndpoint

__all__ = [
    "HANDSHAKE_TIMEOUT", "PIN_REPLY", "INFO_REPLY", "MR_REPLY", "DataServer", "get_server",
    "current_server",
]

log = logging.getLogger("runtime.rdma")

HANDSHAKE_TIMEOUT = 5.0

PIN_REPLY = struct.Struct("!QQ")  # address, size
INFO_REPLY = struct.Struct("!qq")  # pid, start time
MR_REPLY = struct.Struct("!QI")  # address, rkey


class DataServer:
    """Listens on a unix socket (0700 dir) and a TCP port; one thread per connection."""

    def __init__(self) -> None:
        self.registry = Registry()
        self.pid = os.getpid()
        self.start_time = process_start_time(self.pid) or 0
        self.secret, _ = session_secret()
        self._rundir = rundir.make_dir("rdma")  # mode 0700, in the per-user runtime root
        self._closed = False
        self._listeners: list[socket.socket] = []
        self._mr_lock = threading.Lock()  # one memory registration per buffer
        path = os.path.join(self._rundir, "data.sock")
        us = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        us.bind(path)
        us.listen(64)
        host = config.rdma_host  # MONARCH_RDMA_HOST
        ts = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        ts.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ts.bind((host, 0))
        ts.listen(64)
        self._listeners = [us, ts]
        self.guards = [AcceptGuard(s, f"rdma data server ({kind})", config.rdma_max_pending,
                                   HANDSHAKE_TIMEOUT) for s, kind in ((us, "unix"), (ts, "tcp"))]
        advertise = config.rdma_advertise_host or host  # MONARCH_RDMA_ADVERTISE_HOST
        if advertise in ("0.0.0.0", "::"):
            advertise = socket.gethostbyname(socket.gethostname())
        if ":" in advertise:
            advertise = f"[{advertise}]"
        self.addresses = [f"unix:{path}", f"tcp:{advertise}:{ts.getsockname()[1]}"]
        for guard in self.guards:
            threading.Thread(target=self._accept_loop, args=(guard,), daemon=True,
                             name="rdma-data-server").start()
        atexit.register(self.close)
        log.debug("data server for pid %d on %s", self.pid, self.addresses)

    # -- lifecycle -------------------------------------------------------------------
    def close(self) -> None:
        if self._closed or os.getpid() != self.pid:  # a forked child must not remove our socket
            return
        self._closed = True
        for guard in self.guards:
            guard.close()
        for sock in self._listeners:
            try:
                sock.close()
            except OSError:
                pass
        rundir.remove_dir(self._rundir)

    def _accept_loop(self, guard: AcceptGuard) -> None:
        """Accept until closed; errors (EMFILE...) back off instead of ending the loop."""
        while not self._closed:
            got = guard.accept()
            if got is None:
                return
            conn, peer = got
            try:
                threading.Thread(target=self._serve, args=(conn, peer, guard), daemon=True,
                                 name="rdma-data-conn").start()
            except RuntimeError:  # no thread left (resource exhaustion): drop this one
                guard.done(conn)
                conn.close()
                time.sleep(0.05)

    # -- one connection --------------------------------------------------------------
    def _serve(self, sock: socket.socket, peer: object, guard: AcceptGuard) -> None:
        try:
            if sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(HANDSHAKE_TIMEOUT)
            P.server_handshake(sock, self.secret)
            sock.settimeout(None)
            if not guard.authenticated(sock):
                raise P.ProtocolError("handshake took too long (shut down)")
        except (P.ProtocolError, OSError) as e:
            guard.done(sock)
            _log_dropped(peer, e)
            sock.close()
            return
        pins: list[Entry] = []
        endpoints: list[IbvEndpoint] = []  # ibverbs queue pairs live as long as this connection
        try:
            while True:
                req = P.recv_request(sock)
                if req is None:
                    return
                self._handle(sock, req, pins, endpoints)
        except (P.ProtocolError, OSError) as e:
            log.debug("rdma data connection closed: %s", e)
        except Exception:
            log.exception("rdma data server: request failed")
        finally:
            for entry in pins:
                self.registry.unpin(entry)
            for ep in endpoints:
                try:
                    ep.close()
                except Exception:
                    pass
            sock.close()

    def _lookup_pinned(self, sock: socket.socket, buffer_id: int, offset: int,
                       length: int) -> Optional[Entry]:
        """Pin the buffer and check the range; on failure reply with the reason and return None."""
        lk = self.registry.pin(buffer_id)
        if lk.entry is None:
            st = P.ST_DROPPED if lk.status == "dropped" else P.ST_UNKNOWN
            P.send_reply(sock, st, f"buffer {buffer_id} is {lk.status} in pid {self.pid}".encode())
            return None
        size = lk.entry.span.nbytes
        if offset + length > size or length == 0:
            self.registry.unpin(lk.entry)
            P.send_reply(sock, P.ST_BOUNDS,
                         f"range [{offset}, {offset + length}) outside buffer of {size} bytes".encode())
            return None
        return lk.entry

    def _handle(self, sock: socket.socket, req: tuple, pins: list[Entry],
                endpoints: list[IbvEndpoint]) -> None:
        op, bid, off, length, payload = req
        if op == P.OP_READ:
            entry = self._lookup_pinned(sock, bid, off, length)
            if entry is None:
                return
            try:
                P.send_reply(sock, P.ST_OK)
                if entry.span.is_cuda:
                    self._send_cuda(sock, entry, off, length)
                else:
                    sock.sendall(view_of(entry.span.addr + off, length))
            finally:
                self.registry.unpin(entry)
        elif op == P.OP_WRITE:
            entry = self._lookup_pinned(sock, bid, off, length)
            if entry is None:
                return
            try:
                P.send_reply(sock, P.ST_OK)
                if entry.span.is_cuda:
                    self._recv_cuda(sock, entry, off, length)
                else:
                    P.recv_into_exact(sock, view_of(entry.span.addr + off, length))
                P.send_reply(sock, P.ST_OK)
            finally:
                self.registry.unpin(entry)
        elif op == P.OP_PIN:
            entry = self._lookup_pinned(sock, bid, off, length)
            if entry is None:
                return
            if entry.span.is_cuda:
                self.registry.unpin(entry)
                P.send_reply(sock, P.ST_ERROR, (
                    f"buffer {bid} is in CUDA memory ({entry.span.device}): process_vm cannot "
                    "read it; use transport auto (CUDA IPC) or tcp").encode())
                return
            pins.append(entry)
            P.send_reply(sock, P.ST_OK, PIN_REPLY.pack(entry.span.addr + off, length))
        elif op in (P.OP_CUDA_IPC, P.OP_CUDA_PIN):
            self._handle_cuda(sock, op, bid, off, length, pins)
        elif op == P.OP_UNPIN:
            for i, entry in enumerate(pins):
                if entry.buffer_id == bid:
                    pins.pop(i)
                    self.registry.unpin(entry)
                    P.send_reply(sock, P.ST_OK)
                    return
            P.send_reply(sock, P.ST_ERROR, f"buffer {bid} is not pinned on this connection".encode())
        elif op == P.OP_DROP:
            known = self.registry.drop(bid)
            P.send_reply(sock, P.ST_OK if known else P.ST_UNKNOWN)
        elif op == P.OP_INFO:
            P.send_reply(sock, P.ST_OK, INFO_REPLY.pack(self.pid, self.start_time))
        elif op == P.OP_IB_CONNECT:
            ctx = self.ib_context()
            if ctx is None:
                P.send_reply(sock, P.ST_ERROR, b"no RDMA device in the owner process")
                return
            ep = ctx.create_endpoint()
            try:
                ep.connect(payload)
            except Exception as e:
                ep.close()
                P.send_reply(sock, P.ST_ERROR, f"queue pair setup failed: {e}".encode())
                return
            endpoints.append(ep)
            P.send_reply(sock, P.ST_OK, ep.local_info())
        elif op == P.OP_IB_MR:
            self._handle_ib_mr(sock, bid, off, length)
        else:
            P.send_reply(sock, P.ST_ERROR, f"unknown op {op}".encode())

    def _handle_cuda(self, sock: socket.socket, op: int, bid: int, off: int, length: int,
                     pins: list[Entry]) -> None:
        """OP_CUDA_IPC: the buffer's IPC handle; OP_CUDA_PIN: pin it once its device is idle."""
        entry = self._lookup_pinned(sock, bid, off, max(length, 1))
        if entry is None:
            return
        if not entry.span.is_cuda:
            self.registry.unpin(entry)
            P.send_reply(sock, P.ST_ERROR, f"buffer {bid} is not in CUDA memory".encode())
            return
        try:
            import torch

            # work queued on the owner's device before the transfer is done before it
            torch.cuda.synchronize(torch.device(entry.span.device))
            if op == P.OP_CUDA_IPC:
                from .cuda import export_ipc

                reply = export_ipc(entry.span.keepalive, entry.span.addr)
            else:
                pins.append(entry)
                entry = None  # stays pinned until OP_UNPIN or the connection closes
                reply = b""
        except Exception as e:  # noqa: BLE001 - e.g. an allocation torch cannot share
            P.send_reply(sock, P.ST_ERROR, f"CUDA IPC export failed: {e}".encode())
            return
        finally:
            if entry is not None:
                self.registry.unpin(entry)
        P.send_reply(sock, P.ST_OK, reply)

    def _handle_ib_mr(self, sock: socket.socket, bid: int, off: int, length: int) -> None:
        ctx = self.ib_context()
        if ctx is None:
            P.send_reply(sock, P.ST_ERROR, b"no RDMA device in the owner process")
            return
        entry = self._lookup_pinned(sock, bid, off, length)
        if entry is None:
            return
        if entry.span.is_cuda and not config.rdma_gpudirect:
            self.registry.unpin(entry)
            P.send_reply(sock, P.ST_ERROR, (f"buffer {bid} is in CUDA memory and GPUDirect RDMA "
                                            "is off here (MONARCH_RDMA_GPUDIRECT)").encode())
            return
        try:
            if entry.span.is_cuda:  # the NIC reads device memory: the device's work is done
                import torch

                torch.cuda.synchronize(torch.device(entry.span.device))
            with self._mr_lock:
                if entry.ib_mr is None:
                    entry.ib_mr = ctx.register(entry.span.addr, entry.span.nbytes, remote=True)
                rkey = entry.ib_mr.rkey
            P.send_reply(sock, P.ST_OK, MR_REPLY.pack(entry.span.addr + off, rkey))
        except Exception as e:
            P.send_reply(sock, P.ST_ERROR, f"memory registration failed: {e}".encode())
        finally:
            self.registry.unpin(entry)

    def ib_context(self):  # -> Optional[ibverbs.IbvContext]
        from . import ibverbs

        return ibverbs.shared_context()

    # -- CUDA buffers over sockets: pinned chunks, device copies overlapping the socket ------
    def _send_cuda(self, sock: socket.socket, entry: Entry, off: int, length: int) -> None:
        from .cuda import device_to_host, flat_u8

        dev = flat_u8(entry.span.keepalive)[off:off + length]
        device_to_host(dev, lambda addr, n, pos: sock.sendall(view_of(addr, n)))

    def _recv_cuda(self, sock: socket.socket, entry: Entry, off: int, length: int) -> None:
        from .cuda import flat_u8, host_to_device

        dev = flat_u8(entry.span.keepalive)[off:off + length]
        host_to_device(dev, lambda addr, n, pos: P.recv_into_exact(sock, view_of(addr, n)))


_drop_log_at = 0.0
_drops_unlogged = 0


def _log_dropped(peer: object, e: BaseException) -> None:
    """Log a connection dropped before authentication, at most once a second (a flood
    must not flood the log)."""
    global _drop_log_at, _drops_unlogged
    now = time.monotonic()
    if now - _drop_log_at < 1.0:
        _drops_unlogged += 1
        return
    more = f" (and {_drops_unlogged} more since the last report)" if _drops_unlogged else ""
    _drop_log_at, _drops_unlogged = now, 0
    log.warning("rdma data server: dropped connection from %s before authentication: %s%s",
                peer or "unix peer", e, more)


_server: Optional[DataServer] = None
_server_lock = threading.Lock()


def get_server() -> DataServer:
    """This process's data server, started on first use."""
    global _server
    with _server_lock:
        if _server is None or _server.pid != os.getpid():
            _server = DataServer()
        return _server


def current_server() -> Optional[DataServer]:
    """The running server of this process, or None if no buffer was ever created here."""
    s = _server
    return s if s is not None and s.pid == os.getpid() else None


def _after_fork() -> None:
    global _server, _server_lock
    _server = None  # the parent's listeners and threads are not ours
    _server_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)
