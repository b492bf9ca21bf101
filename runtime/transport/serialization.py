"""Serialization of message bodies: cloudpickle with out-of-band buffers.

Classes and functions from `__main__` or a notebook cell travel by value (cloudpickle);
their code objects travel whole (marshal), so a proc sees the real file name (the script's
path, the kernel's cell file) whatever cloudpickle does to `co_filename` (3.1.3 writes
`<dynamic-code>` there): remote tracebacks, remote pdb and breakpoints name the real source.
numpy arrays and CPU torch tensors travel as pickle-protocol-5 buffers: separate zmq frames,
sent without copies; CUDA tensors as runtime/transport/cuda_tensors.py says. torch is never
imported here: tensors are recognised only when the process has already imported torch.
"""

from __future__ import annotations

import contextlib
import io
import marshal
import pickle
import sys
import threading
import types
from typing import Any, Iterator, Optional, Sequence

import cloudpickle

from ..config import config
from ..errors import MessageTooLargeError, SerializationError

__all__ = [
    "PROTOCOL", "MAX_OUT_OF_BAND", "dumps_plain", "dumps", "swap_held", "keep_alive", "loads",
    "unpickling_paused", "buffer_nbytes", "check_size",
]

PROTOCOL = 5
#: out-of-band buffers (arrays, tensors) per pickled value; more go inside the pickle
MAX_OUT_OF_BAND = 512
_SIMPLE = (type(None), bool, int, float, str, bytes)


def _is_simple(obj: Any, depth: int = 0) -> bool:
    """Plain data that pickles identically with the C pickler (no classes by reference)."""
    t = type(obj)
    if t in _SIMPLE:
        return True
    if depth > 3:
        return False
    if t is tuple or t is list:
        return len(obj) <= 16 and all(_is_simple(x, depth + 1) for x in obj)
    if t is dict:
        return len(obj) <= 16 and all(
            type(k) in _SIMPLE and _is_simple(v, depth + 1) for k, v in obj.items()
        )
    return False


def _rebuild_tensor(arr: Any, dtype_name: str, shape: tuple, requires_grad: bool) -> Any:
    import torch

    t = torch.from_numpy(arr)
    dtype = getattr(torch, dtype_name)
    if t.dtype != dtype:
        t = t.view(dtype)
    t = t.reshape(shape)
    if requires_grad:
        t.requires_grad_(True)
    return t


_VIEW_AS = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8"}


def _reduce_tensor(t: Any) -> Any:
    """Reduce a CPU tensor to a numpy array (an out-of-band buffer) plus its dtype."""
    torch = sys.modules["torch"]
    if t.device.type != "cpu" or t.layout != torch.strided or t.is_quantized:
        return NotImplemented
    if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        return NotImplemented
    dtype_name = str(t.dtype).replace("torch.", "")
    base = t.detach()
    if not base.is_contiguous():
        base = base.contiguous()
    flat = base.reshape(-1)
    if dtype_name in _VIEW_AS:
        flat = flat.view(getattr(torch, _VIEW_AS[dtype_name]))
    try:
        arr = flat.numpy()
    except (TypeError, RuntimeError):
        return NotImplemented
    if isinstance(t, torch.nn.Parameter):
        return (_rebuild_parameter, (arr, dtype_name, tuple(t.shape), t.requires_grad))
    return (_rebuild_tensor, (arr, dtype_name, tuple(t.shape), t.requires_grad))


def _rebuild_parameter(arr: Any, dtype_name: str, shape: tuple, requires_grad: bool) -> Any:
    import torch

    return torch.nn.Parameter(_rebuild_tensor(arr, dtype_name, shape, False), requires_grad)


def _reduce_code(code: types.CodeType) -> Any:
    """A code object as its marshal bytes: everything kept, its file name and line table
    included (controller and procs run the same Python, as by-value pickling needs)."""
    try:
        return (marshal.loads, (marshal.dumps(code),))
    except ValueError:  # a hand-built code object with unmarshallable constants
        return NotImplemented


