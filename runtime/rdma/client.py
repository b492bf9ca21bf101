"""The caller's side of a transfer: picks a transport per owner and moves the bytes.

Runs in transfer threads (never in an actor's endpoint code); raises RDMAError subclasses."""

from __future__ import annotations

import atexit
import collections
import ctypes
import errno
import logging
import os
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..config import config
from . import cuda
from . import protocol as P
from . import vm
from .choice import choose_transport
from .errors import (RDMAAuthError, RDMABufferDroppedError, RDMAError, RDMAOwnerDiedError,
                     RDMASizeError, RDMATimeoutError, RDMATransportError)
from .handle import Handle
from .identity import host_id, process_alive, session_secret
from .memory import Span, view_of
from .registry import Entry, Registry
from .server import INFO_REPLY, MR_REPLY, PIN_REPLY, current_server

if TYPE_CHECKING:  # imported when first used (ib_transfer)
    from .ibverbs import IbvEndpoint

__all__ = [
    "MIN_STREAM_BYTES", "VM_CHUNK", "transport_mode", "Deadline", "split_pieces", "run_pieces",
    "tcp_transfer", "vm_usable", "vm_transfer", "local_transfer", "ib_transfer", "drop_remote",
    "owner_info", "close_ipc", "ipc_transfer", "local_cuda_transfer", "choose",
    "check_not_across_gateway", "transfer",
]

log = logging.getLogger("runtime.rdma")

MIN_STREAM_BYTES = 4 << 20  # never split a transfer into pieces smaller than this
VM_CHUNK = 64 << 20  # deadline is checked between chunks of a same-host copy


def transport_mode() -> str:
    """config.rdma_transport (MONARCH_RDMA_TRANSPORT); a bad value raises RDMAError."""
    try:
        return config.rdma_transport
    except ValueError as e:
        raise RDMAError(str(e)) from None


