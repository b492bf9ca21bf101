"""Ports: where replies and channel values arrive, and how waits fail when a peer dies.

A port is opened by the thread that will wait on it (a caller, an actor) and is then
resolved and closed on the I/O thread. Each entry is written in one step (a dict insert or
pop, atomic in CPython), so the table needs no lock. A port names the procs whose answer it
waits for; when one dies, `fail_waiting` fails it. Opening a port checks the dead procs
after inserting it, so a death that races with the open fails the port either way.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Callable, Iterable, Optional, Protocol

from ..transport import bulk, framing
from ..transport.framing import Header

__all__ = ["Handler", "FailHandler", "Waiter", "Ports"]

log = logging.getLogger("runtime.ports")

Handler = Callable[[Header, Any, list], None]
#: on_fail(exc, proc=dead proc id or None, actor=failed actor id or None)
FailHandler = Callable[..., None]


class Waiter(Protocol):
    """What a port delivers to: `on_reply(header, body, buffers)` for each message,
    `on_fail(exc, proc=, actor=)` (or None) if one of `procs` dies first."""

    procs: frozenset
    on_fail: Optional[FailHandler]

    def on_reply(self, h: Header, body: Any, buffers: list) -> None: ...


class _Entry:
    """A port opened with a handler function (a Waiter made of its parts)."""

    __slots__ = ("on_reply", "on_fail", "procs")

    def __init__(self, handler: Handler, on_fail: Optional[FailHandler], procs: frozenset
                 ) -> None:
        self.on_reply = handler
        self.on_fail = on_fail
        self.procs = procs


class Ports:
    """The open ports of one process."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._ports: dict[int, Waiter] = {}
        #: run by `settle()` (I/O thread): a proc hands the failures that reached it to
        #: their supervising actors
        self.before_resolve: Optional[Callable[[], None]] = None

    def settle(self) -> None:
        """Called before a call's future resolves (I/O thread): supervision events that
        arrived before its last answer are handed over first."""
        if self.before_resolve is not None:
            self.before_resolve()

    def open(self, handler: Any, on_fail: Optional[FailHandler] = None,
             procs: Iterable[str] = ()) -> tuple[int, Waiter]:
        """A new port id, and its Waiter: messages go to `handler(header, body, buffers)`
        (I/O thread) and `on_fail` is called if one of `procs` dies first; or `handler` is
        a Waiter itself (a call's collector: no handler objects made per call)."""
        w = handler if hasattr(handler, "on_reply") else \
            _Entry(handler, on_fail, frozenset(procs))
        pid = next(self._ids)
        self._ports[pid] = w
        return pid, w

    def __len__(self) -> int:
        return len(self._ports)

    def waiter(self, pid: int) -> Optional[Waiter]:
        """What port `pid` delivers to, or None (closed)."""
        return self._ports.get(pid)

    def waiters(self) -> list[tuple[int, Waiter]]:
        """The open ports and what each delivers to, a copy (any thread)."""
        return list(self._ports.items())

    def close(self, pid: int) -> None:
        self._ports.pop(pid, None)

    def deliver(self, h: Header, body: Any, buffers: list) -> None:
        """Hand a REPLY or PORT_SEND to its port (I/O thread); unknown ports are ignored
        (an answer left on the data plane is dropped there: nobody will read it)."""
        entry = self._ports.get(h.port)
        if entry is not None:
            entry.on_reply(h, body, buffers)
        elif bulk.is_bulk(body):
            bulk.discard(body)

    def deliver_batch(self, h: Header, body: Any, buffers: list) -> None:
        """Hand each reply of a REPLY_BATCH (a host agent's gathered replies) to its port."""
        entry = self._ports.get(h.port)
        try:
            replies = framing.split_reply_batch(h, body, buffers)
        except framing.FrameError as e:
            log.warning("dropped a reply batch from %s: %s", h.src, e)
            return
        parts = framing.extra_get(h, "part")
        parts = iter(parts if isinstance(parts, list) else ())
        for rh, rbody, rbufs in replies:
            if rh.status == framing.PARTIAL:  # host agents' fold of several ranks' answers
                part = next(parts, None)
                on_partial = getattr(entry, "on_partial", None)
                ranks = part[1] if isinstance(part, list) and len(part) == 2 else None
                if on_partial is not None and isinstance(ranks, list) and \
                        all(type(r) is int for r in ranks):
                    on_partial(rh, rbody, rbufs, ranks)
                elif entry is not None:
                    log.warning("dropped a partial value from %s: %s", h.src,
                                "its ranks are malformed" if on_partial is not None else
                                "the call was not reduced")
            elif entry is not None:
                entry.on_reply(rh, rbody, rbufs)
            elif bulk.is_bulk(rbody):
                bulk.discard(rbody)
        gone = framing.extra_get(h, "gone")
        if gone and entry is not None and isinstance(gone, list):
            on_gone = getattr(entry, "on_gone", None)  # a call sent down a cast tree
            if on_gone is not None:
                why = framing.extra_get(h, "why")
                on_gone(gone, why if isinstance(why, dict) else {})

    def fail(self, pid: int, exc: BaseException, proc: Optional[str] = None,
             actor: Optional[str] = None) -> None:
        entry = self._ports.get(pid)
        if entry is not None and entry.on_fail is not None:
            entry.on_fail(exc, proc=proc, actor=actor)

    def procs_of(self, pid: int) -> frozenset:
        """The procs whose death fails port `pid` (none for an unknown port)."""
        w = self._ports.get(pid)
        return w.procs if w is not None and w.on_fail is not None else frozenset()

    def waiting_on(self, proc_id: str) -> list[int]:
        """Ports that wait for an answer from `proc_id`."""
        return [pid for pid, w in list(self._ports.items())
                if w.on_fail is not None and proc_id in w.procs]

    def fail_waiting(self, proc_id: str, exc: BaseException,
                     actor: Optional[str] = None) -> None:
        """Fail every port waiting on `proc_id` (I/O thread)."""
        for pid in self.waiting_on(proc_id):
            self.fail(pid, exc, proc=proc_id, actor=actor)

    def waited_procs(self) -> set[str]:
        """Every proc some open port waits on."""
        out: set[str] = set()
        for w in list(self._ports.values()):
            if w.on_fail is not None:
                out |= w.procs
        return out
