"""Monarch's `Accumulator`: fold an endpoint's results into one value. By default the caller
folds `endpoint.stream(...)` in arrival order, as Monarch; with `associative=True` the host
agents fold on the way up the cast tree (runtime/host/folds.py), so the caller receives one
partial value per subtree instead of one answer per actor.

Layer 7 (user API): imports `adverbs` and `collector`, the core and the basics.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

from ..errors import SerializationError
from ..future import Future
from ..transport.serialization import dumps
from .adverbs import EndpointRef, fold_call
from .collector import Fold

__all__ = ["T", "Accumulator"]

T = TypeVar("T")


class Accumulator(Generic[T]):
    """Fold an endpoint's results as they arrive, as Monarch: `combine(acc, value)` over
    `endpoint.stream(...)`, starting from `identity` (the identity when nothing streams).

    `associative=True` says `combine` is associative and commutative over the endpoint's
    values (`combine(a, b)` where each of a and b is a result or a fold of results: a sum, a
    max, a merge of counters): the host agents then fold their actors' results on the way
    up and the caller combines at most `cast_fanout` partial values with `identity`
    (docs/runtime.md, "Reducing on the way up"). `combine` must pickle then, and the order
    of the fold is not defined (floating-point sums may differ in the last bits)."""

    def __init__(self, endpoint: Any, identity: T, combine: Callable[[T, Any], T], *,
                 associative: bool = False) -> None:
        if not callable(combine):
            raise TypeError(f"Accumulator(): combine must be callable, got "
                            f"{type(combine).__name__}")
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine
        self._fold = None
        if associative and isinstance(endpoint, EndpointRef):
            try:
                pickled, bufs = dumps(combine, "the accumulator's combine")
                if bufs:
                    raise SerializationError("it carries large out-of-band data (a tensor or "
                                             "an array in its closure?): keep it small")
            except SerializationError as e:
                raise SerializationError(
                    f"Accumulator(associative=True) sends combine to the host agents, "
                    f"which fold on the way up, so it must pickle: {e}") from None
            self._fold = Fold(combine, identity, bytes(pickled))

    def accumulate(self, *args: Any, **kwargs: Any) -> Future[T]:
        """Call the endpoint on every actor now; a Future of the fold (the first error, a
        rank's or combine's, fails it). Without `associative`, the fold is left to right in
        stream (arrival) order, as Monarch."""
        if self._fold is not None:
            return fold_call(self._endpoint, args, kwargs, self._fold)
        stream = iter(self._endpoint.stream(*args, **kwargs))
        out: Future = Future("Accumulator.accumulate")

        def fold(acc: Any) -> None:
            try:
                for fut in stream:
                    if not fut.done():
                        _start(fut)
                    if not fut.done():
                        fut.add_done_callback(lambda f, a=acc: resume(f, a))
                        return
                    acc = self._combine(acc, fut.get())
            except BaseException as e:  # noqa: BLE001 - it belongs to the future
                out.set_exception(e)
                return
            out.set_result(acc)

        def resume(fut: Future, acc: Any) -> None:
            try:
                acc = self._combine(acc, fut.get())
            except BaseException as e:  # noqa: BLE001
                out.set_exception(e)
                return
            fold(acc)

        fold(self._identity)
        return out


def _start(fut: Any) -> None:
    """Start a `Future(coro=...)` that nobody awaits yet (a stream may yield those)."""
    if isinstance(fut, Future):
        fut.start()