class Deadline:
    """An absolute deadline with helpers that turn lateness into RDMATimeoutError."""

    def __init__(self, timeout: float, what: str) -> None:
        self.at = time.monotonic() + timeout
        self.timeout = timeout
        self.what = what

    def remaining(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise RDMATimeoutError(f"{self.what} did not complete within {self.timeout:g} s")
        return left


def _status_error(status: int, msg: bytes, h: Handle) -> RDMAError:
    text = msg.decode(errors="replace")
    where = f"buffer {h.buffer_id} of pid {h.pid} on {h.hostname}"
    if status == P.ST_DROPPED:
        return RDMABufferDroppedError(f"{where} was dropped; it can no longer be read or written")
    if status == P.ST_UNKNOWN:
        return RDMABufferDroppedError(f"{where} is unknown to its owner (dropped or never exported)")
    if status == P.ST_BOUNDS:
        return RDMASizeError(f"{where}: {text}")
    return RDMATransportError(f"{where}: {text}")


# -- connections -----------------------------------------------------------------------
class _Pool:
    """Idle authenticated connections per data-server address, each with the number of
    replies still to read from it (acknowledgements we chose not to wait for). At most
    `config.rdma_idle_connections` are kept, the least recently given back closed first: a
    controller that reads from procs all day keeps no descriptor (nor a data server's
    thread) for each proc it ever read from."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # address -> its idle connections; the least recently given back address first
        self._idle: collections.OrderedDict[str, list[tuple[socket.socket, int]]] = \
            collections.OrderedDict()
        self._count = 0

    def take(self, addr: str) -> Optional[tuple[socket.socket, int]]:
        with self._lock:
            socks = self._idle.get(addr)
            if not socks:
                return None
            got = socks.pop()
            if not socks:
                del self._idle[addr]
            self._count -= 1
            return got

    def give(self, addr: str, sock: socket.socket, pending: int = 0) -> None:
        evicted = []
        with self._lock:
            self._idle.setdefault(addr, []).append((sock, pending))
            self._idle.move_to_end(addr)
            self._count += 1
            while self._count > max(0, config.rdma_idle_connections):
                oldest, socks = next(iter(self._idle.items()))
                evicted.append(socks.pop(0)[0])
                if not socks:
                    del self._idle[oldest]
                self._count -= 1
        for s in evicted:
            s.close()

    def discard(self, addr: str) -> None:
        with self._lock:
            socks = self._idle.pop(addr, [])
            self._count -= len(socks)
        for s, _ in socks:
            s.close()

    def close_all(self) -> None:
        """Close every idle connection (at exit)."""
        with self._lock:
            socks = [s for lst in self._idle.values() for s, _ in lst]
            self._idle.clear()
            self._count = 0
        for s in socks:
            s.close()


_pool = _Pool()
atexit.register(_pool.close_all)


def _owner_gone(h: Handle, detail: str) -> RDMAOwnerDiedError:
    return RDMAOwnerDiedError(
        f"the owner of buffer {h.buffer_id} (pid {h.pid} on {h.hostname}) is gone: {detail}")


def _connect(h: Handle, addr: str, dl: Deadline) -> socket.socket:
    kind, _, rest = addr.partition(":")
    try:
        if kind == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(dl.remaining())
                sock.connect(rest)
            except BaseException:
                sock.close()  # (create_connection closes its own)
                raise
        else:
            host, _, port = rest.rpartition(":")
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=dl.remaining())
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (FileNotFoundError, ConnectionRefusedError) as e:
        _pool.discard(addr)
        raise _owner_gone(h, f"its data server refuses connections ({e.strerror})") from None
    except socket.timeout:
        raise RDMATimeoutError(f"connecting to the data server at {addr} timed out") from None
    except OSError as e:
        raise RDMATransportError(f"cannot reach the data server at {addr}: {e}") from None
    secret = h.secret if h.secret is not None else session_secret()[0]
    try:
        sock.settimeout(dl.remaining())
        P.client_handshake(sock, secret)
        # The address may have been reused by a later process: make sure it is still the owner.
        P.send_request(sock, P.OP_INFO)
        status, body = P.recv_reply(sock)
        pid, start = INFO_REPLY.unpack(body) if status == P.ST_OK else (-1, -1)
    except socket.timeout:
        sock.close()
        raise RDMATimeoutError(f"authenticating with the data server at {addr} timed out") from None
    except (P.ProtocolError, OSError, struct.error) as e:
        sock.close()
        raise _broken_while_connecting(h, addr, e) from None
    if (pid, start) != (h.pid, h.start_time):
        sock.close()
        raise _owner_gone(h, f"its data-server address now belongs to pid {pid}")
    return sock


def _broken_while_connecting(h: Handle, addr: str, e: Exception) -> RDMAError:
    """The error for a connection that broke while we introduced ourselves: an owner that
    died meanwhile (on its host we can tell; elsewhere a reset says so), a wrong secret, or a
    peer that is not a data server of ours."""
    if h.host_id == host_id() and _wait_gone(h):
        return _owner_gone(h, "process exited while we connected")
    if isinstance(e, P.HandshakeRejected):
        return RDMAAuthError(f"data server at {addr} rejected us: {e}")
    if isinstance(e, (P.ProtocolError, struct.error)):
        return RDMATransportError(f"data server at {addr} broke the protocol while we connected: {e}")
    if h.host_id != host_id():
        return _owner_gone(h, f"connection lost while we connected ({e})")
    return RDMATransportError(f"connection to the data server at {addr} lost while we connected: {e}")


def _wait_gone(h: Handle, within: float = 0.5) -> bool:
    """True once the (same-host) owner is gone; gives a dying process `within` s to finish."""
    end = time.monotonic() + within
    while process_alive(h.pid, h.start_time):
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


class _Conn:
    """A borrowed connection: returned to the pool on clean exit, closed on any error."""

    def __init__(self, h: Handle, addr: str, dl: Deadline) -> None:
        self.h, self.addr, self.dl = h, addr, dl
        self.pending = 0
        while True:
            idle = _pool.take(addr)
            if idle is None:
                self.sock = _connect(h, addr, dl)
                return
            self.sock, pending = idle
            if self._drain(pending):
                return

    def _drain(self, pending: int) -> bool:
        """Read the acknowledgements left on a pooled connection; False (and closed) if it broke."""
        try:
            for _ in range(pending):
                self.sock.settimeout(self.dl.remaining())
                status, body = P.recv_reply(self.sock)
                if status != P.ST_OK:
                    log.debug("rdma: deferred acknowledgement said %d: %r", status, body)
            return True
        except (P.ProtocolError, OSError):
            self.sock.close()
            return False

    def post(self, op: int) -> None:
        """Send a request whose (OK) reply is read by the connection's next user."""
        try:
            P.send_request(self.sock, op, self.h.buffer_id)
        except OSError as e:
            raise self.lost(e) from None
        self.pending += 1

    def __enter__(self) -> "_Conn":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            _pool.give(self.addr, self.sock, self.pending)
        else:
            self.sock.close()

    def call(self, op: int, offset: int = 0, length: int = 0, payload: bytes = b"") -> bytes:
        """Send one request and return the OK reply's payload (raise on other statuses)."""
        self.sock.settimeout(self.dl.remaining())
        try:
            P.send_request(self.sock, op, self.h.buffer_id, offset, length, payload)
            status, body = P.recv_reply(self.sock)
        except socket.timeout:
            raise RDMATimeoutError(f"{self.dl.what} did not complete within {self.dl.timeout:g} s") from None
        except (P.ProtocolError, OSError) as e:
            raise self.lost(e) from None
        if status != P.ST_OK:
            raise _status_error(status, body, self.h)
        return body

    def lost(self, e: BaseException) -> RDMAError:
        if self.h.host_id == host_id() and _wait_gone(self.h):
            return _owner_gone(self.h, "process exited during the transfer")
        return RDMATransportError(f"connection to the data server at {self.addr} lost: {e}")


def _pick_address(h: Handle, same_host: bool) -> str:
    if same_host:
        for a in h.addresses:
            if a.startswith("unix:"):
                return a
    for a in h.addresses:
        if a.startswith("tcp:"):
            return a
    raise RDMATransportError(f"buffer {h.buffer_id} advertises no usable data-server address")


# -- transports ------------------------------------------------------------------------
_streams = ThreadPoolExecutor(max_workers=16, thread_name_prefix="rdma-stream")


def split_pieces(nbytes: int, parts: int) -> list[tuple[int, int]]:
    """Cut [0, nbytes) into `parts` page-aligned (start, length) pieces."""
    parts = max(1, min(parts, nbytes // MIN_STREAM_BYTES))
    step = -(-nbytes // parts)
    step = -(-step // 4096) * 4096
    return [(s, min(step, nbytes - s)) for s in range(0, nbytes, step)]


def run_pieces(pieces: list[tuple[int, int]], fn: Callable[[int, int], None]) -> None:
    """Run fn(start, length) for each piece, the first in this thread; re-raise the first error."""
    futs = [_streams.submit(fn, s, n) for s, n in pieces[1:]]
    errs: list[BaseException] = []
    try:
        fn(*pieces[0])
    except BaseException as e:  # noqa: BLE001 - collected and re-raised below
        errs.append(e)
    for f in futs:
        try:
            f.result()
        except BaseException as e:  # noqa: BLE001
            errs.append(e)
    if errs:
        raise errs[0]


def _tcp_piece(h: Handle, addr: str, local: int, remote_off: int, n: int, write: bool,
               dl: Deadline) -> None:
    with _Conn(h, addr, dl) as c:
        view = (ctypes.c_char * n).from_address(local)
        mv = memoryview(view).cast("B")
        if write:
            c.call(P.OP_WRITE, remote_off, n)  # OK: the server is ready to receive
            try:
                c.sock.settimeout(dl.remaining())
                c.sock.sendall(mv)
                status, body = P.recv_reply(c.sock)
            except socket.timeout:
                raise RDMATimeoutError(
                    f"{dl.what} did not complete within {dl.timeout:g} s "
                    "(the remote buffer may hold partial data)") from None
            except (P.ProtocolError, OSError) as e:
                raise c.lost(e) from None
            if status != P.ST_OK:
                raise _status_error(status, body, h)
        else:
            c.call(P.OP_READ, remote_off, n)  # OK: the bytes follow
            got = 0
            try:
                while got < n:
                    c.sock.settimeout(dl.remaining())
                    k = c.sock.recv_into(mv[got:], n - got)
                    if k == 0:
                        raise P.ProtocolError(f"closed after {got} of {n} bytes")
                    got += k
            except socket.timeout:
                raise RDMATimeoutError(
                    f"{dl.what} did not complete within {dl.timeout:g} s "
                    f"({got} of {n} bytes arrived)") from None
            except (P.ProtocolError, OSError) as e:
                raise c.lost(e) from None


def tcp_transfer(h: Handle, span_addr: int, nbytes: int, offset: int, write: bool,
                 dl: Deadline, same_host: bool) -> None:
    """Chunked transfer over dedicated data sockets, in parallel streams."""
    addr = _pick_address(h, same_host)
    pieces = split_pieces(nbytes, config.rdma_streams)
    run_pieces(pieces, lambda s, n: _tcp_piece(h, addr, span_addr + s, offset + s, n, write, dl))


# Why process_vm_* cannot be used here, once known (Yama mode 3 forbids it outright).
_vm_refused: Optional[str] = "Yama ptrace_scope is 3" if vm.ptrace_scope() == 3 else None


def vm_usable() -> bool:
    return vm.available() and _vm_refused is None


def vm_transfer(h: Handle, span_addr: int, nbytes: int, offset: int, write: bool,
                dl: Deadline) -> None:
    """Same-host copy: pin at the owner, process_vm_readv/writev, unpin (owner alive throughout)."""
    global _vm_refused
    if not process_alive(h.pid, h.start_time):
        raise _owner_gone(h, "no such process (or its pid now belongs to another process)")
    addr = _pick_address(h, True)
    with _Conn(h, addr, dl) as c:
        remote, _ = PIN_REPLY.unpack(c.call(P.OP_PIN, offset, nbytes))

        def piece(s: int, n: int) -> None:
            pos = 0
            while pos < n:
                dl.remaining()
                k = min(VM_CHUNK, n - pos)
                vm.copy(h.pid, span_addr + s + pos, remote + s + pos, k, write=write)
                pos += k

        try:
            run_pieces(split_pieces(nbytes, config.rdma_vm_threads), piece)
        except vm.VMError as e:
            if e.errno in (errno.EPERM, errno.EACCES, errno.ENOSYS):
                _vm_refused = str(e)
                c.call(P.OP_UNPIN)
                raise _VMRefused(str(e)) from None
            if e.errno == errno.ESRCH:
                raise _owner_gone(h, "process exited during the transfer") from None
            raise RDMATransportError(str(e)) from None
        # The pin reply showed the owner alive before the copy; the same process (same pid
        # and start time) is alive after it, so the pinned memory stayed valid throughout.
        # The unpin's reply is left for the connection's next user to read.
        if not process_alive(h.pid, h.start_time):
            raise _owner_gone(h, "process exited during the transfer")
        c.post(P.OP_UNPIN)


class _VMRefused(Exception):
    """process_vm_* is not permitted here; the caller falls back to sockets."""


def _pin_own(h: Handle) -> tuple[Registry, Entry]:
    """Pin a buffer of this very process in its registry, or raise why it cannot be: (the
    registry, to unpin it from, and the pinned entry)."""
    server = current_server()
    lk = server.registry.pin(h.buffer_id) if server is not None else None
    if server is None or lk is None or lk.entry is None:
        status = P.ST_DROPPED if lk is not None and lk.status == "dropped" else P.ST_UNKNOWN
        raise _status_error(status, b"", h)
    return server.registry, lk.entry


def local_transfer(h: Handle, span_addr: int, nbytes: int, offset: int, write: bool) -> None:
    """Owner and caller are one process: pin in the registry and memmove."""
    registry, entry = _pin_own(h)
    try:
        size = entry.span.nbytes
        if offset + nbytes > size:
            raise RDMASizeError(f"range [{offset}, {offset + nbytes}) outside buffer of {size} bytes")
        remote = entry.span.addr + offset
        if write:
            ctypes.memmove(remote, span_addr, nbytes)
        else:
            ctypes.memmove(span_addr, remote, nbytes)
    finally:
        registry.unpin(entry)


# ibverbs endpoints, one per owner address, each tied to its own data-server connection.
_ib_lock = threading.Lock()
_ib_peers: dict[str, tuple[IbvEndpoint, socket.socket]] = {}


def ib_transfer(h: Handle, span_addr: int, nbytes: int, offset: int, write: bool,
                dl: Deadline) -> None:
    """One-sided RDMA READ/WRITE through a queue pair set up over the data-server socket."""
    from . import ibverbs

    ctx = ibverbs.shared_context()
    if ctx is None:
        raise RDMATransportError("ibverbs requested but no RDMA device is usable in this process")
    addr = _pick_address(h, False)
    with _ib_lock:
        peer = _ib_peers.get(addr)
        if peer is not None and peer[0].broken:
            peer[0].close()
            peer[1].close()
            peer = None
        if peer is None:
            ep = ctx.create_endpoint()
            sock = _connect(h, addr, dl)
            c = _Conn.__new__(_Conn)
            c.h, c.addr, c.dl, c.sock, c.pending = h, addr, dl, sock, 0
            ep.connect(c.call(P.OP_IB_CONNECT, payload=ep.local_info()))
            peer = _ib_peers[addr] = (ep, sock)
    ep = peer[0]
    with _Conn(h, addr, dl) as c:
        remote, rkey = MR_REPLY.unpack(c.call(P.OP_IB_MR, offset, nbytes))
    mr = ctx.register(span_addr, nbytes, remote=False)
    try:
        ep.transfer(mr, span_addr, remote, rkey, nbytes, write=write, deadline=dl.at)
    finally:
        mr.close()


def drop_remote(h: Handle, timeout: float) -> None:
    """Ask the owner's data server to drop the buffer."""
    check_not_across_gateway(h)
    dl = Deadline(timeout, f"drop of buffer {h.buffer_id}")
    same = h.host_id == host_id()
    with _Conn(h, _pick_address(h, same), dl) as c:
        c.call(P.OP_DROP)


def owner_info(h: Handle, timeout: float = 5.0) -> tuple[int, int]:
    """(pid, start time) reported by the owner's data server."""
    dl = Deadline(timeout, "info request")
    with _Conn(h, _pick_address(h, h.host_id == host_id()), dl) as c:
        return INFO_REPLY.unpack(c.call(P.OP_INFO))


# -- CUDA memory ------------------------------------------------------------------------
def _ipc_key(h: Handle) -> tuple:
    return (h.host_id, h.pid, h.start_time, h.buffer_id)


def close_ipc(h: Handle, whole_owner: bool = False) -> int:
    """Close our CUDA IPC mapping of this buffer (or of all the owner's buffers)."""
    key = _ipc_key(h)
    if whole_owner:
        return cuda.ipc_cache.close(lambda k: k[:3] == key[:3])
    return cuda.ipc_cache.close(lambda k: k == key)


def ipc_transfer(h: Handle, span: Span, offset: int, write: bool, dl: Deadline) -> None:
    """Same host, owner's buffer in CUDA memory: map it once through its CUDA IPC handle,
    then copy device to device (or through pinned chunks for host memory on our side)."""
    import torch

    if not process_alive(h.pid, h.start_time):
        close_ipc(h, whole_owner=True)
        raise _owner_gone(h, "no such process (or its pid now belongs to another process)")
    device = (torch.device(span.device).index or 0) if span.is_cuda else torch.cuda.current_device()
    try:
        with _Conn(h, _pick_address(h, True), dl) as c:
            opened = cuda.ipc_cache.get(_ipc_key(h))
            if opened is None:
                payload = c.call(P.OP_CUDA_IPC)
                try:
                    opened = cuda.ipc_cache.open(_ipc_key(h), payload, device)
                except (RuntimeError, ValueError) as e:
                    raise RDMATransportError(
                        f"cannot open the CUDA IPC handle of buffer {h.buffer_id} "
                        f"({h.device} of pid {h.pid}) on cuda:{device}: {e} (the GPUs may "
                        "lack peer access; MONARCH_RDMA_TRANSPORT=tcp stages through host "
                        "memory)") from None
            c.call(P.OP_CUDA_PIN, offset, span.nbytes)  # pinned, its device idle
            flat, base = opened
            remote = flat[base + offset:base + offset + span.nbytes]
            if span.is_cuda:
                local = cuda.flat_u8(span.keepalive)[:span.nbytes]
                if write:
                    remote.copy_(local)
                else:
                    local.copy_(remote)
                torch.cuda.synchronize(remote.device)
                if local.device != remote.device:
                    torch.cuda.synchronize(local.device)
            elif write:
                cuda.host_to_device(remote, cuda.memmove_from(span.addr))
            else:
                cuda.device_to_host(remote, cuda.memmove_to(span.addr))
                torch.cuda.synchronize(remote.device)
            if not process_alive(h.pid, h.start_time):  # as for vm: alive throughout
                raise _owner_gone(h, "process exited during the transfer")
            c.post(P.OP_UNPIN)
    except RDMABufferDroppedError:
        close_ipc(h)
        raise
    except RDMAOwnerDiedError:
        close_ipc(h, whole_owner=True)
        raise


def _staged(span: Span, write: bool, move: Callable[[int, int, int], None]) -> None:
    """Our memory is CUDA memory, the transport moves host bytes: pipeline through pinned
    chunks. move(pinned_addr, n, pos) moves one chunk to/from the remote buffer."""
    dev = cuda.flat_u8(span.keepalive)[:span.nbytes]
    if write:
        cuda.device_to_host(dev, move)
    else:
        cuda.host_to_device(dev, move)


def local_cuda_transfer(h: Handle, span: Span, offset: int, write: bool) -> None:
    """Owner and caller are one process and one side is CUDA memory: a torch copy."""
    import torch

    registry, entry = _pin_own(h)
    try:
        own = entry.span
        if offset + span.nbytes > own.nbytes:
            raise RDMASizeError(f"range [{offset}, {offset + span.nbytes}) outside buffer of "
                                f"{own.nbytes} bytes")

        def as_u8(s: Span) -> Any:
            if isinstance(s.keepalive, torch.Tensor):
                return cuda.flat_u8(s.keepalive)
            return torch.frombuffer(view_of(s.addr, s.nbytes), dtype=torch.uint8)

        remote = as_u8(own)[offset:offset + span.nbytes]
        local = as_u8(span)[:span.nbytes]
        (remote if write else local).copy_(local if write else remote)
        for t in (remote, local):
            if t.is_cuda:
                torch.cuda.synchronize(t.device)
    finally:
        registry.unpin(entry)


# -- choosing ---------------------------------------------------------------------------
def choose(h: Handle, local_cuda: bool) -> str:
    """The transport to use for this owner: local, vm, cuda-ipc, ibverbs or tcp."""
    mode = transport_mode()
    same_host = h.host_id == host_id()
    remote_cuda = h.device.startswith("cuda")
    ib_ok = False
    gpudirect = remote_cuda and h.ib  # the owner registered its CUDA buffer with its NIC
    if not same_host and h.ib and mode == "auto":
        from . import ibverbs

        ib_ok = ibverbs.shared_context() is not None
    return choose_transport(
        mode=mode, same_process=same_host and h.pid == os.getpid(), same_host=same_host,
        remote_cuda=remote_cuda,
        cuda_here=same_host and remote_cuda and (local_cuda or cuda.cuda_usable()),
        vm_ok=vm_usable(), vm_refused=_vm_refused, ib_ok=ib_ok, gpudirect=gpudirect,
        where=f"buffer {h.buffer_id} ({h.device} of pid {h.pid})")


def _host_move(kind: str, h: Handle, addr: int, nbytes: int, offset: int, write: bool,
               dl: Deadline, same_host: bool) -> str:
    """Move host bytes at `addr` by `kind` (vm falls back to tcp when refused); the kind used."""
    if kind == "vm":
        try:
            vm_transfer(h, addr, nbytes, offset, write, dl)
            return "vm"
        except _VMRefused as e:
            log.warning("rdma: process_vm_readv/writev refused (%s; ptrace_scope=%s); "
                        "falling back to data sockets for same-host transfers", e, vm.ptrace_scope())
            kind = "tcp"
    if kind == "ibverbs":
        ib_transfer(h, addr, nbytes, offset, write, dl)
    else:
        tcp_transfer(h, addr, nbytes, offset, write, dl, same_host)
    return kind


def check_not_across_gateway(h: Handle) -> None:
    """Fail at once, saying why, where the data path would cross a gateway (docs/multihost.md):
    a gateway relays messages, not RDMA data, and the owner's data server cannot be dialed."""
    if h.host_id == host_id():
        return
    from ..transport.gateway import client_gateways

    marked = [a[len("gateway:"):] for a in h.addresses if a.startswith("gateway:")]
    if marked:
        where = (f"belongs to a process outside the cluster ({h.hostname}) that reaches it "
                 f"through the gateway {marked[0]}")
    elif client_gateways():
        where = (f"lives on {h.hostname}, in the cluster this process reaches through the "
                 f"gateway {client_gateways()[0]}")
    else:
        return
    raise RDMATransportError(
        f"RDMABuffer {h.buffer_id} {where}: a gateway relays messages, not RDMA data, so it "
        "cannot be read or written from here; pass the data in a message (an endpoint's "
        "argument or return value) instead")


def transfer(h: Handle, span: Span, offset: int, write: bool, timeout: float) -> str:
    """Move span.nbytes between the local span and the remote [offset, ...); returns the transport."""
    check_not_across_gateway(h)
    what = f"RDMABuffer.{'write_from' if write else 'read_into'} ({span.nbytes} bytes, buffer {h.buffer_id})"
    dl = Deadline(timeout, what)
    kind = choose(h, local_cuda=span.is_cuda)
    same_host = h.host_id == host_id()
    if kind == "local":
        if span.is_cuda or h.device != "cpu":
            local_cuda_transfer(h, span, offset, write)
        else:
            local_transfer(h, span.addr, span.nbytes, offset, write)
        return kind
    if kind == "cuda-ipc":
        ipc_transfer(h, span, offset, write, dl)
        return kind
    if not span.is_cuda:
        return _host_move(kind, h, span.addr, span.nbytes, offset, write, dl, same_host)
    if kind == "ibverbs" and config.rdma_gpudirect:  # our CUDA memory straight to the NIC
        import torch

        torch.cuda.synchronize(torch.device(span.device))
        ib_transfer(h, span.addr, span.nbytes, offset, write, dl)
        return "ibverbs+gpudirect"
    used = [kind]

    def move(addr: int, n: int, pos: int) -> None:
        used[0] = _host_move(kind, h, addr, n, offset + pos, write, dl, same_host)

    _staged(span, write, move)
    return used[0] + "+cuda-staged"


def _after_fork() -> None:
    global _pool, _streams, _ib_lock, _ib_peers
    _pool = _Pool()
    _streams = ThreadPoolExecutor(max_workers=16, thread_name_prefix="rdma-stream")
    _ib_lock = threading.Lock()
    _ib_peers = {}


os.register_at_fork(after_in_child=_after_fork)
