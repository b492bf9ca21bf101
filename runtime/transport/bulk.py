"""Messages over the size limit travel over the data plane instead of failing.

When a call's arguments or an endpoint's result pickle to more than `max_message_bytes`,
the largest out-of-band buffers (the bytes of numpy arrays and CPU tensors) are exported as
`RDMABuffer`s and the message carries only their handles: the body becomes

    MAGIC | 8-byte manifest length | manifest (pickled [(index, RDMABuffer), ...], drop flag)
          | the original pickle body

with those buffers left empty. The receiver reads each one (process_vm_readv on the same
host, the TCP data streams across hosts) before unpickling, so the handler or the caller
sees ordinary arrays and tensors. The sender keeps the bytes until the receivers are done:
a caller until its call's futures resolve, a proc until the caller has read (the caller
drops each buffer after reading it)."""

from __future__ import annotations

import pickle
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Sequence

from .._base import features as _features

__all__ = [
    "MAGIC", "READ_TIMEOUT", "Held", "offload", "release", "is_bulk", "materialize", "discard",
    "submit",
]

MAGIC = b"\x00MNBULK1"  # no pickle starts with a zero byte
READ_TIMEOUT = 600.0
_pool: Optional[ThreadPoolExecutor] = None
_pool_lock = threading.Lock()


class Held:
    """A buffer exported for one message: `drop()` releases it (idempotent)."""

    __slots__ = ("buf", "view")

    def __init__(self, buf: Any, view: memoryview) -> None:
        self.buf: Any = buf
        self.view: Optional[memoryview] = view

    def drop(self) -> None:
        buf, self.buf, self.view = self.buf, None, None
        if buf is not None:
            buf.drop()


def _nbytes(b: Any) -> int:
    return memoryview(b).nbytes


def offload(body: bytes, bufs: Sequence[Any], limit: int,
            drop_on_read: bool) -> Optional[tuple[bytes, list, list[Held]]]:
    """(body, buffers, held) with the largest buffers exported until the message fits in
    `limit` bytes, or None if it cannot fit that way (its pickle body alone is too large)."""
    total = len(body) + sum(_nbytes(b) for b in bufs)
    out = list(bufs)
    held: list[Held] = []
    manifest: list[tuple[int, Any]] = []
    try:
        for i in sorted(range(len(out)), key=lambda j: -_nbytes(out[j])):
            if total + 512 * (len(manifest) + 1) <= limit:
                break
            view = memoryview(out[i]).cast("B")
            if view.readonly:  # the data server needs a writable span: one copy
                view = memoryview(bytearray(view))
            buf = _features.call("rdma.buffer", view)  # the data plane is above the transport
            held.append(Held(buf, view))
            manifest.append((i, buf))
            total -= view.nbytes
            out[i] = b""
        head = pickle.dumps((manifest, drop_on_read), 5)
        if total + len(head) + len(MAGIC) + 8 > limit:
            release(held)
            return None
    except BaseException:
        release(held)
        raise
    return MAGIC + struct.pack("<Q", len(head)) + head + bytes(body), out, held


def release(held: list) -> None:
    """Drop what `offload` exported (each receiver has read it, or will never)."""
    while held:
        try:
            held.pop().drop()
        except Exception:  # noqa: BLE001 - the process or buffer is gone already
            pass


def is_bulk(body: Any) -> bool:
    """Whether a received body came through `offload` (cheap: called for every reply)."""
    if type(body) is bytes:
        return body.startswith(MAGIC)
    try:
        return bytes(memoryview(body)[:len(MAGIC)]) == MAGIC
    except TypeError:
        return False


def _manifest(body: Any) -> tuple[list, bool, memoryview]:
    """A received bulk body's parts: its manifest, whether the receiver drops what it
    reads, and the original pickle body."""
    mv = memoryview(body)
    n = struct.unpack("<Q", mv[len(MAGIC):len(MAGIC) + 8])[0]
    start = len(MAGIC) + 8
    manifest, drop_on_read = pickle.loads(mv[start:start + n])
    return manifest, drop_on_read, mv[start + n:]


def _drop(manifest: list) -> None:
    for _, buf in manifest:
        try:
            buf.drop()
        except Exception:  # noqa: BLE001 - the sender is gone: nothing to free
            pass


def materialize(body: Any, buffers: Sequence[Any]) -> tuple[memoryview, list]:
    """Read the exported buffers of a received message; (the pickle body, buffers)."""
    manifest, drop_on_read, rest = _manifest(body)
    out = list(buffers)
    try:
        for i, buf in manifest:
            dst = _empty(buf.size())
            buf.read_into(memoryview(dst), timeout=READ_TIMEOUT).get(timeout=READ_TIMEOUT + 5)
            out[i] = dst
    finally:
        if drop_on_read:
            _drop(manifest)
    return rest, out


def discard(body: Any) -> None:
    """A received bulk message nobody will read (its call ended, its port is closed): drop
    its exported buffers, off the I/O thread, so the sender stops holding them (a proc's
    actor waits until its answer is taken)."""
    def drop() -> None:
        manifest, drop_on_read, _ = _manifest(body)
        if drop_on_read:
            _drop(manifest)

    submit(drop)


def _empty(n: int) -> Any:
    """A writable buffer of n bytes, not zero-filled where numpy is there."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        return bytearray(n)
    return np.empty(n, dtype=np.uint8)


def submit(fn: Callable[[], None]) -> None:
    """Run `fn` off the I/O thread (reading a large reply must not stall it)."""
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="bulk-reader")
    _pool.submit(fn)
