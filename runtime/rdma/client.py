"""The caller's side of a transfer: picks a transport per owner and moves the bytes.

Runs in transfer threads (never in an actor's endpoint code); raises RDMAError subclasses."""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from ..config import config
from . import protocol as P
from . import vm
from .errors import (RDMAAuthError, RDMABufferDroppedError, RDMAError, RDMAOwnerDiedError,
                     RDMASizeError, RDMATimeoutError, RDMATransportError)
from .handle import Handle
from .identity import host_id, process_alive, session_secret
from .memory import Span
from .server import INFO_REPLY, MR_REPLY, PIN_REPLY, current_server

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
    replies still to read from it (acknowledgements we chose not to wait for)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[str, list[tuple[socket.socket, int]]] = {}

    def take(self, addr: str) -> Optional[tuple[socket.socket, int]]:
        with self._lock:
            socks = self._idle.get(addr)
            return socks.pop() if socks else None

    def give(self, addr: str, sock: socket.socket, pending: int = 0) -> None:
        with self._lock:
            self._idle.setdefault(addr, []).append((sock, pending))

    def discard(self, addr: str) -> None:
        with self._lock:
            for s, _ in self._idle.pop(addr, []):
                s.close()


_pool = _Pool()


def _owner_gone(h: Handle, detail: str) -> RDMAOwnerDiedError:
    return RDMAOwnerDiedError(
        f"the owner of buffer {h.buffer_id} (pid {h.pid} on {h.hostname}) is gone: {detail}")


def _connect(h: Handle, addr: str, dl: Deadline) -> socket.socket:
    kind, _, rest = addr.partition(":")
    try:
        if kind == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(dl.remaining())
            sock.connect(rest)
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
    except P.HandshakeRejected as e:
        sock.close()
        raise RDMAAuthError(f"data server at {addr} rejected us: {e}") from None
    except P.ProtocolError as e:  # closed before its greeting: a dying owner, or not ours
        sock.close()
        if h.host_id == host_id() and _wait_gone(h):
            raise _owner_gone(h, "process exited while we connected") from None
        raise RDMATransportError(f"data server at {addr} closed the connection: {e}") from None
    except socket.timeout:
        sock.close()
        raise RDMATimeoutError(f"authenticating with the data server at {addr} timed out") from None
    except OSError as e:
        sock.close()
        raise _owner_gone(h, f"connection lost during authentication ({e})") from None
    # The address may have been reused by a later process: make sure it is still the owner.
    try:
        P.send_request(sock, P.OP_INFO)
        status, body = P.recv_reply(sock)
        pid, start = INFO_REPLY.unpack(body) if status == P.ST_OK else (-1, -1)
    except (P.ProtocolError, OSError, struct.error) as e:
        sock.close()
        raise RDMATransportError(f"data server at {addr} failed its identity check: {e}") from None
    if (pid, start) != (h.pid, h.start_time):
        sock.close()
        raise _owner_gone(h, f"its data-server address now belongs to pid {pid}")
    return sock


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


