"""The proc: a process that hosts actors. Each actor has its own thread, mailbox and asyncio
loop and handles one message at a time; the I/O thread keeps heartbeats going meanwhile.

Layer 6 (process roles): imports `_endpoints`, `_supervise`, actor, _core, transport
and the basics; the debugger (above) is installed through `runtime._features`.
"""

from __future__ import annotations

import bdb
import collections
import ctypes
import faulthandler
import inspect
import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback
import types
from typing import Any, Optional

from . import _context, _endpoints, _reload, _supervise, _features, logs, telemetry, timeline
from .actor import (ROOT_ID, ActorContext, CreatorInstance, _message_view, _set_context,
                    endpoints_of, root_creator)
from .config import config
from .errors import ActorError, SupervisionError
from .shapes import Point, Shape
from .supervision import MeshFailure
from .transport.framing import ERROR, OK, Header, Kind, extra_get
from .transport import bulk, cuda_tensors
from .transport.serialization import dumps, dumps_plain, loads

log = logging.getLogger("runtime.proc")

_STOP = "stop"
_tls = _context.local  # .actor: the running ActorInstance (read by runtime.actor too)


_heartbeat_fields: dict[str, Any] = {}


def add_heartbeat_field(name: str, fn: Any) -> None:
    """Report `fn()` under `name` with each heartbeat of this proc (called on the I/O
    thread; keep it cheap): how a part running in procs (the tensor engine's memory) reaches
    the controller's health model."""
    _heartbeat_fields[name] = fn


_call_hook: Any = None  # the debugger's: arms an actor thread while breakpoints are set


_error_hook: Any = None  # the debugger's: stops in a failed endpoint's frames (post-mortem)


def set_error_hook(fn: Any) -> None:
    """Call `fn(actor, exc)` on the actor's thread when an endpoint raised, before the
    caller hears of it (None: no hook, the default)."""
    global _error_hook
    _error_hook = fn


def set_call_hook(fn: Any) -> None:
    """Call `fn()` on the actor's thread at the start of every endpoint call (None: no
    hook, the default; the debugger installs one only while line breakpoints are set)."""
    global _call_hook
    _call_hook = fn


def current_actor() -> Optional["ActorInstance"]:
    """The ActorInstance whose thread is running (None outside actor threads)."""
    return getattr(_tls, "actor", None)


def _creator(d: Any) -> Optional[CreatorInstance]:
    """The spawner's description sent with SPAWN_ACTOR (None: the controller spawned it,
    Monarch's root client)."""
    if not d:
        return root_creator()
    if d["actor_id"] == ROOT_ID:
        return root_creator()
    return CreatorInstance(d["name"], d.get("cls"), Point(d["rank"], Shape(d["labels"], d["sizes"])),
                           d["actor_id"], _creator(d.get("creator")), d.get("qcls"))


