"""Reduced calls folded in a host agent: the answers of a call made by an
`Accumulator(..., associative=True)` are combined here, on the way up the cast tree, so the
caller receives one partial value per subtree instead of one answer per rank.

The user's `combine` is user code: it never runs on the agent's I/O thread. One worker thread
per agent (`Folds`) unpickles the answers and folds them, in the order they arrived; each
call's `Fold` is touched by that thread only, and what the I/O thread needs back (a failure
at once, the partial at the end) is posted to it with `call_soon`. The worker's queue holds
at most the answers in flight, which the callers' call windows bound (`mailbox_limit`).

A value the agent cannot unpickle (a type only the procs can import, a large result left on
the data plane) is passed up as it came and folded by the caller: the agent never fails a
call the caller could finish. A `combine` that raises fails the call with the rank whose
value it was folding. Runs on the agent's worker thread (`Fold`) and I/O thread (`Folds`).
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import traceback
from typing import Any, Callable, Optional

from ..transport import framing

__all__ = ["COMBINES_KEPT", "Fold", "Folds"]

log = logging.getLogger("runtime.host")

#: combine functions an agent keeps unpickled (by their pickle), oldest dropped first
COMBINES_KEPT = 16

_NOTHING = object()


class Fold:
    """One reduced call's fold in this agent (worker thread only, after `Folds.start`):
    the running value, the ranks it covers, and what could not be folded."""

    __slots__ = ("combine", "acc", "procs", "ranks", "raw", "broken", "where")

    def __init__(self, combine: Optional[Callable[[Any, Any], Any]], where: str) -> None:
        self.combine = combine  # None: it could not be unpickled here (all passes up as is)
        self.acc: Any = _NOTHING
        self.procs: list[str] = []  # the procs whose answers `acc` holds
        self.ranks: list[int] = []
        #: passed up unfolded: [item, body, buffers, (procs, ranks) of a partial or None]
        self.raw: list[list] = []
        self.broken = False  # combine raised: the rest passes up unfolded
        self.where = where

    def add(self, item: list, body: Any, buffers: list,
            part: Optional[tuple[list, list]]) -> Optional[tuple[list, bytes]]:
        """Fold one answer (`item`: its REPLY_BATCH item; `part`: the procs and ranks of a
        child agent's partial). Returns an error item and body when combine raised."""
        if self.combine is None or self.broken:
            self.raw.append([item, body, buffers, part])
            return None
        try:
            from ..transport.serialization import loads  # import cost (cloudpickle)

            value = loads(body if type(body) is bytes else bytes(body), buffers)
        except Exception:  # a type the agent cannot import: the caller folds it
            self.raw.append([item, body, buffers, part])
            return None
        procs, ranks = part if part is not None else ([item[0]], [item[2]])
        if self.acc is _NOTHING:
            self.acc = value
        else:
            try:
                self.acc = self.combine(self.acc, value)
            except BaseException as e:  # noqa: BLE001 - it is the call's error
                self.broken = True
                return self._error(item, ranks[0] if ranks else item[2], e)
        self.procs.extend(procs)
        self.ranks.extend(ranks)
        return None

    def _error(self, item: list, rank: int, e: BaseException) -> tuple[list, bytes]:
        from ..errors import ActorError
        from ..transport.serialization import dumps  # import cost (cloudpickle)

        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        err = ActorError(f"the accumulator's combine raised in host agent {self.where} "
                         f"folding the answer of rank {rank}: {type(e).__name__}: {e}",
                         remote_traceback=text, exception_type=type(e).__name__, rank=rank)
        body, _ = dumps(err, "error")
        return [item[0], item[1], rank, framing.ERROR, len(body), 0], body

    def finish(self) -> tuple[Optional[tuple], list]:
        """The partial (body, buffers, procs, ranks), None when nothing was folded, and
        what passes up unfolded."""
        raw, self.raw = self.raw, []
        if self.acc is _NOTHING:
            return None, raw
        from ..transport.serialization import dumps  # import cost (cloudpickle)

        try:
            body, bufs = dumps(self.acc, "partial")
        except Exception as e:  # noqa: BLE001 - the fold cannot travel: an error
            item = [self.where, "", self.ranks[0], framing.OK, 0, 0]
            err, ebody = self._error(item, self.ranks[0], e)
            raw.append([err, ebody, [], None])
            return None, raw
        return (body, [memoryview(b) for b in bufs], self.procs, self.ranks), raw


class Folds:
    """The agent's fold worker: one thread, started with the first reduced call."""

    def __init__(self, call_soon: Callable[..., None]) -> None:
        self._call_soon = call_soon  # runs a function on the agent's I/O thread
        self._where = f"{socket.gethostname()} (pid {os.getpid()})"
        self._jobs: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._combines: dict[bytes, Any] = {}

    def start(self, combine: bytes) -> Fold:
        """A new fold for a call whose combine is pickled as `combine` (I/O thread; the
        Fold is the worker's from now on)."""
        fold = Fold(None, self._where)
        self.submit(self._unpickle, fold, combine)
        return fold

    def _unpickle(self, fold: Fold, combine: bytes) -> None:
        fn = self._combines.get(combine)
        if fn is None:
            try:
                from ..transport.serialization import loads  # import cost (cloudpickle)

                fn = loads(combine)
                if not callable(fn):
                    raise TypeError(f"{type(fn).__name__} is not callable")
            except Exception as e:  # noqa: BLE001 - the caller folds everything instead
                log.warning("agent: a reduced call's combine cannot be loaded here (%s: %s);"
                            " its answers go to the caller unfolded", type(e).__name__, e)
                fn = False
            self._combines[combine] = fn
            while len(self._combines) > COMBINES_KEPT:
                del self._combines[next(iter(self._combines))]
        fold.combine = fn if callable(fn) else None

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` on the worker, after what was submitted before (any thread)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="agent-folds",
                                            daemon=True)
            self._thread.start()
        self._jobs.put((fn, args))

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` on the I/O thread (from the worker)."""
        self._call_soon(fn, *args)

    def stop(self) -> None:
        """End the worker after what it has (I/O thread, at the agent's exit)."""
        if self._thread is not None:
            self._jobs.put(None)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args = job
            try:
                fn(*args)
            except Exception:  # one call's fold never stops the others'
                log.exception("agent: a fold step failed")
