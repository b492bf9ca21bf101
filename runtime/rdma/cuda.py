"""CUDA memory on the data plane: CUDA IPC handles (the storage sharing torch.multiprocessing
uses), their per-buffer cache in readers, and pinned-buffer pipelines between host
transfers and device copies. torch is imported lazily: CPU-only processes never load CUDA."""

from __future__ import annotations

import ctypes
import json
import threading
from typing import Any, Callable, Optional

__all__ = [
    "STAGE", "export_ipc", "decode_ipc", "IpcCache", "ipc_cache", "pinned", "device_to_host",
    "host_to_device", "memmove_to", "memmove_from", "flat_u8", "cuda_usable",
]

STAGE = 16 << 20  # bytes per pinned staging chunk (two in flight)
_export_lock = threading.Lock()


# -- the owner's side: export --------------------------------------------------------------
def export_ipc(tensor: Any, addr: int) -> bytes:
    """A JSON description of the CUDA IPC handle of `tensor`'s allocation, and where the
    buffer at device address `addr` starts in it. Each call adds one reference that the
    reader's open mapping releases when closed (torch's producer-side ref counter)."""
    storage = tensor.untyped_storage()
    with _export_lock:  # sharing swaps the storage's data pointer: one thread at a time
        (device, handle, size, offset, ref_handle, ref_offset, event_handle,
         _event_sync) = storage._share_cuda_()
    return json.dumps({
        "device": int(device), "handle": bytes(handle).hex(), "size": int(size),
        "offset": int(offset), "ref": bytes(ref_handle).hex(), "ref_offset": int(ref_offset),
        "event": bytes(event_handle).hex() if event_handle else "",
        "buf_offset": int(addr - storage.data_ptr()),
    }).encode()


def decode_ipc(payload: bytes) -> dict:
    """The fields of `export_ipc`'s JSON, bytes restored; ValueError on anything else."""
    d = json.loads(payload.decode())
    want = {"device": int, "handle": str, "size": int, "offset": int, "ref": str,
            "ref_offset": int, "buf_offset": int}
    for k, t in want.items():
        if not isinstance(d.get(k), t):
            raise ValueError(f"CUDA IPC description lacks {k!r}")
    return {**d, "handle": bytes.fromhex(d["handle"]), "ref": bytes.fromhex(d["ref"]),
            "event": bytes.fromhex(d["event"]) if d.get("event") else b""}


# -- the reader's side: open once per buffer ------------------------------------------------
class IpcCache:
    """Opened IPC mappings by (host id, pid, start time, buffer id): a uint8 tensor over the
    owner's allocation and the buffer's offset in it. Closing = dropping the tensor."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[tuple, tuple[Any, int]] = {}

    def get(self, key: tuple) -> Optional[tuple[Any, int]]:
        with self._lock:
            return self._open.get(key)

    def open(self, key: tuple, payload: bytes, device: int) -> tuple[Any, int]:
        """Map the owner's allocation on our `device` (peer access when it is another GPU)."""
        import torch

        d = decode_ipc(payload)
        with self._lock:
            if key in self._open:  # another thread opened it meanwhile: release our ref
                torch.UntypedStorage._release_ipc_counter(d["ref"], d["ref_offset"],
                                                          device=device)
                return self._open[key]
            storage = torch.UntypedStorage._new_shared_cuda(
                device, d["handle"], d["size"], d["offset"], d["ref"], d["ref_offset"],
                d["event"], False)  # not waited on: the owner synchronises its device when pinned
            flat = torch.empty(0, dtype=torch.uint8, device=f"cuda:{device}")
            flat.set_(storage, 0, (d["size"],), (1,))
            self._open[key] = (flat, d["buf_offset"])
            return self._open[key]

    def close(self, match: Callable[[tuple], bool]) -> int:
        """Close the mappings whose key matches; returns how many."""
        with self._lock:
            gone = [k for k in self._open if match(k)]
            for k in gone:
                del self._open[k]
        return len(gone)

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)


ipc_cache = IpcCache()


# -- pinned pipelines -----------------------------------------------------------------------
def _pieces(n: int, chunk: int) -> list[tuple[int, int]]:
    return [(p, min(chunk, n - p)) for p in range(0, n, chunk)]


def pinned(nbytes: int) -> Any:
    """A page-locked host buffer (torch's caching host allocator reuses them)."""
    import torch

    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def device_to_host(dev: Any, consume: Callable[[int, int, int], None],
                   chunk: int = STAGE) -> None:
    """Copy 1-D uint8 CUDA tensor `dev` out through two pinned buffers: consume(addr, n,
    pos) gets each chunk's pinned address while the next chunk's device copy runs."""
    import torch

    pieces = _pieces(dev.numel(), chunk)
    if not pieces:
        return
    bufs = [pinned(min(chunk, dev.numel())) for _ in range(min(2, len(pieces)))]
    stream = torch.cuda.Stream(device=dev.device)
    stream.wait_stream(torch.cuda.current_stream(dev.device))
    events: list = [None, None]

    def issue(i: int) -> None:
        p, k = pieces[i]
        with torch.cuda.stream(stream):
            bufs[i % 2][:k].copy_(dev[p:p + k], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(stream)
        events[i % 2] = ev

    issue(0)
    for i, (p, k) in enumerate(pieces):
        if i + 1 < len(pieces):
            issue(i + 1)  # its buffer's previous chunk was consumed in the last round
        events[i % 2].synchronize()
        consume(bufs[i % 2].data_ptr(), k, p)


def host_to_device(dev: Any, produce: Callable[[int, int, int], None],
                   chunk: int = STAGE) -> None:
    """Fill 1-D uint8 CUDA tensor `dev` through two pinned buffers: produce(addr, n, pos)
    writes each chunk while the previous chunk's device copy runs; synchronised at the end."""
    import torch

    pieces = _pieces(dev.numel(), chunk)
    if not pieces:
        return
    bufs = [pinned(min(chunk, dev.numel())) for _ in range(min(2, len(pieces)))]
    stream = torch.cuda.Stream(device=dev.device)
    stream.wait_stream(torch.cuda.current_stream(dev.device))
    events: list = [None, None]
    for i, (p, k) in enumerate(pieces):
        if events[i % 2] is not None:
            events[i % 2].synchronize()  # the device copy out of this buffer is done
        produce(bufs[i % 2].data_ptr(), k, p)
        with torch.cuda.stream(stream):
            dev[p:p + k].copy_(bufs[i % 2][:k], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(stream)
        events[i % 2] = ev
    stream.synchronize()  # every copy done: `dev` and the pinned buffers are free again


def memmove_to(dst_addr: int) -> Callable[[int, int, int], None]:
    """A `consume` that copies each chunk to host memory at dst_addr + pos."""
    def consume(addr: int, n: int, pos: int) -> None:
        ctypes.memmove(dst_addr + pos, addr, n)
    return consume


def memmove_from(src_addr: int) -> Callable[[int, int, int], None]:
    """A `produce` that copies each chunk from host memory at src_addr + pos."""
    def produce(addr: int, n: int, pos: int) -> None:
        ctypes.memmove(addr, src_addr + pos, n)
    return produce


def flat_u8(t: Any) -> Any:
    """A 1-D contiguous tensor as raw bytes (a view)."""
    import torch

    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def cuda_usable() -> bool:
    """True when this process can use CUDA (and so open IPC handles)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False