class ActorInstance:
    """One actor in this proc: its thread, mailbox, state and counters."""

    def __init__(self, server: "ProcServer", h: Header, body: Any, buffers: list) -> None:
        e = h.extra or {}
        self.server = server
        self.rt = server.rt
        self.actor_id: str = h.actor
        self.name: str = e["name"]
        self.rank: int = e["rank"]
        self.shape = Shape(e["labels"], e["sizes"])
        self.class_name: Optional[str] = e.get("cls")
        self.qualified_class: Optional[str] = e.get("qcls")
        self.creator = _creator(e.get("creator"))
        self.owner_addr: str = h.reply
        self.mailbox: queue.SimpleQueue = _endpoints.Mailbox()
        self.state = "starting"
        self.endpoint: Optional[str] = None
        self.since = time.time()
        self.handled = 0
        self.errors = 0
        self.failed: Optional[str] = None
        self.abort_reason: Optional[str] = None  # set by context().actor_instance.abort()
        self.last_exception: Optional[BaseException] = None  # kept for post-mortem debugging
        self.current_port = -1
        self.current_reply = ""  # the caller's address while a call with a reply runs
        self.instance: Any = None
        self.context: Optional[ActorContext] = None  # set when its thread starts
        self.endpoints: dict = {}
        self._aloop: Any = None
        self.tasks: set = set()  # running @concurrent_endpoint tasks
        self.supervise_inbox = _supervise.SuperviseInbox()
        self.in_async = False  # an async endpoint runs on the event loop (it may await)
        self.main_task: Any = None  # that endpoint's task
        self.wake: Any = None  # set while the event loop runs tasks between messages
        self.waker = False  # whether mailbox.put wakes that loop
        self._spawn = (body, buffers)
        self.thread = threading.Thread(target=self._run, name=f"actor-{self.name}-{self.rank}",
                                       daemon=True)

    # -- thread body ---------------------------------------------------------------------------
    def _run(self) -> None:
        ctx = ActorContext(self.actor_id, self.name, Point(self.rank, self.shape),
                           self.rt.proc_id, self.rt.host, os.getpid(), self.class_name,
                           self.creator, self.qualified_class)
        self.context = ctx
        _set_context(ctx)
        _tls.actor = self
        logs.set_thread_label(self.name)
        self._init()
        mailbox = self.mailbox
        while True:
            if self._aloop is not None and _endpoints.loop_has_work(self):
                _endpoints.wait_idle(self)  # the actor's asyncio tasks run between messages
            item = mailbox.get()
            what = item[0]
            if what == "call":
                self._handle_call(item[1], item[2], item[3])
            elif what == "supervise":
                _supervise.on_mailbox_entry(self)
            elif what == "run":  # between two messages: a reload's pause, a class swap
                item[1](self)
            elif what == _STOP:
                self._stop(item[1])
                self.rt.loop.call_soon(self.server.actor_stopped, self)
                return
            del item  # free the message (its buffers) before waiting for the next one

    def _init(self) -> None:
        body, buffers = self._spawn
        self._spawn = None
        try:
            cls, args, kwargs = loads(body, buffers, serialized=True)
            self.endpoints = endpoints_of(cls)
            self.instance = cls.__new__(cls)
            init = self.instance.__init__(*args, **kwargs)
            if inspect.iscoroutine(init):
                self._run_coro(init)
        except BaseException as e:  # noqa: BLE001 - reported to the owner
            if self.server.stopping and isinstance(e, KeyboardInterrupt):
                self._set_state("stopped")  # its proc's stop interrupted it: no failure
                self.instance = None  # half made: no __cleanup__
                return
            tb = traceback.format_exc()
            self.failed = f"__init__ raised {type(e).__name__}: {e}"
            self._set_state("failed")
            self.rt.send(self.owner_addr, Header(Kind.ACTOR_FAILED, actor=self.actor_id,
                                                 rank=self.rank, extra={
                "cause": self.failed, "traceback": tb, "init": True}))
            return
        self._set_state("idle")
        self.rt.send(self.owner_addr, Header(Kind.ACTOR_READY, actor=self.actor_id,
                                             rank=self.rank))

    def _set_state(self, state: str, endpoint: Optional[str] = None) -> None:
        self.state = state
        self.endpoint = endpoint
        self.since = time.time()

    def event_loop(self) -> Any:
        """This actor's asyncio loop (made on first use; run only by its thread)."""
        if self._aloop is None:
            import asyncio

            self._aloop = asyncio.new_event_loop()
        return self._aloop

    def _run_coro(self, coro: Any) -> Any:
        return self.event_loop().run_until_complete(coro)

    def _run_endpoint(self, coro: Any) -> Any:
        """Run an async endpoint; supervision events are handled while it awaits."""
        loop = self.event_loop()
        self.main_task = task = loop.create_task(coro)
        self.in_async = True
        try:
            return loop.run_until_complete(task)
        finally:
            self.in_async = False
            self.main_task = None

    def _reply(self, h: Header, status: int, body: bytes, buffers: tuple = ()) -> None:
        """Answer a call: a result or an error to its reply address, on the same connection
        as (so in order with) everything else this proc sends the caller."""
        self.rt.send(h.reply, Header(Kind.REPLY, port=h.port, rank=self.rank, status=status,
                                     actor=self.actor_id, extra=_reply_extra(h)), body, buffers)

    def _reply_error(self, h: Header, exc: BaseException) -> None:
        try:
            body, bufs = dumps(exc)
        except Exception:
            body, bufs = dumps(ActorError(str(exc)))
        self._reply(h, ERROR, body, tuple(bufs))

    def _handle_call(self, h: Header, body: Any, buffers: list) -> None:
        if self.failed is not None:
            if h.port:
                self._reply_error(h, _endpoints.failed_reply(self, self.failed))
            return
        if self.instance is None and self._spawn is None:  # dropped: the proc is exiting
            if h.port:
                self._reply_error(h, ActorError(
                    f"actor {self.class_name} {self.name} is gone: its proc is exiting",
                    mesh=self.name, rank=self.rank, endpoint=h.method))
            return
        name = h.method
        ep = self.endpoints.get(name)
        if ep is None and h.extra is not None:
            ep = _endpoints.adhoc_endpoint(self, h)
        if ep is None:
            if h.port:
                self._reply_error(h, ActorError(
                    f"{type(self.instance).__name__} has no endpoint {name!r}",
                    mesh=self.name, rank=self.rank, endpoint=name))
            return
        self._set_state("busy", name)
        t0, errors0 = timeline.now_ns(), self.errors  # the timeline's record (%mesh timeline)
        self.current_port = h.port
        self.current_reply = h.reply if h.extra is None else extra_get(h, "caller", h.reply)
        ok = False
        result = None
        view = h.extra.get("view") if isinstance(h.extra, dict) else None
        token = _message_view.set(_view_shape(view) if view else None)
        try:
            args, kwargs = self._load_arguments(body, buffers, ep)
            if ep.explicit_response_port:
                args = (_endpoints.response_port(self, h), *args)
            if _call_hook is not None:
                _call_hook()
            if ep.concurrent:
                _endpoints.start_concurrent(self, ep, h, args, kwargs)
                return
            result = ep.fn(self.instance, *args, **kwargs)
            if type(result) is _COROUTINE:  # inspect.iscoroutine, without its frame
                result = self._run_endpoint(result)
            ok = not ep.explicit_response_port
        except BaseException as e:  # noqa: BLE001 - delivered to the caller
            self.report_error(h, ep, e)
        finally:
            _message_view.reset(token)
            self.current_port = -1
            self.handled += 1
            timeline.record_call(t0, name, self.name, self.rank,
                                 self.errors != errors0 or self.failed is not None)
            if self.failed is None:
                self._set_state("idle")
        if ok and h.port:
            if self.failed is not None:  # __supervise__ failed it meanwhile
                self._reply_error(h, _endpoints.failed_reply(self, self.failed))
            else:
                self._send_result(h, name, result)
        if self.abort_reason is not None and self.failed is None:  # context().abort()
            self._fail(f"actor {self.class_name} {self.name} aborted: {self.abort_reason}")

    def _load_arguments(self, body: Any, buffers: list, ep: Any) -> tuple:
        """Unpickle a call's (args, kwargs); a CUDA tensor this proc cannot take is a clear
        error naming the argument and this proc."""
        try:
            return loads(body, buffers, serialized=True)
        except cuda_tensors.CUDAUnavailableError as e:
            with cuda_tensors.lenient():
                args, kwargs = loads(body, buffers, serialized=True)
            culprit = cuda_tensors.name_argument(ep.fn, args, kwargs)
            what = f"argument {culprit[0]}" if culprit else "an argument"
            raise cuda_tensors.CUDAUnavailableError(
                f"{what} of {ep.name}() is a CUDA tensor ({culprit[1] if culprit else e.desc})"
                f" but proc {self.rt.proc_id} (rank {self.rank} of {self.name} on "
                f"{self.rt.host}) has no CUDA device; send .cpu() or use procs with GPUs",
                e.desc) from None

    def report_error(self, h: Header, ep: Any, e: BaseException) -> None:
        """An endpoint raised `e`: an ActorError to the caller, or the actor fails (no
        caller, an explicit-response-port endpoint, or a BaseException like SystemExit)."""
        if self.failed is not None:  # it failed meanwhile (__supervise__): say so
            if h.port:
                self._reply_error(h, _endpoints.failed_reply(self, self.failed))
            return
        if _error_hook is not None:
            _error_hook(self, e)
        name = ep.name
        self.errors += 1
        self.last_exception = e
        tb = _user_traceback(e)
        if _endpoints.is_fatal(ep, e):
            cause = f"{name}() raised {type(e).__name__}: {e}"
            kind = "Exception" if isinstance(e, Exception) else "BaseException"
            self._fail(cause, tb, call=f"Actor call {self.name}.{name} failed with {kind}")
            if h.port:
                self._reply_error(h, _endpoints.failed_reply(self, cause))
            return
        err = ActorError(f"{type(e).__name__}: {e}", remote_traceback=tb,
                         exception_type=type(e).__name__, mesh=self.name, rank=self.rank,
                         endpoint=name)
        if h.port:
            self._reply_error(h, err)
        else:
            self._fail(f"{name}() raised {type(e).__name__}: {e} (no caller to receive it)", tb)

    def _send_result(self, h: Header, name: str, result: Any) -> None:
        """Reply with an endpoint's return value (or why it cannot travel)."""
        encoded = encode_result(self, h, name, result)
        if encoded is not None:
            self._reply(h, OK, *encoded)

    def _fail(self, cause: str, tb: str = "", caused_by: Optional[MeshFailure] = None,
              call: str = "") -> None:
        self.failed = cause
        self._set_state("failed")
        body = b""
        if caused_by is not None:
            try:
                body, _ = dumps(caused_by)
            except Exception:
                body = b""
        extra = {"cause": cause, "traceback": tb, "call": call}
        self.rt.send(self.owner_addr, Header(Kind.ACTOR_FAILED, actor=self.actor_id,
                                             rank=self.rank, extra=extra), body)

    def _stop(self, h: Optional[Header]) -> None:
        _endpoints.cancel_all(self)  # concurrent endpoint tasks end before __cleanup__
        # children first: meshes this actor owns
        for obj in list(self.rt.meshes(internal=True)):
            if getattr(obj, "_owner_actor", None) == self.actor_id and hasattr(obj, "_stop_now"):
                try:
                    obj._stop_now(timeout=config.stop_timeout)
                except Exception:
                    log.exception("stopping a child mesh failed")
        cleanup = getattr(self.instance, "__cleanup__", None)
        if cleanup is not None and self.instance is not None:
            try:
                r = cleanup(None)
                if inspect.iscoroutine(r):
                    self._run_coro(r)
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
        self._set_state("stopped")
        if h is not None and h.reply:
            self.rt.send(h.reply, Header(Kind.ACTOR_STOPPED, actor=self.actor_id, rank=self.rank))
            if h.port:
                self._reply(h, OK, dumps(None)[0])
        if self._aloop is not None:
            _endpoints.cancel_all(self, every_task=True)
            self._aloop.close()

    def stop_self(self, reason: str) -> None:
        """context().actor_instance.stop(): queue this actor's own stop behind the message it
        is handling; its owner learns the rank stopped (ACTOR_STOPPED), not failed."""
        log.info("actor %s[%d] stops itself: %s", self.name, self.rank, reason)
        self.mailbox.put((_STOP, Header(Kind.STOP_ACTOR, actor=self.actor_id, rank=self.rank,
                                        reply=self.owner_addr)))

    def interrupt(self) -> None:
        """Raise KeyboardInterrupt in this actor's thread at its next Python instruction."""
        tid = self.thread.ident
        if tid is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid),
                                                       ctypes.py_object(KeyboardInterrupt))


