"""The proc's dispatcher (`ProcServer`): actor traffic to the actors of this proc on the I/O
thread (spawns, calls, stops, interrupts, stack dumps, timelines), its tables of live and
stopped actors, and what its heartbeats carry.

Layer 6 (process roles, under `proc`): imports `_actor_instance`, `_reload`, `_replies`
and the layers below.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import sys
import threading
import time
import traceback
from typing import Any

from .. import logs, timeline
from . import _reattach, _reload
from ._actor_instance import STOP, ActorInstance
from ._replies import reply_extra
from ..config import config
from ..errors import SupervisionError
from ..supervision import MeshFailure
from ..transport.framing import ERROR, OK, Header, Kind, extra_get
from ..transport.serialization import dumps

__all__ = ["add_heartbeat_field", "ProcServer", "dump_stacks"]

log = logging.getLogger("runtime.proc")


_heartbeat_fields: dict[str, Any] = {}


def add_heartbeat_field(name: str, fn: Any) -> None:
    """Report `fn()` under `name` with each heartbeat of this proc (called on the I/O
    thread; keep it cheap): how a part running in procs (the tensor engine's memory) reaches
    the controller's health model."""
    _heartbeat_fields[name] = fn


class ProcServer:
    """Dispatches actor traffic to the actors of this proc (on the I/O thread).

    A call can overtake the spawn of its actor when the two come from different threads
    (each thread sends on its own sockets): a call to an actor id not seen yet waits here,
    up to `config.stop_timeout`, for the spawn; a call to a stopped actor is answered at once.
    """

    def __init__(self, rt: Any, cfg: dict) -> None:
        self.rt = rt
        self.cfg = cfg
        self.actors: dict[str, ActorInstance] = {}
        self.stopped_actors: collections.OrderedDict = collections.OrderedDict()
        self.early: dict[str, list] = {}  # actor id -> calls that came before its spawn
        #: (caller id, port) of calls cancelled before they ran (Future.cancel()), latest 1,024
        self.cancelled: collections.OrderedDict = collections.OrderedDict()
        # actor id -> [(deadline, STOP_ACTOR header)]: stops the actor has not finished; an
        # entry leaves when the actor stops, so a stopped actor is not kept for the timeout
        self.stops_due: dict[str, list] = {}
        self._stop_check_armed = False
        self.supervise_waiting: dict[str, ActorInstance] = {}  # actors with pending failures
        self.stopped = threading.Event()
        self.stopping = False  # stop() has begun interrupting the actors still busy
        self._proc = None
        try:
            import psutil

            self._proc = psutil.Process()
            self._proc.cpu_percent(None)
        except Exception:
            pass

    def _on_log_level(self, h: Header, body: Any, buffers: list) -> None:
        level = int((h.extra or {}).get("level", logging.INFO))
        logs.set_actor_log_level(level)
        logging.getLogger().setLevel(level)

    def handlers(self) -> dict:
        """Message kind -> handler, for the proc's runtime."""
        return {Kind.LOG_LEVEL: self._on_log_level, Kind.CALL: self._on_call, Kind.SPAWN_ACTOR: self.on_spawn,
                Kind.STOP_ACTOR: self._on_stop_actor, Kind.STOP_PROC: self._on_stop_proc,
                Kind.DUMP_STACK: self._on_dump_stack, Kind.INTERRUPT: self._on_interrupt,
                Kind.TIMELINE: self._on_timeline, Kind.INJECT: self._on_inject,
                Kind.REATTACH: lambda h, b, bufs: _reattach.on_reattach(self, h),
                Kind.WORKSPACE: lambda h, b, bufs: _reload.on_message(self, h, b, bufs)}

    def _on_call(self, h: Header, body: Any, buffers: list) -> None:
        a = self.actors.get(h.actor)
        if a is not None:
            if h.port:
                a.calls_open[(h.src, h.port)] = (h.method, h.reply)
            a.mailbox.put(("call", h, body, buffers))
            return
        if h.actor not in self.stopped_actors:
            early = self.early.get(h.actor)
            if early is None:
                early = self.early[h.actor] = []
                self.rt.loop.call_later(config.stop_timeout, self._expire_early, h.actor)
            early.append((h, body, buffers))
            return
        self._no_actor(h)

    def _no_actor(self, h: Header) -> None:
        if h.port:
            why = (f"was stopped in proc {self.rt.proc_id}\nSupervision event: actor "
                   f"{h.actor} has status:\n  stopped"  # Monarch's words
                   if h.actor in self.stopped_actors
                   else f"does not exist in proc {self.rt.proc_id}")
            rank = self.stopped_actors.get(h.actor)  # a cast's header has no rank (-1)
            self.rt.send(h.reply,
                         Header(Kind.REPLY, port=h.port, status=ERROR,
                                rank=h.rank if rank is None else rank, extra=reply_extra(h)),
                         dumps(SupervisionError(
                             f"actor {h.actor} {why}"))[0])

    def _expire_early(self, actor_id: str) -> None:
        for h, _, _ in self.early.pop(actor_id, ()):
            self._no_actor(h)

    def on_spawn(self, h: Header, body: Any, buffers: list) -> None:
        if h.actor in self.actors:
            return
        ranks = extra_get(h, "ranks")  # cast to many procs at once: each finds its rank
        if isinstance(ranks, dict):
            rank = ranks.get(self.rt.proc_id)
            if not isinstance(rank, int):
                log.warning("a SPAWN_ACTOR of %s names no rank for this proc; dropped",
                            h.actor)
                return
            h.rank = rank
            h.extra = {k: v for k, v in h.extra.items() if k != "ranks"}
            h.extra["rank"] = rank
        a = ActorInstance(self, h, body, buffers)
        self.actors[h.actor] = a
        for item in self.early.pop(h.actor, ()):
            a.mailbox.put(("call",) + item)
        a.thread.start()

    def _on_stop_actor(self, h: Header, body: Any, buffers: list) -> None:
        a = self.actors.get(h.actor)
        if a is not None:
            a.mailbox.put((STOP, h))
            if h.reply:
                deadline = time.monotonic() + config.stop_timeout + 1.0
                self.stops_due.setdefault(h.actor, []).append((deadline, h))
                self._arm_stop_check()
        elif h.reply:  # already gone (it stopped itself): answer as a stop would
            self._answer_stop(h)

    def _answer_stop(self, h: Header) -> None:
        self.rt.send(h.reply, Header(Kind.ACTOR_STOPPED, actor=h.actor, rank=h.rank))
        if h.port:
            self.rt.send(h.reply, Header(Kind.REPLY, port=h.port, rank=h.rank, status=OK,
                                         actor=h.actor), dumps(None)[0])

    def _arm_stop_check(self) -> None:
        """One timer, at the earliest deadline of the stops not finished (I/O thread)."""
        if self.stops_due and not self._stop_check_armed:
            first = min(due[0][0] for due in self.stops_due.values())
            self._stop_check_armed = True
            self.rt.loop.call_later(max(0.0, first - time.monotonic()), self._check_stops)

    def _check_stops(self) -> None:
        """Give up the actors whose stop is overdue; re-arm for the others (I/O thread)."""
        self._stop_check_armed = False
        now = time.monotonic()
        for actor_id, due in list(self.stops_due.items()):
            a = self.actors.get(actor_id)
            if a is None:
                self.stops_due.pop(actor_id, None)
            elif due[0][0] <= now:
                self._stop_overdue(a)
        self._arm_stop_check()

    def _stop_overdue(self, a: "ActorInstance") -> None:
        """An actor still not stopped after the stop timeout (its `__init__` or an endpoint
        never returns) is given up: declared stopped now, so the stop completes; its thread
        stops (running `__cleanup__`) if it ever gets free (I/O thread)."""
        stops = self.stops_due.get(a.actor_id, ())
        log.warning("actor %s[%d] did not stop within %.1f s (%s); declared stopped, its "
                    "thread is left to end on its own", a.name, a.rank, config.stop_timeout,
                    "still in __init__" if a.state == "starting" else f"state {a.state}")
        self.actor_stopped(a)  # forgets it and answers the calls queued for it
        a.mailbox.put((STOP, None))
        for _, h in stops:
            self._answer_stop(h)

    def actor_stopped(self, a: "ActorInstance") -> None:
        """An actor's thread ended: forget it, remember its id, and answer the calls that
        reached its mailbox after the stop (I/O thread)."""
        self.actors.pop(a.actor_id, None)
        self.stops_due.pop(a.actor_id, None)
        self.stopped_actors[a.actor_id] = a.rank  # replies for it still name its rank
        while len(self.stopped_actors) > 1024:  # a bounded memory of stopped ids
            self.stopped_actors.popitem(last=False)
        while True:
            try:
                item = a.mailbox.get_nowait()
            except queue.Empty:
                return
            if item[0] == "call":
                self._no_actor(item[1])

    def _on_stop_proc(self, h: Header, body: Any, buffers: list) -> None:
        threading.Thread(target=self.stop, name="monarch-stop", daemon=True).start()

    def _on_dump_stack(self, h: Header, body: Any, buffers: list) -> None:
        self.rt.send(h.reply, Header(Kind.REPLY, port=h.port), dump_stacks().encode())

    def _on_timeline(self, h: Header, body: Any, buffers: list) -> None:
        self.rt.send(h.reply, Header(Kind.REPLY, port=h.port),
                     timeline.encode(int(extra_get(h, "since", 0) or 0)))

    def _on_inject(self, h: Header, body: Any, buffers: list) -> None:
        """`runtime.inject_raise`: the actor's next endpoint call raises InjectedFault;
        answers whether it was armed (False: no such live actor here)."""
        a = self.actors.get(h.actor)
        armed = a is not None and a.injector.arm_raise(str(extra_get(h, "reason", "") or ""))
        if h.port:
            self.rt.send(h.reply, Header(Kind.REPLY, port=h.port, rank=h.rank, status=OK,
                                         extra={"armed": bool(armed)}))

    def _on_interrupt(self, h: Header, body: Any, buffers: list) -> None:
        """Ctrl-C in a caller's wait, or `Future.cancel()` (`cancel`): the actors serving the
        call on `h.port` from `h.src` are interrupted; a cancelled call still queued is
        dropped when its turn comes (`cancelled`)."""
        cancel = bool(extra_get(h, "cancel"))
        if cancel and h.port:
            self.cancelled[(h.src, h.port)] = None
            while len(self.cancelled) > 1024:
                self.cancelled.popitem(last=False)
        for a in self.actors.values():
            if a.state == "busy" and (h.port == 0 or (a.current_port == h.port and
                                                      a.current_src in ("", h.src))):
                a.interrupt(cancel)

    def was_cancelled(self, src: str, port: int) -> bool:
        """Whether the call from `src` on `port` was cancelled before it ran (taken: asked
        once, by the actor about to run it)."""
        if not self.cancelled:
            return False
        return self.cancelled.pop((src, port), False) is None

    def deliver_to_actor(self, actor_id: str, failure: MeshFailure) -> bool:
        a = self.actors.get(actor_id)
        if a is None:
            return False
        a.supervision.deliver(failure)
        return True

    def flush_supervision(self) -> None:
        """Hand every pending failure to its actor now (I/O thread; before a reply resolves)."""
        if self.supervise_waiting:
            for a in list(self.supervise_waiting.values()):
                a.supervision.flush()

    def sizes(self) -> dict[str, int]:
        """Entries in this proc's actor tables (soak tests)."""
        return {"actors": len(self.actors), "stopped_actor_ids": len(self.stopped_actors),
                "early_calls": len(self.early), "stops_due": len(self.stops_due),
                "threads": threading.active_count()}

    def heartbeat_extra(self) -> dict:
        actors = {a.actor_id: [a.state, a.endpoint, a.since, a.handled, a.errors,
                               a.mailbox.qsize(), a.waiting_on() if a.state == "busy" else None]
                  for a in self.actors.values() if a.state != "starting"}
        extra: dict = {"actors": actors}
        if self._proc is not None:
            try:
                extra["cpu"] = self._proc.cpu_percent(None)
                extra["rss"] = self._proc.memory_info().rss
            except Exception:
                pass
        torch = sys.modules.get("torch")
        if torch is not None:
            try:
                # is_initialized() first: is_available() would start the CUDA driver, which
                # fixes CUDA_VISIBLE_DEVICES for good (runtime.spmd changes it before that)
                if torch.cuda.is_initialized() and torch.cuda.is_available():
                    extra["gpu"] = int(torch.cuda.memory_allocated())
            except Exception:
                pass
        for name, fn in list(_heartbeat_fields.items()):
            try:
                extra[name] = fn()
            except Exception:  # a probe's failure must not stop heartbeats
                log.debug("heartbeat field %s failed", name, exc_info=True)
        return extra

    def stop(self) -> None:
        """Stop every actor (running __cleanup__), then exit the process."""
        for a in list(self.actors.values()):
            a.mailbox.put((STOP, None))
        deadline = time.monotonic() + config.stop_timeout / 2
        for a in list(self.actors.values()):
            a.thread.join(max(0.0, deadline - time.monotonic()))
        self.stopping = True
        for a in list(self.actors.values()):
            if a.thread.is_alive():  # still busy: KeyboardInterrupt runs its `finally` blocks
                a.interrupt()
                a.thread.join(1.0)
        self.stopped.set()


def dump_stacks() -> str:
    """The stack of every thread of this process, faulthandler-style but readable."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    out = [f"Process {os.getpid()}:"]
    for tid, frame in frames.items():
        out.append(f"\nThread {names.get(tid, tid)} ({tid}):")
        out.extend(ln.rstrip("\n") for ln in traceback.format_stack(frame))
    return "\n".join(out) + "\n"
