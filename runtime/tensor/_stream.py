"""Monarch's `Stream`, `get_active_stream` and `Stream.borrow`, accepted so that Monarch
programs written for several streams run unchanged. Each proc runs the commands of all
streams in issue order on one stream: a valid schedule of the same program (borrows only
constrain the order, and issue order satisfies them), without the overlap of communication
and compute that separate CUDA streams would give. See docs/tensors.md."""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from ._tensor import Tensor

__all__ = ["Stream", "Borrow", "get_active_stream"]

_local = threading.local()


class Stream:
    """A named stream of work on every proc of a mesh (runs in issue order with the others)."""

    def __init__(self, name: str, _default: bool = False) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"Stream needs a name, got {name!r}")
        self.name = name
        self.default = _default

    @contextlib.contextmanager
    def activate(self) -> Iterator["Stream"]:
        """Make this the calling thread's active stream inside the block."""
        stack = _stack()
        stack.append(self)
        try:
            yield self
        finally:
            stack.pop()

    def borrow(self, t: Tensor, mutable: bool = False) -> tuple[Tensor, "Borrow"]:
        """`t` for use on this stream, and the borrow to drop when done. The tensor is `t`
        itself: with every stream run in order, its values are the same either way."""
        if not isinstance(t, Tensor):
            raise TypeError(f"Stream.borrow needs a mesh tensor, got {type(t).__name__}")
        return t, Borrow(t, self, mutable)

    def __repr__(self) -> str:
        return f"<Stream {self.name!r}>"


class Borrow:
    """A borrow of a tensor by a stream; `drop()` ends it (once)."""

    def __init__(self, t: Tensor, stream: Stream, mutable: bool) -> None:
        self.tensor, self.stream, self.mutable = t, stream, mutable
        self.dropped = False

    def drop(self) -> None:
        """End the borrow; dropping twice is an error, as in Monarch."""
        if self.dropped:
            raise RuntimeError(f"borrow of a tensor by {self.stream!r} was already dropped")
        self.dropped = True

    def __enter__(self) -> "Borrow":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.dropped:
            self.drop()


_MAIN = Stream("main", _default=True)


def _stack() -> list:
    s = getattr(_local, "stack", None)
    if s is None:
        s = _local.stack = []
    return s


def get_active_stream() -> Stream:
    """The calling thread's active stream (the default `main` stream outside any block)."""
    s = _stack()
    return s[-1] if s else _MAIN
