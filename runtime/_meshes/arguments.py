"""A call's arguments: checked against the endpoint's signature and pickled in the caller's
thread (errors name the argument); over the message limit, their large buffers go on the
data plane; released once every receiver has them.

Layer 7 (user API, under `adverbs`): imports the transport and the basics.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

from ..config import config
from ..errors import MessageTooLargeError, SerializationError
from ..future import when_all
from ..transport import bulk, cuda_tensors
from ..transport.serialization import dumps, dumps_plain, swap_held

__all__ = ["NO_ARGUMENTS", "ArgumentEncoder", "releasing", "fast_arity_ok", "unpicklable_argument"]

#: the pickled arguments of a call without any
NO_ARGUMENTS = dumps(((), {}))[0]


class ArgumentEncoder:
    """Pickles the arguments of calls to one endpoint: `signature` (None: unchecked) and
    `qualname` (`Class.endpoint`, its name in errors)."""

    __slots__ = ("_sig", "qualname")

    def __init__(self, signature: Optional[inspect.Signature], qualname: str) -> None:
        self._sig = signature
        self.qualname = qualname

    def encode(self, args: tuple, kwargs: dict, keep: Optional[list] = None,
               held: Optional[list] = None) -> tuple[bytes, list]:
        """(body, buffers) of a call's arguments. With `held` (a call that gets replies),
        arguments over the message limit leave their large buffers on the data plane, and
        `held` gets what to release once every receiver answered."""
        old_send, old_held = cuda_tensors.swap_sending(keep), swap_held(held)
        try:
            return self._encode_now(args, kwargs, held)
        except BaseException:
            if keep:
                cuda_tensors.release(keep)
            raise
        finally:
            cuda_tensors.restore_sending(old_send)
            swap_held(old_held)

    def _encode_now(self, args: tuple, kwargs: dict,
                    held: Optional[list] = None) -> tuple[bytes, list]:
        bound = None
        if self._sig is not None and not fast_arity_ok(self._sig, args, kwargs):
            try:
                bound = self._sig.bind(*args, **kwargs)
            except TypeError as e:
                raise TypeError(f"{self.qualname}{self._sig}: {e}") from None
        try:
            body, bufs = dumps((args, kwargs), "arguments")
        except SerializationError:
            if bound is None and self._sig is not None:
                bound = self._sig.bind(*args, **kwargs)
            culprit, reason = unpicklable_argument(bound, args, kwargs)
            raise SerializationError(
                f"argument {culprit} of {self.qualname}() cannot be pickled{reason}") from None
        total = len(body) + sum(memoryview(b).nbytes for b in bufs)
        if total > config.max_message_bytes:
            moved = None
            if held is not None:
                moved = bulk.offload(body, bufs, config.max_message_bytes, drop_on_read=False)
            if moved is None:
                how = ("its pickled part alone is too large: pass the bulk as arrays or "
                       "tensors, or through RDMABuffer" if held is not None else
                       "broadcast and send cannot move it over the data plane (no reply "
                       "says when the receivers have it): use call(), or RDMABuffer")
                raise MessageTooLargeError(
                    f"arguments of {self.qualname}() are {total} bytes, over the message "
                    f"limit of {config.max_message_bytes} bytes (MONARCH_MAX_MESSAGE_BYTES); "
                    f"{how}")
            body, bufs, mine = moved
            assert held is not None  # (moved only where held)
            held.extend(mine)
        return body, bufs

    def plain(self, args: tuple, kwargs: dict) -> Optional[bytes]:
        """The pickled arguments when they are plain data that fits the signature (no
        buffers, CUDA tensors or size limit to see to), else None: `encode` then."""
        if self._sig is not None and not fast_arity_ok(self._sig, args, kwargs):
            return None
        if not args and not kwargs:
            return NO_ARGUMENTS
        body = dumps_plain((args, kwargs))
        if body is None or len(body) > config.max_message_bytes:
            return None
        return body


def releasing(futs: Any, keep: Optional[list]) -> Any:
    """Drop what a call exported for its receivers (CUDA IPC snapshots, arguments left on
    the data plane) once all its futures resolved (every receiver copied them before its
    handler ran, or failed); returns `futs` as given."""
    if keep:
        when_all(futs if isinstance(futs, list) else [futs],
                 lambda: cuda_tensors.release(keep))
    return futs


_arity_cache: dict = {}


def fast_arity_ok(sig: inspect.Signature, args: tuple, kwargs: dict) -> bool:
    """True when positional-only calls certainly fit a plain signature (skips bind())."""
    if kwargs:
        return False
    info = _arity_cache.get(id(sig))
    if info is None or info[0] is not sig:
        P = inspect.Parameter
        params = list(sig.parameters.values())
        plain = all(p.kind == P.POSITIONAL_OR_KEYWORD for p in params)
        required = sum(1 for p in params if p.default is P.empty)
        info = (sig, plain, required, len(params))
        if len(_arity_cache) >= 256:  # bounded: signatures of meshes that came and went
            _arity_cache.clear()
        _arity_cache[id(sig)] = info
    _, plain, required, total = info
    return plain and required <= len(args) <= total


def unpicklable_argument(bound: Any, args: tuple, kwargs: dict) -> tuple[str, str]:
    """The first argument that cannot be pickled, and why: ("'x'", ": TypeError: ...")."""
    items = list(bound.arguments.items()) if bound is not None else \
        [(f"#{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    for name, value in items:
        try:
            dumps(value)
        except SerializationError as e:
            return repr(name), f": {e.__cause__ or e}"
    return "(unknown)", ""