def _split(nbytes: int, parts: int) -> list[tuple[int, int]]:
    """Cut [0, nbytes) into `parts` page-aligned (start, length) pieces."""
    parts = max(1, min(parts, nbytes // MIN_STREAM_BYTES))
    step = -(-nbytes // parts)
    step = -(-step // 4096) * 4096
    return [(s, min(step, nbytes - s)) for s in range(0, nbytes, step)]


def _parallel(pieces: list[tuple[int, int]], fn: Callable[[int, int], None]) -> None:
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
    pieces = _split(nbytes, config.rdma_streams)
    _parallel(pieces, lambda s, n: _tcp_piece(h, addr, span_addr + s, offset + s, n, write, dl))


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
            _parallel(_split(nbytes, config.rdma_vm_threads), piece)
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


def local_transfer(h: Handle, span_addr: int, nbytes: int, offset: int, write: bool) -> None:
    """Owner and caller are one process: pin in the registry and memmove."""
    server = current_server()
    lk = server.registry.pin(h.buffer_id) if server is not None else None
    if lk is None or lk.entry is None:
        status = P.ST_DROPPED if lk is not None and lk.status == "dropped" else P.ST_UNKNOWN
        raise _status_error(status, b"", h)
    try:
        size = lk.entry.span.nbytes
        if offset + nbytes > size:
            raise RDMASizeError(f"range [{offset}, {offset + nbytes}) outside buffer of {size} bytes")
        remote = lk.entry.span.addr + offset
        if write:
            ctypes.memmove(remote, span_addr, nbytes)
        else:
            ctypes.memmove(span_addr, remote, nbytes)
    finally:
        server.registry.unpin(lk.entry)  # type: ignore[union-attr]


# ibverbs endpoints, one per owner address, each tied to its own data-server connection.
_ib_lock = threading.Lock()
_ib_peers: dict[str, tuple[object, socket.socket]] = {}


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
        if peer is not None and getattr(peer[0], "broken", False):
            peer[0].close()  # type: ignore[attr-defined]
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
        ep.transfer(mr, span_addr, remote, rkey, nbytes, write=write, deadline=dl.at)  # type: ignore[attr-defined]
    finally:
        mr.close()


def drop_remote(h: Handle, timeout: float) -> None:
    """Ask the owner's data server to drop the buffer."""
    dl = Deadline(timeout, f"drop of buffer {h.buffer_id}")
    same = h.host_id == host_id()
    with _Conn(h, _pick_address(h, same), dl) as c:
        c.call(P.OP_DROP)


def owner_info(h: Handle, timeout: float = 5.0) -> tuple[int, int]:
    """(pid, start time) reported by the owner's data server."""
    dl = Deadline(timeout, "info request")
    with _Conn(h, _pick_address(h, h.host_id == host_id()), dl) as c:
        return INFO_REPLY.unpack(c.call(P.OP_INFO))


# -- choosing ---------------------------------------------------------------------------
def choose(h: Handle, local_cuda: bool) -> str:
    """The transport to use for this owner: local, vm, ibverbs or tcp."""
    mode = transport_mode()
    same_host = h.host_id == host_id()
    if same_host and h.pid == os.getpid() and mode == "auto" and h.device == "cpu":
        return "local"
    if mode == "vm":
        if not same_host:
            raise RDMAError("transport 'vm' requested but the buffer's owner is on another host")
        if not vm_usable():
            raise RDMAError(f"transport 'vm' requested but process_vm_readv is refused: {_vm_refused}")
        return "vm"
    if mode == "ibverbs":
        return "ibverbs"
    if mode == "tcp":
        return "tcp"
    if same_host and h.device == "cpu" and vm_usable():
        return "vm"
    if not same_host and h.ib:
        from . import ibverbs

        if ibverbs.shared_context() is not None:
            return "ibverbs"
    return "tcp"


def transfer(h: Handle, span: Span, offset: int, write: bool, timeout: float) -> str:
    """Move span.nbytes between the local span and the remote [offset, ...); returns the transport."""
    what = f"RDMABuffer.{'write_from' if write else 'read_into'} ({span.nbytes} bytes, buffer {h.buffer_id})"
    dl = Deadline(timeout, what)
    if span.is_cuda:
        return _staged(h, span, offset, write, timeout)
    kind = choose(h, local_cuda=False)
    same_host = h.host_id == host_id()
    if kind == "local":
        local_transfer(h, span.addr, span.nbytes, offset, write)
    elif kind == "vm":
        try:
            vm_transfer(h, span.addr, span.nbytes, offset, write, dl)
        except _VMRefused as e:
            log.warning("rdma: process_vm_readv/writev refused (%s; ptrace_scope=%s); "
                        "falling back to data sockets for same-host transfers", e, vm.ptrace_scope())
            kind = "tcp"
            tcp_transfer(h, span.addr, span.nbytes, offset, write, dl, same_host)
    elif kind == "ibverbs":
        ib_transfer(h, span.addr, span.nbytes, offset, write, dl)
    else:
        tcp_transfer(h, span.addr, span.nbytes, offset, write, dl, same_host)
    return kind


def _staged(h: Handle, span: Span, offset: int, write: bool, timeout: float) -> str:
    """A CUDA tensor on our side: move through a host copy (no GPUDirect here)."""
    import torch

    dev = span.keepalive
    host = torch.empty(span.nbytes, dtype=torch.uint8)
    hs = Span(host.data_ptr(), span.nbytes, host, None, "cpu")
    if write:
        host.copy_(dev.view(torch.uint8))
        return transfer(h, hs, offset, True, timeout) + "+cuda-staged"
    kind = transfer(h, hs, offset, False, timeout)
    dev.view(torch.uint8).copy_(host)
    torch.cuda.synchronize(dev.device)
    return kind + "+cuda-staged"


def _after_fork() -> None:
    global _pool, _streams, _ib_lock, _ib_peers
    _pool = _Pool()
    _streams = ThreadPoolExecutor(max_workers=16, thread_name_prefix="rdma-stream")
    _ib_lock = threading.Lock()
    _ib_peers = {}


os.register_at_fork(after_in_child=_after_fork)
