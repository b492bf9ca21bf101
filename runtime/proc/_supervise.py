"""How an actor receives supervision events (`Supervision`), and fails on purpose under
`inject_actor_failures` (`Injector`); private, used by
`_actor_instance`).

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
import logging
import os
import queue
import random
import threading
import time
import traceback
from typing import Any, Literal, Optional, Protocol

from ..errors import InjectedFault
from ..supervision import MeshFailure

__all__ = ["BATCH_QUIET_S", "BATCH_MAX_S", "ActorLoopPort", "SupervisedActor", "Supervision",
           "Injector"]

log = logging.getLogger("runtime.proc")

#: failures of one actor's meshes are handed over once none has arrived for this long...
BATCH_QUIET_S = 0.25
#: ...or at the latest this long after the first of the batch
BATCH_MAX_S = 1.0


class ActorLoopPort(Protocol):
    """What supervision does on an actor's event loop (its `_endpoints.ActorLoop`)."""

    main_task: Any  # the async endpoint running, if any

    def get(self) -> Any: ...

    def run(self, coro: Any) -> Any: ...

    def call_while_awaiting(self, fn: Any, *args: Any) -> None: ...


class SupervisedActor(Protocol):
    """What Supervision and Injector use of the actor they serve (the proc's ActorInstance,
    which makes them): who it is, its state, mailbox and event loop, its proc (`server`:
    the failures waiting there, whether it is stopping, its runtime's loop and ports),
    marking it busy in `__supervise__` and idle after, and failing it."""

    @property
    def server(self) -> Any: ...

    @property
    def rt(self) -> Any: ...

    @property
    def actor_id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def rank(self) -> int: ...

    @property
    def class_name(self) -> Optional[str]: ...

    @property
    def qualified_class(self) -> Optional[str]: ...

    @property
    def state(self) -> str: ...

    @property
    def failed(self) -> Optional[str]: ...

    @property
    def instance(self) -> Any: ...

    @property
    def injector(self) -> "Injector": ...

    @property
    def mailbox(self) -> queue.SimpleQueue: ...

    @property
    def aloop(self) -> ActorLoopPort: ...

    def set_state(self, state: Literal["idle", "busy"], endpoint: Optional[str] = None
                  ) -> None: ...

    def fail(self, cause: str, tb: str = "", caused_by: Optional[MeshFailure] = None,
             call: str = "", injected: bool = False) -> None: ...


class Supervision:
    """One actor's supervision events and their delivery: `pending` (I/O thread only), then
    `ready` (handed to the actor thread, under `lock`), then `__supervise__` on each."""

    def __init__(self, actor: SupervisedActor) -> None:
        self.actor = actor
        self.lock = threading.Lock()
        self.pending: list[MeshFailure] = []
        self.ready: collections.deque = collections.deque()
        self.first_at = 0.0  # when the first and the last pending failure arrived
        self.last_at = 0.0

    # -- I/O thread ---------------------------------------------------------------------------
    def deliver(self, failure: MeshFailure) -> None:
        """Queue a failure (I/O thread); handed over after the batch window, or before the
        next reply this proc resolves."""
        a = self.actor
        server = a.server
        self.last_at = now = time.monotonic()
        if not self.pending:
            self.first_at = now
            server.rt.loop.call_later(BATCH_QUIET_S, self._flush_when_quiet)
        self.pending.append(failure)
        server.supervise_waiting[a.actor_id] = a
        server.rt.ports.before_resolve = server.flush_supervision

    def _flush_when_quiet(self) -> None:
        """Hand the batch over once no failure came for BATCH_QUIET_S (failures of ranks
        that fail together arrive close together), or BATCH_MAX_S after its first."""
        if not self.pending:
            return
        now = time.monotonic()
        due = min(self.last_at + BATCH_QUIET_S, self.first_at + BATCH_MAX_S)
        if now + 0.001 >= due:
            self.flush()
        else:
            self.actor.server.rt.loop.call_later(due - now, self._flush_when_quiet)

    def flush(self) -> None:
        """Hand the pending failures over in rank order (I/O thread): a mailbox entry, and
        a wake-up of the actor's event loop if an async endpoint is awaiting there."""
        a = self.actor
        a.server.supervise_waiting.pop(a.actor_id, None)
        if not self.pending:
            return
        batch = sorted(self.pending, key=_order)
        self.pending.clear()
        with self.lock:
            self.ready.extend(batch)
        a.mailbox.put(("supervise",))
        a.aloop.call_while_awaiting(self._start_in_loop)

    # -- the actor's thread -------------------------------------------------------------------
    def _next(self) -> Optional[MeshFailure]:
        with self.lock:
            return self.ready.popleft() if self.ready else None

    def on_mailbox_entry(self) -> None:
        """Between messages: run `__supervise__` on every failure handed over."""
        a = self.actor
        while a.failed is None:
            f = self._next()
            if f is None:
                return
            handler = self._handler(f)
            if handler is None:
                continue
            a.set_state("busy", "__supervise__")
            try:
                handled = handler(f)
                if inspect.iscoroutine(handled):
                    handled = a.aloop.run(handled)
            except BaseException as e:  # noqa: BLE001 - fails the actor
                self._raised(f, e)
                continue
            finally:
                if a.failed is None:
                    a.set_state("idle")
            self._outcome(f, handled)

    def _start_in_loop(self) -> None:
        """In the actor's event loop while an async endpoint awaits: handle the failures."""
        if self.actor.failed is None and self.ready:
            self.actor.aloop.get().create_task(self._handle_in_loop())

    async def _handle_in_loop(self) -> None:
        while self.actor.failed is None:
            f = self._next()
            if f is None:
                return
            handler = self._handler(f)
            if handler is None:
                continue
            try:
                handled = handler(f)
                if inspect.iscoroutine(handled):
                    handled = await handled
            except BaseException as e:  # noqa: BLE001 - fails the actor
                self._raised(f, e)
                continue
            self._outcome(f, handled)

    def _handler(self, f: MeshFailure) -> Any:
        """The actor's `__supervise__`, or None after failing the actor when it has none."""
        handler = getattr(self.actor.instance, "__supervise__", None)
        if handler is not None and self.actor.injector.supervisor and not f.is_injected:
            return _not_handled  # inject_actor_failures(supervisors=...): a real fault
        if handler is None:
            self._failed(f"unhandled failure of a mesh it owns: {f}", "", f)
        return handler

    def _raised(self, f: MeshFailure, e: BaseException) -> None:
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        self._failed(f"__supervise__ raised {type(e).__name__}: {e}", tb, f)

    def _outcome(self, f: MeshFailure, handled: Any) -> None:
        if not handled and self.actor.failed is None:
            self._failed(f"failure of a mesh it owns not handled: {f}", "", f)

    def _failed(self, cause: str, tb: str, f: MeshFailure) -> None:
        """The actor fails with the child's failure as cause; the endpoint it is running (if
        any) is cancelled and its caller gets a SupervisionError."""
        a = self.actor
        if a.failed is not None:
            return
        a.fail(cause, tb, caused_by=f)
        task = a.aloop.main_task
        if task is not None and not task.done():
            task.cancel()


