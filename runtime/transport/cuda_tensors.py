"""CUDA tensors in messages, never through torch's default pickling.

A CUDA tensor argument or return value is either
- *staged*: copied once into pinned host memory, sent as an out-of-band frame, and copied
  to the receiver's current CUDA device when unpickled; or
- *shared by CUDA IPC* (large tensors to procs on the same host, when the sender learns that
  every receiver has taken it): the sender snapshots it into fresh device memory and exports
  that as an RDMABuffer; the receiver copies it into its own memory (device to device)
  while unpickling, before the handler runs. Message semantics stay copy semantics.
torch is imported only by processes that already use it."""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from typing import Any, Iterator, Optional

from .._base import features as _features
from ..config import config

__all__ = [
    "IPC_TIMEOUT", "CUDAUnavailableError", "MissingCUDA", "sending", "swap_sending",
    "restore_sending", "release", "reduce_cuda", "lenient", "find_missing", "name_argument",
]

_tls = threading.local()
IPC_TIMEOUT = 30.0  # seconds a receiver waits for a shared tensor's copy


class CUDAUnavailableError(RuntimeError):
    """A CUDA tensor reached a process that cannot use CUDA."""

    def __init__(self, message: str, desc: str = "") -> None:
        super().__init__(message)
        self.desc = desc


class MissingCUDA:
    """Stands in for a CUDA tensor while finding which argument it was (`lenient()`)."""

    def __init__(self, desc: str) -> None:
        self.desc = desc


@contextlib.contextmanager
def sending(keep: Optional[list], release_on_pull: bool = False) -> Iterator[None]:
    """Pickling a message whose receivers share this host: large CUDA tensors travel by
    CUDA IPC and their snapshots (RDMABuffers) are appended to `keep`, for `release(keep)`
    once every receiver answered; with `release_on_pull` (one receiver) it drops them
    itself. keep=None: everything is staged."""
    old = getattr(_tls, "send", None)
    _tls.send = (keep, release_on_pull) if keep is not None else None
    try:
        yield
    finally:
        _tls.send = old


def swap_sending(keep: Optional[list], release_on_pull: bool = False) -> Any:
    """`sending()` without a context manager (the call path's hot loop): returns what to
    pass to `restore_sending`."""
    old = getattr(_tls, "send", None)
    _tls.send = (keep, release_on_pull) if keep is not None else None
    return old


def restore_sending(old: Any) -> None:
    _tls.send = old


def release(keep: list) -> None:
    """Drop the snapshots made for a message (each receiver has its own copy by now)."""
    while keep:
        try:
            keep.pop().drop()
        except Exception:  # noqa: BLE001 - already gone
            pass


def _desc(t: Any) -> str:
    return f"shape {tuple(t.shape)}, {str(t.dtype).replace('torch.', '')}, {t.device}"


def reduce_cuda(t: Any) -> Any:
    """The pickle reduction of a CUDA tensor (see the module's docstring)."""
    torch = sys.modules["torch"]
    if t.layout != torch.strided or t.is_quantized or \
            (type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter)):
        return NotImplemented
    dtype = str(t.dtype).replace("torch.", "")
    param = isinstance(t, torch.nn.Parameter)
    meta = (dtype, tuple(t.shape), bool(t.requires_grad), param, _desc(t))
    src = t.detach()
    if not src.is_contiguous():
        src = src.contiguous()
    flat = src.reshape(-1).view(torch.uint8) if src.numel() else src.reshape(-1)
    nbytes = src.numel() * src.element_size()
    ctx = getattr(_tls, "send", None)
    if ctx is not None and nbytes >= max(1, config.cuda_ipc_min_bytes):
        keep, release_on_pull = ctx
        snap = torch.empty_like(flat)
        snap.copy_(flat)  # the sender may change or free `t` once the call returns
        buf = _features.call("rdma.buffer", snap)  # the data plane is above the transport
        keep.append(buf)
        return (_rebuild_shared, (buf, release_on_pull) + meta)
    host = torch.empty(flat.numel(), dtype=flat.dtype, pin_memory=True)
    host.copy_(flat)  # one device-to-host copy into pinned memory: the snapshot
    return (_rebuild_staged, (host.numpy(),) + meta)


