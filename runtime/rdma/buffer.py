"""RDMABuffer: a small picklable handle to memory in one process, readable and writable by others."""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from ..config import config
from .._base.context import get_context
from ..future import Future
from . import client, ibverbs
from .errors import RDMASizeError
from .handle import Handle
from .identity import host_id, process_start_time, session_secret
from .memory import check_dtype, span_of
from .server import get_server

__all__ = [
    "DEFAULT_TIMEOUT", "RDMAOwner", "RDMABuffer", "get_rdma_backend", "is_ibverbs_available",
    "is_rdma_available", "RDMAAction", "read_ipc", "close_ipc",
]

DEFAULT_TIMEOUT = 3.0  # seconds, as in Monarch

_executor: Optional[ThreadPoolExecutor] = None
_executor_lock = threading.Lock()


def _submit(fn, label: str, fut: Optional[Future] = None) -> Future:
    """Run fn() on a transfer thread; its result or error resolves the returned Future."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="rdma-transfer")
        ex = _executor
    if fut is None:
        fut = Future(label)

    def run() -> None:
        try:
            fut.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - every failure must reach the caller
            fut.set_exception(e)

    ex.submit(run)
    return fut


class _Deferred(Future):
    """A transfer's Future that starts it when first waited on (`get()`, `await`, a done
    callback), as Monarch's do: two transfers run in the order they are waited on."""

    __slots__ = ("_start",)

    def __init__(self, label: str, start: Callable[[Future], None]) -> None:
        super().__init__(label)
        self._start: Optional[Callable[[Future], None]] = start

    def _begin(self) -> None:
        with self._lock:
            start, self._start = self._start, None
        if start is not None:
            start(self)

    def get(self, timeout: Optional[float] = None) -> Any:
        self._begin()
        return super().get(timeout)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        self._begin()
        return super().exception(timeout)

    def add_done_callback(self, fn: Callable[[Future], None]) -> None:
        self._begin()
        super().add_done_callback(fn)

    def __await__(self) -> Any:
        self._begin()
        return (yield from super().__await__())


def _deferred(fn: Callable[[], Any], label: str) -> Future:
    """A Future of fn() run on a transfer thread once the Future is waited on."""
    def start(fut: Future) -> None:
        _submit(fn, label, fut)

    return _Deferred(label, start)


@dataclass(frozen=True)
class RDMAOwner:
    """Where a buffer lives: process, host and (inside an actor) the actor's name."""

    pid: int
    hostname: str
    actor: Optional[str] = None

    def __str__(self) -> str:
        who = f"{self.actor} " if self.actor else ""
        return f"{who}(pid {self.pid} on {self.hostname})"


def _current_actor_name() -> Optional[str]:
    """The calling actor's name when made inside an endpoint (None in a controller)."""
    ctx = get_context()  # set only on actor threads
    if ctx is None:
        return None
    coords = ",".join(f"{k}={v}" for k, v in dict(ctx.rank).items())
    return f"{ctx.actor_id}{{{coords}}}" if coords else ctx.actor_id


