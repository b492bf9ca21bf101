"""Turn a tensor or memoryview into a raw (address, size) span, checking it is usable."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Optional

from .errors import RDMABufferError, RDMADTypeError, RDMASizeError

try:  # torch is a dependency of the project, but keep memoryview-only use possible
    import torch
except ImportError:  # pragma: no cover
    torch = None  # type: ignore[assignment]  # (optional here: None without it)

__all__ = ["Span", "span_of", "check_dtype", "view_of"]


@dataclass
class Span:
    """A contiguous byte range of local memory and the object that keeps it alive."""

    addr: int
    nbytes: int
    keepalive: Any
    dtype: Optional[str]  # torch dtype name for tensors, None for raw bytes
    device: str  # "cpu" or "cuda:N"
    writable: bool = True

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")


def _describe(obj: Any) -> str:
    if torch is not None and isinstance(obj, torch.Tensor):
        return f"tensor(shape={tuple(obj.shape)}, dtype={obj.dtype}, device={obj.device})"
    return type(obj).__name__


def span_of(obj: Any, *, what: str, need_writable: bool) -> Span:
    """Validate `obj` (1-D contiguous tensor or memoryview) and return its byte span.

    Raises RDMABufferError (a ValueError) naming the problem."""
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided:
            raise RDMABufferError(f"{what} must be a dense (strided) tensor, got layout {obj.layout}")
        if obj.is_quantized or obj.dtype in (torch.complex32,):
            raise RDMABufferError(f"{what} has dtype {obj.dtype}, which has no plain byte layout")
        if obj.dim() != 1:
            raise RDMABufferError(
                f"{what} must be a 1-D tensor, got shape {tuple(obj.shape)}; "
                "pass t.view(-1) (or t.flatten() for a copy)"
            )
        if not obj.is_contiguous():
            raise RDMABufferError(
                f"{what} must be contiguous, got stride {obj.stride()}; pass t.contiguous()"
            )
        if obj.device.type not in ("cpu", "cuda"):
            raise RDMABufferError(f"{what} is on device {obj.device}; only cpu and cuda are supported")
        nbytes = obj.numel() * obj.element_size()
        if nbytes == 0:
            raise RDMASizeError(f"{what} is empty (0 bytes)")
        dtype = str(obj.dtype).replace("torch.", "")
        return Span(obj.data_ptr(), nbytes, obj, dtype, str(obj.device))
    if isinstance(obj, (bytearray, bytes)):
        obj = memoryview(obj)
    if isinstance(obj, memoryview):
        if obj.ndim != 1 or not obj.c_contiguous:
            raise RDMABufferError(f"{what} must be a 1-D C-contiguous memoryview, got ndim={obj.ndim}")
        if obj.nbytes == 0:
            raise RDMASizeError(f"{what} is empty (0 bytes)")
        if obj.readonly:
            if need_writable:
                raise RDMABufferError(f"{what} is a read-only memoryview; a writable one is needed")
            # Read-only source: copy-free address through a ctypes view of the exporter.
            buf = ctypes.c_char_p(obj.obj) if isinstance(obj.obj, bytes) and obj.nbytes == len(obj.obj) else None
            if buf is not None:
                addr = ctypes.cast(buf, ctypes.c_void_p).value or 0
                return Span(addr, obj.nbytes, obj, None, "cpu", writable=False)
            copy = bytearray(obj)  # rare: a read-only slice; one copy keeps it simple and safe
            return span_of(memoryview(copy), what=what, need_writable=False)
        mv = obj.cast("B") if obj.format != "B" else obj
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mv))
        return Span(addr, obj.nbytes, obj, None, "cpu")
    raise RDMABufferError(
        f"{what} must be a 1-D contiguous torch.Tensor or a writable memoryview, got {_describe(obj)}"
    )


def check_dtype(local: Span, remote_dtype: Optional[str], what: str) -> None:
    """Refuse a transfer between tensors of different dtypes (uint8 and memoryviews are raw bytes)."""
    if local.dtype is None or remote_dtype is None:
        return
    if "uint8" in (local.dtype, remote_dtype) or local.dtype == remote_dtype:
        return
    raise RDMADTypeError(
        f"{what} has dtype {local.dtype} but the remote buffer holds {remote_dtype}; "
        "use a tensor of the same dtype, or .view(torch.uint8) on both sides for raw bytes"
    )


def view_of(addr: int, nbytes: int) -> memoryview:
    """A writable byte memoryview over raw memory we keep alive elsewhere."""
    return memoryview((ctypes.c_char * nbytes).from_address(addr)).cast("B")
