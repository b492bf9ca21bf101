"""Asking several peers at once and gathering their answers within one deadline (what
`read_logs`, `read_timeline` and `proc_stacks` do): each question gets a reply port of its
own, closed once it is answered, failed, or given up on."""

from __future__ import annotations

import time
from typing import Any, Callable, Generic, Iterable, Iterator, Optional, TypeVar

from .._core import Runtime
from ..future import Future
from ..transport.framing import Header

__all__ = ["K", "Questions"]

K = TypeVar("K")


class Questions(Generic[K]):
    """Questions asked through one runtime, each under a key of the caller's."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._asked: list[tuple[K, Future, int]] = []

    def ask(self, key: K, label: str, send: Callable[[int], None],
            decode: Callable[[Header, Any], Any], watch: Iterable[str] = ()) -> None:
        """Open a port and `send(port)` the question; `decode(header, body)` makes the
        answer (what it raises is the question's error). A death of a proc in `watch`
        fails the question at once."""
        rt = self._rt
        fut: Future = Future(label)

        def on_reply(h: Header, body: Any, buffers: list) -> None:
            rt.close_port(port)
            try:
                fut.set_result(decode(h, body))
            except Exception as e:  # noqa: BLE001 - the question's error
                fut.set_exception(e)

        def on_fail(exc: BaseException, **_: Any) -> None:
            rt.close_port(port)
            fut.set_exception(exc)

        watched = set(watch)
        port = rt.open_port(on_reply, on_fail if watched else None, watched or ())
        send(port)
        self._asked.append((key, fut, port))

    def answers(self, timeout: float) -> Iterator[tuple[K, Any, Optional[Exception]]]:
        """(key, answer, None) or (key, None, error) for each question in the order asked,
        all within `timeout` seconds from now (TimeoutError for one still unanswered)."""
        deadline = time.monotonic() + timeout
        for key, fut, port in self._asked:
            try:
                got = fut.get(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError as e:
                self._rt.close_port(port)
                yield key, None, e
            except Exception as e:  # noqa: BLE001 - the caller says what it means
                yield key, None, e
            else:
                yield key, got, None

    def close(self) -> None:
        """Give up on every question still unanswered (their ports are closed)."""
        for _, fut, port in self._asked:
            if not fut.done():
                self._rt.close_port(port)