class Injector:
    """`inject_actor_failures` in one actor: whether its class fails on purpose (rolls on
    the I/O thread every interval; a hit fails it between messages, `is_injected`), and
    whether its `__supervise__` sees injected failures only."""

    def __init__(self, actor: SupervisedActor, rules: Optional[dict]) -> None:
        self.actor = actor
        qcls = actor.qualified_class or ""
        self.policy: Optional[list] = ((rules or {}).get("policies") or {}).get(qcls)
        self.supervisor = qcls in ((rules or {}).get("supervisors") or [])
        #: mode "raise": a hit makes the next endpoint call raise InjectedFault
        self.raise_next = False
        #: why, for a raise armed from outside (`arm_raise`, e.g. by `%mesh chaos --raise`)
        self.raise_reason = ""
        self.rng = random.Random(os.urandom(16))  # procs forked alike: not one sequence

    def start(self) -> None:
        """After `__init__` (the actor's thread): the first roll in one interval."""
        if self.policy is not None:
            self.actor.rt.loop.schedule(self._arm)

    def _arm(self) -> None:
        assert self.policy is not None
        self.actor.rt.loop.call_later(self.policy[1], self._roll)

    def _roll(self) -> None:
        """One roll (I/O thread): a hit queues the failure behind the current message."""
        a = self.actor
        if a.failed is not None or a.state == "stopped" or a.server.stopping:
            return
        assert self.policy is not None
        if self.rng.random() < self.policy[0]:
            if len(self.policy) > 2 and self.policy[2] == "raise":
                self.raise_next = True  # the actor lives on: keep rolling
                self._arm()
                return
            a.mailbox.put(("run", Injector._fail))
        else:
            self._arm()

    def arm_raise(self, reason: str) -> bool:
        """`runtime.inject_raise` (the I/O thread): the next endpoint call raises
        InjectedFault naming `reason`; False when the actor is failed or stopping."""
        a = self.actor
        if a.failed is not None or a.state == "stopped" or a.server.stopping:
            return False
        self.raise_next, self.raise_reason = True, reason
        return True

    def maybe_raise(self) -> None:
        """At the start of an endpoint call (the actor's thread): after a "raise" hit,
        raise InjectedFault there (once)."""
        if self.raise_next:
            self.raise_next = False
            reason, self.raise_reason = self.raise_reason, ""
            a = self.actor
            log.warning("injecting a raise: %s[%d]", a.name, a.rank)
            if reason:
                raise InjectedFault(f"injected failure: {reason} raised in actor "
                                    f"{a.class_name} {a.name} (rank {a.rank}); the actor "
                                    "lives on")
            raise InjectedFault(f"injected failure: periodic chaos check raised in actor "
                                f"{a.class_name} {a.name} (rank {a.rank}); the actor lives on")

    @staticmethod
    def _fail(a: SupervisedActor) -> None:
        """Fail the actor on purpose (its thread): its owner hears `is_injected`."""
        if a.failed is None and a.state != "stopped":
            log.warning("injecting actor failure: %s[%d]", a.name, a.rank)
            a.fail(f"injected failure: periodic chaos check selected actor {a.class_name} "
                   f"{a.name} (rank {a.rank})", injected=True)


def _not_handled(f: MeshFailure) -> bool:
    """A chaos supervisor's answer to a failure that was not injected: not handled."""
    return False


def _order(f: MeshFailure) -> tuple:
    return (f.mesh, f.ranks[0] if f.ranks else -1)