class RDMABuffer:
    """A handle to a 1-D contiguous tensor or writable memoryview, shared without copying.

    Pickle it into a message; receivers call read_into / write_from; the owner's data server
    moves the bytes on its own thread and sockets (or process_vm_* / ibverbs)."""

    __slots__ = ("_h", "last_transport", "__weakref__")

    def __init__(self, data: Union["Any", memoryview]) -> None:
        span = span_of(data, what="RDMABuffer data", need_writable=True)
        server = get_server()
        entry = server.registry.add(span)
        secret, from_env = session_secret()
        ib = False
        if (span.device == "cpu" or config.rdma_gpudirect) and \
                _transport_or_none() in ("auto", "ibverbs"):
            ib = server.ib_context() is not None
        self._h = Handle(
            pid=os.getpid(), start_time=process_start_time(os.getpid()) or 0, host_id=host_id(),
            hostname=socket.gethostname(), buffer_id=entry.buffer_id, addr=span.addr,
            size=span.nbytes, dtype=span.dtype, device=span.device,
            addresses=tuple(server.addresses), secret=None if from_env else secret, ib=ib,
            actor=_current_actor_name())
        self.last_transport: Optional[str] = None

    # -- pickling: only the handle travels --------------------------------------------
    def __reduce__(self) -> Any:
        from ..transport.gateway import client_gateways

        gws = client_gateways()
        if gws and self._h.pid == os.getpid():  # our TCP data server is not reachable there
            h = self._h
            return (_rebuild, (dataclasses.replace(h, addresses=tuple(
                a for a in h.addresses if not a.startswith("tcp:")) + (f"gateway:{gws[0]}",)),))
        return (_rebuild, (self._h,))

    # -- queries -------------------------------------------------------------------------
    def size(self) -> int:
        """Size of the remote buffer in bytes."""
        return self._h.size

    @property
    def owner(self) -> RDMAOwner:
        """The process (and actor, if any) whose memory this buffer is."""
        return RDMAOwner(self._h.pid, self._h.hostname, self._h.actor)

    @property
    def dtype(self) -> Optional[str]:
        """The owner tensor's dtype name (None for a memoryview)."""
        return self._h.dtype

    def __repr__(self) -> str:
        return (f"RDMABuffer(size={self._h.size}, dtype={self._h.dtype}, device={self._h.device}, "
                f"owner={self.owner}, id={self._h.buffer_id})")

    # -- transfers -----------------------------------------------------------------------
    def _check(self, local: Any, what: str, offset: int, is_read: bool, timeout: float):
        """The local span a transfer moves; at offset 0 Monarch's rule: a read fills the
        first remote-size bytes of a local buffer at least that large, a write gives the
        whole of a local buffer at most that large (into the remote buffer's first bytes)."""
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        span = span_of(local, what=what, need_writable=is_read)
        check_dtype(span, self._h.dtype, what)
        if not isinstance(offset, int) or offset < 0:
            raise RDMASizeError(f"offset must be a non-negative int, got {offset!r}")
        if offset == 0 and is_read and span.nbytes > self._h.size:
            span = dataclasses.replace(span, nbytes=self._h.size)
        if offset == 0 and is_read and span.nbytes < self._h.size:
            raise RDMASizeError(
                f"{what} has {span.nbytes} bytes, fewer than the remote buffer's "
                f"{self._h.size}; pass offset= to read a sub-range")
        if offset == 0 and not is_read and span.nbytes > self._h.size:
            raise RDMASizeError(
                f"{what} has {span.nbytes} bytes, more than the remote buffer's "
                f"{self._h.size}; write a slice of it (src[:n])")
        if offset + span.nbytes > self._h.size:
            raise RDMASizeError(
                f"{what} of {span.nbytes} bytes at offset {offset} overruns the remote buffer "
                f"of {self._h.size} bytes")
        return span

    def read_into(self, dst: Any, *, offset: int = 0, timeout: float = DEFAULT_TIMEOUT) -> Future:
        """Copy the remote bytes [offset, offset+dst.nbytes) into `dst`; Future of the byte count.
        A `dst` larger than the remote buffer (offset 0) receives the remote buffer's size."""
        span = self._check(dst, "read_into destination", offset, True, timeout)

        def run() -> int:
            self.last_transport = client.transfer(self._h, span, offset, False, timeout)
            return span.nbytes

        return _deferred(run, "RDMABuffer.read_into")

    def write_from(self, src: Any, *, offset: int = 0, timeout: float = DEFAULT_TIMEOUT) -> Future:
        """Copy `src` into the remote bytes [offset, offset+src.nbytes); Future of the byte count.
        A `src` smaller than the remote buffer fills its first bytes; a larger one is refused."""
        span = self._check(src, "write_from source", offset, False, timeout)

        def run() -> int:
            self.last_transport = client.transfer(self._h, span, offset, True, timeout)
            return span.nbytes

        return _deferred(run, "RDMABuffer.write_from")

    def drop(self, *, timeout: float = DEFAULT_TIMEOUT) -> Future:
        """Release the owner's reference; later reads and writes fail with RDMABufferDroppedError."""
        h = self._h
        if h.pid == os.getpid() and h.host_id == host_id():
            server = get_server()
            server.registry.drop(h.buffer_id)
            fut: Future = Future("RDMABuffer.drop")
            fut.set_result(None)
            return fut
        client.close_ipc(h)  # our CUDA IPC mapping of it, if any, goes now
        return _submit(lambda: client.drop_remote(h, timeout), "RDMABuffer.drop")

    def wait_dropped(self, timeout: float) -> bool:
        """In the owner's process: wait up to `timeout` seconds until the buffer is dropped
        (by a reader that drops what it has read, or `drop()`); whether it is. Elsewhere
        ValueError."""
        h = self._h
        if h.pid != os.getpid() or h.host_id != host_id():
            raise ValueError("wait_dropped() waits in the process that owns the buffer")
        return get_server().registry.wait_dropped(h.buffer_id, timeout)

    def transport(self) -> str:
        """The transport a transfer from this process to this buffer would use now."""
        return client.choose(self._h, local_cuda=False)


def _rebuild(h: Handle) -> RDMABuffer:
    buf = RDMABuffer.__new__(RDMABuffer)
    buf._h = h
    buf.last_transport = None
    return buf