class _Pickler(cloudpickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is types.CodeType:
            return _reduce_code(obj)
        # torch as far as it is imported: another thread may be importing it right now
        # (its module object exists before its Tensor does); a tensor here means it is done
        tensor_type = getattr(sys.modules.get("torch"), "Tensor", None)
        if tensor_type is not None and isinstance(obj, tensor_type):
            if obj.device.type == "cuda":  # never torch's default pickling
                from .cuda_tensors import reduce_cuda

                r = reduce_cuda(obj)
            else:
                r = _reduce_tensor(obj)
            if r is not NotImplemented:
                return r
        return super().reducer_override(obj)


def dumps_plain(obj: Any) -> Optional[bytes]:
    """The pickle of `obj` when it is plain data (None, numbers, strings, bytes, and small
    tuples, lists and dicts of them: no buffers, nothing pickled by reference), else None.
    The same bytes `dumps` gives, for callers that skip its set-up for such data."""
    if _is_simple(obj):
        return pickle.dumps(obj, PROTOCOL)
    return None


def dumps(obj: Any, what: str = "value") -> tuple[bytes, list[pickle.PickleBuffer]]:
    """Pickle `obj`; returns the pickle bytes and its out-of-band buffers.

    Raises SerializationError naming `what` when the object cannot be pickled."""
    if _is_simple(obj):
        return pickle.dumps(obj, PROTOCOL), []
    buffers: list[pickle.PickleBuffer] = []

    def out_of_band(buf: pickle.PickleBuffer) -> bool:
        """The first MAX_OUT_OF_BAND buffers travel as frames of their own (no copy); the
        rest in the pickle (copied): any number of arrays is an ordinary value, and a
        message's frame count stays within what a stream takes (framing.MAX_FRAMES)."""
        if len(buffers) < MAX_OUT_OF_BAND:
            buffers.append(buf)
            return False
        return True

    f = io.BytesIO()
    try:
        _Pickler(f, protocol=PROTOCOL, buffer_callback=out_of_band).dump(obj)
    except Exception as e:
        raise SerializationError(f"cannot pickle {what}: {type(e).__name__}: {e}") from e
    return f.getvalue(), buffers


_held = threading.local()


class _Kept:
    """An object kept alive for a message until `drop()` (its receivers answered)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def drop(self) -> None:
        self.obj = None


def swap_held(held: Optional[list]) -> Optional[list]:
    """While a call's arguments are pickled: `keep_alive(obj)` appends to `held` (released
    when the call's futures resolve); None stops that. Returns the previous list."""
    old = getattr(_held, "list", None)
    _held.list = held
    return old


def keep_alive(obj: Any) -> bool:
    """From a `__reduce__`: keep `obj` alive until the receivers of the message being
    pickled have answered; False when no call is being pickled (broadcast, send)."""
    held = getattr(_held, "list", None)
    if held is None:
        return False
    held.append(_Kept(obj))
    return True


# Unpickling imports what a message names (torch for a tensor, a by-value class's modules).
# Two threads importing torch for the first time at once break its circular imports
# ("partially initialized module 'torch.nn.parameter'", or a C type "already defined"
# when the second re-runs what the first left half done), so the actor threads of a proc,
# which unpickle their spawn and call messages each on its own thread, take turns here.
# A reconstructor that waits for another actor (a mesh tensor's shard waits for the
# engine's worker to run the op that makes it) lets the others go while it waits:
# `unpickling_paused()`.
_unpickle_lock = threading.Lock()
_turn = threading.local()  # .held: this thread holds _unpickle_lock


def loads(data: Any, buffers: Sequence[Any] = (), serialized: bool = False) -> Any:
    """Unpickle a body produced by `dumps` (after reading the buffers a message over the
    size limit left on the data plane: runtime/transport/bulk.py). `serialized`: unpickle
    under a process-wide lock (actor threads; never the I/O thread, which a reconstructor
    may wait on)."""
    if type(data) is not bytes or data[:1] == b"\x00":  # a pickle never starts with 0
        from . import bulk

        if bulk.is_bulk(data):  # read outside the lock: it may take long
            data, buffers = bulk.materialize(data, buffers)
    if serialized and not getattr(_turn, "held", False):
        with _unpickle_lock:
            _turn.held = True
            try:
                return pickle.loads(data, buffers=buffers)
            finally:
                _turn.held = False
    return pickle.loads(data, buffers=buffers)


@contextlib.contextmanager
def unpickling_paused() -> Iterator[None]:
    """Inside a reconstructor that waits for another thread: let the other actor threads
    unpickle meanwhile (taking the turn back after); nothing when this thread has no turn."""
    if not getattr(_turn, "held", False):
        yield
        return
    _turn.held = False
    _unpickle_lock.release()
    try:
        yield
    finally:
        _unpickle_lock.acquire()
        _turn.held = True


def buffer_nbytes(buffers: Sequence[Any]) -> int:
    n = 0
    for b in buffers:
        n += memoryview(b).nbytes
    return n


def check_size(body: bytes, buffers: Sequence[Any], what: str) -> None:
    """Raise MessageTooLargeError, naming `what`, when a message's pickle and buffers are
    over `max_message_bytes`: a limit fails its message at the call site, never on the way."""
    total = len(body) + sum(memoryview(b).nbytes for b in buffers)
    if total > config.max_message_bytes:
        raise MessageTooLargeError(
            f"{what} is {total} bytes, over the message limit of {config.max_message_bytes} "
            f"bytes (MONARCH_MAX_MESSAGE_BYTES): pass large arrays through RDMABuffer, or "
            f"as the arguments or return value of a call()")