_COROUTINE = types.CoroutineType


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
        return {Kind.LOG_LEVEL: self._on_log_level, Kind.CALL: self._on_call, Kind.SPAWN_ACTOR: self._on_spawn,
                Kind.STOP_ACTOR: self._on_stop_actor, Kind.STOP_PROC: self._on_stop_proc,
                Kind.DUMP_STACK: self._on_dump_stack, Kind.INTERRUPT: self._on_interrupt,
                Kind.TIMELINE: self._on_timeline,
                Kind.WORKSPACE: lambda h, b, bufs: _reload.on_message(self, h, b, bufs)}

    def _on_call(self, h: Header, body: Any, buffers: list) -> None:
        a = self.actors.get(h.actor)
        if a is not None:
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
                                rank=h.rank if rank is None else rank, extra=_reply_extra(h)),
                         dumps(SupervisionError(
                             f"actor {h.actor} {why}"))[0])

    def _expire_early(self, actor_id: str) -> None:
        for h, _, _ in self.early.pop(actor_id, ()):
            self._no_actor(h)

    def _on_spawn(self, h: Header, body: Any, buffers: list) -> None:
        if h.actor in self.actors:
            return
        a = ActorInstance(self, h, body, buffers)
        self.actors[h.actor] = a
        for item in self.early.pop(h.actor, ()):
            a.mailbox.put(("call",) + item)
        a.thread.start()

    def _on_stop_actor(self, h: Header, body: Any, buffers: list) -> None:
        a = self.actors.get(h.actor)
        if a is not None:
            a.mailbox.put((_STOP, h))
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
        a.mailbox.put((_STOP, None))
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

    def _on_interrupt(self, h: Header, body: Any, buffers: list) -> None:
        for a in self.actors.values():
            if a.state == "busy" and (h.port == 0 or a.current_port == h.port):
                a.interrupt()

    def deliver_to_actor(self, actor_id: str, failure: MeshFailure) -> bool:
        a = self.actors.get(actor_id)
        if a is None:
            return False
        _supervise.deliver(self, a, failure)
        return True

    def flush_supervision(self) -> None:
        """Hand every pending failure to its actor now (I/O thread; before a reply resolves)."""
        if self.supervise_waiting:
            for a in list(self.supervise_waiting.values()):
                _supervise.flush(a)

    def sizes(self) -> dict[str, int]:
        """Entries in this proc's actor tables (soak tests)."""
        return {"actors": len(self.actors), "stopped_actor_ids": len(self.stopped_actors),
                "early_calls": len(self.early), "stops_due": len(self.stops_due),
                "threads": threading.active_count()}

    def heartbeat_extra(self) -> dict:
        actors = {a.actor_id: [a.state, a.endpoint, a.since, a.handled, a.errors]
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
            a.mailbox.put((_STOP, None))
        deadline = time.monotonic() + config.stop_timeout / 2
        for a in list(self.actors.values()):
            a.thread.join(max(0.0, deadline - time.monotonic()))
        self.stopping = True
        for a in list(self.actors.values()):
            if a.thread.is_alive():  # still busy: KeyboardInterrupt runs its `finally` blocks
                a.interrupt()
                a.thread.join(1.0)
        self.stopped.set()


_last_view = threading.local()  # .got: (view, its Shape) of this actor thread's last call


def _view_shape(view: list) -> Shape:
    """The Shape of a call's view (`context().message_rank`): the last one again when the
    view is the same (a caller's calls come through one view)."""
    last = getattr(_last_view, "got", None)
    if last is not None and last[0] == view:
        return last[1]
    shape = Shape(*view)
    _last_view.got = (view, shape)
    return shape


def _reply_extra(h: Header) -> Optional[dict]:
    """What a reply echoes of its call's header: the batch id of a call whose replies a
    host agent gathers (runtime/host/gather.py), else nothing."""
    if h.extra is None:
        return None
    g = extra_get(h, "g")
    return None if g is None else {"g": g}


def _user_traceback(e: BaseException) -> str:
    """The traceback of `e` without the runtime's own frames at its top, nor a debugger's
    frames (bdb and what it called) below the user's line where a breakpoint raised."""
    tb = e.__traceback__
    ours = (__file__, _endpoints.__file__)
    while tb is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    te = traceback.TracebackException(type(e), e, tb)
    cut = next((i for i, f in enumerate(te.stack) if f.filename == bdb.__file__), None)
    if cut:
        te.stack = traceback.StackSummary.from_list(te.stack[:cut])
    return "".join(te.format())


def dump_stacks() -> str:
    """The stack of every thread of this process, faulthandler-style but readable."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    out = [f"Process {os.getpid()}:"]
    for tid, frame in frames.items():
        out.append(f"\nThread {names.get(tid, tid)} ({tid}):")
        out.extend(ln.rstrip("\n") for ln in traceback.format_stack(frame))
    return "\n".join(out) + "\n"


def encode_result(actor: "ActorInstance", h: Header, name: str,
                  result: Any) -> Optional[tuple[bytes, tuple]]:
    """(body, buffers) of an endpoint's return value for the reply to `h`, or None after
    replying with why it cannot travel. Over the message limit, its large buffers stay on
    this proc's data plane for the caller (runtime/transport/bulk.py)."""
    plain = dumps_plain(result)  # plain data: no buffers, no CUDA tensors to see to
    if plain is not None and len(plain) <= config.max_message_bytes:
        return plain, ()
    caller = h.reply if h.extra is None else extra_get(h, "caller", h.reply)
    keep: Optional[list] = [] if str(caller).startswith("ipc://") else None  # same host
    try:
        with cuda_tensors.sending(keep, release_on_pull=True):  # one receiver: it drops
            data, bufs = dumps(result, f"the return value of {name}()")
    except Exception as e:
        cuda_tensors.release(keep or [])
        actor.errors += 1
        actor._reply_error(h, ActorError(
            f"endpoint {name}() returned a value that cannot be pickled: {e}",
            mesh=actor.name, rank=actor.rank, endpoint=name))
        return None
    total = len(data) + sum(memoryview(b).nbytes for b in bufs)
    if total > config.max_message_bytes:
        moved = bulk.offload(data, bufs, config.max_message_bytes, drop_on_read=True)
        if moved is None:
            cuda_tensors.release(keep or [])
            actor._reply_error(h, ActorError(
                f"endpoint {name}() returned {total} bytes, over the message limit of "
                f"{config.max_message_bytes}, and its pickled part alone is too large to "
                "leave its arrays on the data plane", mesh=actor.name, rank=actor.rank,
                endpoint=name))
            return None
        data, bufs, _ = moved  # the caller drops each buffer once it has read it
    return data, tuple(bufs)


def _graceful_exit(server: ProcServer, timeout: float) -> None:
    """Before the proc exits: drop the actors (their `__del__` runs), run the `atexit`
    handlers, then drop the globals of the user's modules (`__del__` of objects they hold
    runs, as interpreter finalization would), all within `timeout` seconds (the proc exits
    anyway after that, with os._exit)."""
    import atexit
    import gc

    def run() -> None:
        for a in list(server.actors.values()):
            a.instance = a.last_exception = None  # a traceback would keep the instance alive
        gc.collect()
        try:
            atexit._run_exitfuncs()
        except BaseException:  # noqa: BLE001 - the proc is exiting anyway
            traceback.print_exc()
        gc.collect()  # what the atexit handlers held
        try:
            _drop_user_module_globals()
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        gc.collect()

    t = threading.Thread(target=run, name="monarch-atexit", daemon=True)
    t.start()
    t.join(timeout)


def _drop_user_module_globals() -> None:
    """Set the globals of the user's modules to None, as finalization does, so objects they
    hold are collected. The runtime's own modules and libraries stay intact: the I/O thread
    still runs."""
    for name in user_modules():
        d = getattr(sys.modules.get(name), "__dict__", None)
        for k in list(d or ()):
            if not (k.startswith("__") and k.endswith("__")):
                d[k] = None


def user_modules() -> list[str]:
    """The names of the loaded modules that are the user's code: not Python's, not in an
    installed distribution (wherever it was installed: a venv, `pip install --target` on
    PYTHONPATH), not this project's."""
    import importlib.metadata
    import sysconfig

    dirs = [*sysconfig.get_paths().values(), sys.prefix, sys.base_prefix]
    keep = {os.path.normpath(p) + os.sep for p in dirs}
    keep |= {os.path.realpath(p) + os.sep for p in dirs}
    here = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep
    keep |= {here + pkg + os.sep for pkg in ("runtime", "monarch_kernel", "monarch_widgets")}
    kept = tuple(keep)
    out = []
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if name == "__main__" or not isinstance(f, str) or f.startswith(kept) or \
                os.path.realpath(f).startswith(kept):
            continue
        out.append(name)
    if not out:
        return out
    try:  # reads every installed distribution's metadata (~0.1 s): only when needed
        installed = set(importlib.metadata.packages_distributions())
    except Exception:  # noqa: BLE001 - a broken distribution: the paths alone decide
        installed = set()
    installed |= set(getattr(sys, "stdlib_module_names", ()))
    return [n for n in out if n.partition(".")[0] not in installed]


def _cpu_list(text: str) -> set[int]:
    """A kernel CPU list ("0-3,8") as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _apply_proc_bind() -> None:
    """`spawn_procs(proc_bind=...)`: pin this proc to CPUs, or to a NUMA node's CPUs."""
    spec = os.environ.pop("MONARCH_PROC_BIND", "")
    if not spec:
        return
    import json

    bind = json.loads(spec)
    cpus = _cpu_list(bind["cpus"]) if "cpus" in bind else set()
    for node in filter(None, bind.get("cpunodebind", "").split(",")):
        with open(f"/sys/devices/system/node/node{int(node)}/cpulist") as f:
            cpus |= _cpu_list(f.read())
    if cpus:
        os.sched_setaffinity(0, cpus)


def _run_bootstrap(data: str) -> None:
    """Run the `spawn_procs(bootstrap=...)` callable (base64 cloudpickle from the controller
    that spawned this proc) before the proc says hello; if it raises, the proc exits 1."""
    if not data:
        return
    import asyncio
    import base64
    import pickle

    try:
        fn = pickle.loads(base64.b64decode(data))
        r = fn()
        if inspect.iscoroutine(r):
            asyncio.run(r)
    except BaseException:  # noqa: BLE001 - reported, then the proc fails to start
        print("bootstrap failed:", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def main(cfg: dict) -> None:
    """Entry point of a forked proc (called by the zygote in the child)."""
    from ._core import Runtime, set_runtime
    from ._core.roles import ProcRole
    from .transport import auth

    sys.stdout = logs.TaggedWriter(1, "<stdout>")
    sys.stderr = logs.TaggedWriter(2, "<stderr>")
    faulthandler.enable(file=sys.stderr, all_threads=True)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, force=True,
                        format="%(levelname)s %(name)s: %(message)s")
    _apply_proc_bind()
    if cfg.get("workspace"):  # the host's synced workspace, first on sys.path
        _reload.startup(cfg["workspace"])
    _run_bootstrap(os.environ.pop("MONARCH_PROC_BOOTSTRAP", ""))
    keys = None
    if cfg.get("key_file"):
        keys = auth.read_key_file(cfg["key_file"])
    server = ProcServer(None, cfg)
    role = ProcRole(server, cfg.get("agent", ""), cfg.get("host_id", ""))
    rt = Runtime(proc_id=cfg["proc_id"], token=bytes.fromhex(cfg["token"]), rundir=cfg["rundir"],
                 owner_address=cfg["owner"], keys=keys, role=role, start=False)
    server.rt = rt
    set_runtime(rt)
    _features.call("debugging.install_in_proc", rt)  # debugging is above this layer
    telemetry.start_in_proc(cfg["proc_id"], cfg.get("mesh", ""), cfg.get("rank", 0))
    if cfg.get("listen_ip") and keys is not None:
        rt.enable_tcp(cfg["listen_ip"])
    rt.start()
    rt.send(cfg["owner"], Header(Kind.HELLO, extra={"pid": os.getpid(), "host": rt.host,
                                                    "address": rt.address,
                                                    "tcp": rt.tcp_address}))
    signal.signal(signal.SIGTERM, lambda *_: server.stopped.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    server.stopped.wait()  # SIGTERM's handler or a STOP_PROC sets it
    _graceful_exit(server, config.stop_timeout / 2)
    telemetry.shutdown(timeout=config.stop_timeout / 2)  # os._exit skips OpenTelemetry's atexit
    try:
        rt.loop.stop(timeout=1.0)
        rdma_server = sys.modules.get("runtime.rdma.server")
        if rdma_server is not None and rdma_server.current_server() is not None:
            rdma_server.current_server().close()  # its directory (os._exit skips atexit)
    finally:
        sys.stdout.flush()
        os._exit(0)