def _transport_or_none() -> Optional[str]:
    """config.rdma_transport, or None when MONARCH_RDMA_TRANSPORT is bad (a transfer says so)."""
    try:
        return config.rdma_transport
    except ValueError:
        return None


def get_rdma_backend(buffer: Optional[RDMABuffer] = None) -> str:
    """Name the transport in use: for `buffer`, the one that reaches it from here; otherwise this
    process's cross-host transport ("ibverbs" or "tcp")."""
    if buffer is not None:
        return buffer.transport()
    mode = client.transport_mode()
    if mode != "auto":
        return mode
    return "ibverbs" if ibverbs.shared_context() is not None else "tcp"


def is_ibverbs_available() -> bool:
    """True when our ibverbs backend can open a device here (Monarch's name; the other
    transports, process_vm and TCP, are always available)."""
    return ibverbs.shared_context() is not None


def is_rdma_available() -> bool:
    """True when an ibverbs device is usable here (= is_ibverbs_available(), Monarch's older name)."""
    return is_ibverbs_available()


def _after_fork() -> None:
    global _executor, _executor_lock
    _executor = None
    _executor_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


class RDMAAction:
    """A batch of reads and writes submitted together (`submit()`): the transfers run in
    parallel on the transfer threads and one Future resolves when all are done. Each is
    checked when queued (sizes, dtypes); a local range written by two reads is refused.
    The batch stays queued: each `submit()` runs it again (as in Monarch)."""

    def __init__(self) -> None:
        self._ops: list = []  # (buffer, span, is_write)
        self._written: list = []  # (start, end) of local ranges reads write into

    def _add(self, buf: RDMABuffer, local: Any, is_write: bool) -> "RDMAAction":
        if not isinstance(buf, RDMABuffer):
            raise TypeError(f"expected an RDMABuffer, got {type(buf).__name__}")
        what = "write_from source" if is_write else "read_into destination"
        span = buf._check(local, what, 0, not is_write, DEFAULT_TIMEOUT)
        if not is_write:
            start, end = span.addr, span.addr + span.nbytes
            for s0, e0 in self._written:
                if start < e0 and s0 < end:
                    raise ValueError("RDMAAction: two reads in one batch write the same local "
                                     "memory")
            self._written.append((start, end))
        self._ops.append((buf, span, is_write))
        return self

    def read_into(self, src: RDMABuffer, dst: Any) -> "RDMAAction":
        """Queue a read of remote buffer `src` into local memory `dst`."""
        return self._add(src, dst, False)

    def write_from(self, dst: RDMABuffer, src: Any) -> "RDMAAction":
        """Queue a write of local memory `src` into remote buffer `dst`."""
        return self._add(dst, src, True)

    def read_remote(self, dst: Any, src: RDMABuffer) -> "RDMAAction":
        """Queue a read of remote buffer `src` into local `dst` (Monarch's newer name)."""
        return self._add(src, dst, False)

    def write_remote(self, dst: RDMABuffer, src: Any) -> "RDMAAction":
        """Queue a write of local `src` into remote buffer `dst` (Monarch's newer name)."""
        return self._add(dst, src, True)

    def submit(self, timeout: float = DEFAULT_TIMEOUT) -> Future:
        """Run every queued transfer (again, on a later call) once the returned Future is
        waited on, as Monarch's; a Future of None, or of the first transfer's error."""
        ops = list(self._ops)

        def one(buf: RDMABuffer, span: Any, is_write: bool) -> int:
            buf.last_transport = client.transfer(buf._h, span, 0, is_write, timeout)
            return span.nbytes

        def start(out: Future) -> None:
            if not ops:
                out.set_result(None)
                return
            left = [len(ops)]
            lock = threading.Lock()

            def done(f: Future) -> None:
                exc = f.exception(0)
                with lock:
                    left[0] -= 1
                    last = left[0] == 0
                    if exc is not None and not out.done():
                        out.set_exception(exc)
                        return
                if last and not out.done():
                    out.set_result(None)

            for buf, span, is_write in ops:
                _submit(lambda b=buf, s=span, w=is_write: one(b, s, w),
                        "RDMAAction transfer").add_done_callback(done)

        return _Deferred("RDMAAction.submit", start)


def read_ipc(buf: RDMABuffer, out: Any, timeout: float) -> None:
    """Pull a CUDA-IPC exported buffer into the tensor `out` (runtime.transport.cuda_tensors)."""
    client.transfer(buf._h, span_of(out, what="received CUDA tensor", need_writable=True),
                    0, False, timeout)


def close_ipc(buf: RDMABuffer) -> None:
    """Close our mapping of a one-shot CUDA-IPC buffer (runtime.transport.cuda_tensors)."""
    client.close_ipc(buf._h)