def _target_device(desc: str) -> Any:
    torch: Any = sys.modules.get("torch")
    if torch is None:
        import torch
    if getattr(_tls, "lenient", False):
        return None
    if not torch.cuda.is_available():
        raise CUDAUnavailableError(f"a CUDA tensor ({desc}) arrived in a process without "
                                   "CUDA", desc)
    return torch.device("cuda", torch.cuda.current_device())


def _finish(out: Any, dtype: str, shape: tuple, requires_grad: bool, param: bool) -> Any:
    import torch

    t = out.view(getattr(torch, dtype)) if out.dtype != getattr(torch, dtype) else out
    t = t.reshape(shape)
    if param:
        return torch.nn.Parameter(t, requires_grad)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _rebuild_staged(arr: Any, dtype: str, shape: tuple, requires_grad: bool, param: bool,
                    desc: str) -> Any:
    device = _target_device(desc)
    if device is None:
        return MissingCUDA(desc)
    import torch

    with warnings.catch_warnings():  # a received frame is read-only; we only copy from it
        warnings.simplefilter("ignore", UserWarning)
        host = torch.from_numpy(arr)
    out = torch.empty(host.numel(), dtype=host.dtype, device=device)
    out.copy_(host)
    return _finish(out, dtype, shape, requires_grad, param)


def _rebuild_shared(buf: Any, release_on_pull: bool, dtype: str, shape: tuple,
                    requires_grad: bool, param: bool, desc: str) -> Any:
    try:
        device = _target_device(desc)
    except CUDAUnavailableError:
        if release_on_pull:
            buf.drop()
        raise
    if device is None:
        return MissingCUDA(desc)
    import torch

    out = torch.empty(buf.size(), dtype=torch.uint8, device=device)
    try:  # the data plane (rdma) is above the transport: reached through runtime._base.features
        _features.call("rdma.read_ipc", buf, out, IPC_TIMEOUT)
    finally:
        if release_on_pull:
            buf.drop()  # also closes our mapping
        else:
            _features.call("rdma.close_ipc", buf)  # one-shot: not kept open
    return _finish(out, dtype, shape, requires_grad, param)


@contextlib.contextmanager
def lenient() -> Iterator[None]:
    """Unpickle with CUDA tensors as MissingCUDA markers (to name the culprit)."""
    _tls.lenient = True
    try:
        yield
    finally:
        _tls.lenient = False


def find_missing(obj: Any, path: str = "", depth: int = 0) -> Optional[tuple[str, str]]:
    """(path, description) of the first MissingCUDA inside containers of `obj`."""
    if isinstance(obj, MissingCUDA):
        return path, obj.desc
    if depth > 6:
        return None
    items: Any = ()
    if isinstance(obj, dict):
        items = ((f"{path}[{k!r}]", v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(obj))
    elif hasattr(obj, "__dict__"):
        items = ((f"{path}.{k}", v) for k, v in vars(obj).items())
    for p, v in items:
        got = find_missing(v, p, depth + 1)
        if got is not None:
            return got
    return None


def name_argument(fn: Any, args: tuple, kwargs: dict) -> Optional[tuple[str, str]]:
    """Which argument of `fn(*args, **kwargs)` holds a MissingCUDA: ("'x'" or "'x'[2]", desc)."""
    import inspect

    try:
        params = [p for p in inspect.signature(fn).parameters][1:]  # without self
    except (TypeError, ValueError):
        params = []
    for i, a in enumerate(args):
        got = find_missing(a)
        if got is not None:
            name = repr(params[i]) if i < len(params) else f"#{i}"
            return name + got[0], got[1]
    for k, v in kwargs.items():
        got = find_missing(v)
        if got is not None:
            return repr(k) + got[0], got[1]
    return None
