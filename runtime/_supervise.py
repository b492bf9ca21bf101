"""How an actor receives supervision events (private; used by `proc`).

Failures of meshes an actor owns reach its proc's I/O thread one by one (one message per
failed rank). They are batched per actor (until none has come for 0.25 s, at most 1 s)
and handed over in rank order,
and always before any reply that reached the proc after them resolves a wait: so a call
that failed returns to its caller only after `__supervise__` has seen every failure that
caused it. `__supervise__` runs on the actor's thread, between messages, or while an async
endpoint awaits (as in Monarch, where a handler can wait for its own supervision events).

Layer 6 (process roles, below `proc`): imports the basics only.
"""

from __future__ import annotations

import collections
import inspect
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Optional

from .supervision import MeshFailure

if TYPE_CHECKING:
    from ._actor_instance import ActorInstance
    from ._proc_server import ProcServer

#: failures of one actor's meshes are handed over once none has arrived for this long...
BATCH_QUIET_S = 0.25
#: ...or at the latest this long after the first of the batch
BATCH_MAX_S = 1.0


class SuperviseInbox:
    """One actor's supervision events: `pending` (I/O thread only) and `ready` (handed to
    the actor thread, under `lock`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: list[MeshFailure] = []
        self.ready: collections.deque = collections.deque()
        self.first_at = 0.0  # when the first and the last pending failure arrived
        self.last_at = 0.0


def _order(f: MeshFailure) -> tuple:
    return (f.mesh, f.ranks[0] if f.ranks else -1)


def deliver(server: "ProcServer", a: "ActorInstance", failure: MeshFailure) -> None:
    """Queue a failure for actor `a` (I/O thread); handed over after the batch window, or
    before the next reply this proc resolves."""
    box = a.supervise_inbox
    box.last_at = now = time.monotonic()
    if not box.pending:
        box.first_at = now
        server.rt.loop.call_later(BATCH_QUIET_S, _flush_when_quiet, a)
    box.pending.append(failure)
    server.supervise_waiting[a.actor_id] = a
    server.rt.ports.before_resolve = server.flush_supervision


def _flush_when_quiet(a: "ActorInstance") -> None:
    """Hand the batch over once no failure came for BATCH_QUIET_S (failures of ranks that
    fail together arrive close together), or BATCH_MAX_S after its first (I/O thread)."""
    box = a.supervise_inbox
    if not box.pending:
        return
    now = time.monotonic()
    due = min(box.last_at + BATCH_QUIET_S, box.first_at + BATCH_MAX_S)
    if now + 0.001 >= due:
        flush(a)
    else:
        a.server.rt.loop.call_later(due - now, _flush_when_quiet, a)


def flush(a: "ActorInstance") -> None:
    """Hand actor `a` its pending failures in rank order (I/O thread): a mailbox entry, and
    a wake-up of its event loop if an async endpoint is awaiting there."""
    box = a.supervise_inbox
    a.server.supervise_waiting.pop(a.actor_id, None)
    if not box.pending:
        return
    batch = sorted(box.pending, key=_order)
    box.pending.clear()
    with box.lock:
        box.ready.extend(batch)
    a.mailbox.put(("supervise",))
    loop = a._aloop
    if a.in_async and loop is not None:
        try:
            loop.call_soon_threadsafe(_start_in_loop, a)
        except RuntimeError:  # the loop closed meanwhile: the mailbox entry handles them
            pass


def _next(a: "ActorInstance") -> Optional[MeshFailure]:
    box = a.supervise_inbox
    with box.lock:
        return box.ready.popleft() if box.ready else None


def on_mailbox_entry(a: "ActorInstance") -> None:
    """Between messages (actor thread): run `__supervise__` on every failure handed over."""
    while a.failed is None:
        f = _next(a)
        if f is None:
            return
        handler = _handler(a, f)
        if handler is None:
            continue
        a._set_state("busy", "__supervise__")
        try:
            handled = handler(f)
            if inspect.iscoroutine(handled):
                handled = a._run_coro(handled)
        except BaseException as e:  # noqa: BLE001 - fails the actor
            _raised(a, f, e)
            continue
        finally:
            if a.failed is None:
                a._set_state("idle")
        _outcome(a, f, handled)


def _start_in_loop(a: "ActorInstance") -> None:
    """In the actor's event loop while an async endpoint awaits: handle the failures now."""
    if a.failed is None and a.supervise_inbox.ready:
        a.event_loop().create_task(_handle_in_loop(a))


async def _handle_in_loop(a: "ActorInstance") -> None:
    while a.failed is None:
        f = _next(a)
        if f is None:
            return
        handler = _handler(a, f)
        if handler is None:
            continue
        try:
            handled = handler(f)
            if inspect.iscoroutine(handled):
                handled = await handled
        except BaseException as e:  # noqa: BLE001 - fails the actor
            _raised(a, f, e)
            continue
        _outcome(a, f, handled)


def _handler(a: "ActorInstance", f: MeshFailure) -> Any:
    """The actor's `__supervise__`, or None after failing the actor when it has none."""
    handler = getattr(a.instance, "__supervise__", None)
    if handler is None:
        _failed(a, f"unhandled failure of a mesh it owns: {f}", "", f)
    return handler


def _raised(a: "ActorInstance", f: MeshFailure, e: BaseException) -> None:
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    _failed(a, f"__supervise__ raised {type(e).__name__}: {e}", tb, f)


def _outcome(a: "ActorInstance", f: MeshFailure, handled: Any) -> None:
    if not handled and a.failed is None:
        _failed(a, f"failure of a mesh it owns not handled: {f}", "", f)


def _failed(a: "ActorInstance", cause: str, tb: str, f: MeshFailure) -> None:
    """The actor fails with the child's failure as cause; the endpoint it is running (if
    any) is cancelled and its caller gets a SupervisionError."""
    if a.failed is not None:
        return
    a._fail(cause, tb, caused_by=f)
    task = a.main_task
    if task is not None and not task.done():
        task.cancel()
