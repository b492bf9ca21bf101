"""An actor in a proc (`ActorInstance`): its thread, mailbox and asyncio loop, its state
and counters, how it handles a call (arguments, the endpoint, the reply or the error), how
it fails and stops; and the debugger's hooks into its thread.

Layer 6 (process roles, under `_server`): imports `_endpoints`, `_supervise`,
`_replies`, actor, _core's basics, transport and the basics.
"""

from __future__ import annotations

import bdb
import collections
import ctypes
import inspect
import logging
import os
import sys
import queue
import threading
import time
import traceback
import types
from typing import Any, Literal, Optional

from .. import logs, timeline
from ..stacks import CCallWatch
from ..future import waiting_in
from .._base import context as _context
from .._base import features as _features
from . import _endpoints, _supervise
from ._replies import UnsendableResult, encode_result, reply_extra
from ..actor import (ROOT_ID, ActorContext, CreatorInstance, message_view,
                    endpoints_of, root_creator)
from ..config import config
from ..errors import ActorError
from ..shapes import Point, Shape
from ..supervision import MeshFailure
from ..supervision import injection as _injection
from ..transport.framing import ERROR, OK, Header, Kind, extra_get
from ..transport import cuda_tensors
from ..transport.serialization import dumps, loads

__all__ = [
    "ActorStatus", "STOP", "set_error_hook", "set_call_hook", "current_actor", "ActorInstance", "Confirmations",
]

log = logging.getLogger("runtime.proc")

#: the mailbox entry that stops an actor
STOP = "stop"

#: what an actor is doing, as its heartbeats report it (the values of the health model's
#: `supervision.health.ActorState`): starting (in `__init__`) -> idle <-> busy (in an
#: endpoint) <-> paused (in a debugger); failed and stopped are final
ActorStatus = Literal["starting", "idle", "busy", "paused", "failed", "stopped"]
_tls = _context.local  # .actor: the running ActorInstance (read by runtime.actor too)


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

    def __init__(self, server: Any, h: Header, body: Any, buffers: list) -> None:
        """An actor of `server` (the proc's `ProcServer`, which creates it) for SPAWN_ACTOR
        `h`, whose body and buffers are its class and arguments (unpickled on its thread)."""
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
        #: inject_actor_failures' rules it was spawned under (passed on to its spawns)
        self.injection: Optional[dict] = _injection.parse(e.get("inject"))
        self.injector = _supervise.Injector(self, self.injection)
        self.owner_addr: str = h.reply
        self.mailbox: queue.SimpleQueue = _endpoints.Mailbox()
        self.state: ActorStatus = "starting"
        self.endpoint: Optional[str] = None
        self.since = time.time()
        self.handled = 0
        self.errors = 0
        self.failed: Optional[str] = None
        self.abort_reason: Optional[str] = None  # set by context().actor_instance.abort()
        self.last_exception: Optional[BaseException] = None  # kept for post-mortem debugging
        self.current_port = -1
        self.current_src = ""  # the caller's id while a call runs
        self.current_reply = ""  # the caller's address while a call with a reply runs
        self.taken = Confirmations(self)  # messages without an answer, told to their senders
        #: calls wanting an answer not yet handled ((caller, port) -> (endpoint, reply to)),
        #: the latest handled (endpoint, reply to, end): lost ones (proc/_reattach.py)
        self.calls_open: dict = {}
        self.calls_done: collections.deque = collections.deque(maxlen=256)
        self.instance: Any = None
        self.context: Optional[ActorContext] = None  # set when its thread starts
        self.endpoints: dict = {}
        self.aloop = _endpoints.ActorLoop(self.mailbox)  # its asyncio loop and tasks
        self.c_watch = CCallWatch()  # a handler blocked in a C call (waiting_on)
        self.supervision = _supervise.Supervision(self)  # failures of meshes it owns
        self._spawn: Optional[tuple[Any, list]] = (body, buffers)
        self.thread = threading.Thread(target=self._run, name=f"actor-{self.name}-{self.rank}",
                                       daemon=True)

    # -- thread body ---------------------------------------------------------------------------
    def _run(self) -> None:
        ctx = ActorContext(self.actor_id, self.name, Point(self.rank, self.shape),
                           self.rt.proc_id, self.rt.host, os.getpid(), self.class_name,
                           self.creator, self.qualified_class)
        self.context = ctx
        _context.set_context(ctx)
        _tls.actor = self
        logs.set_thread_label(self.name)
        self._init()
        mailbox = self.mailbox
        while True:
            if self.aloop.has_work():
                self.aloop.wait_idle()  # the actor's asyncio tasks run between messages
            item = mailbox.get()
            what = item[0]
            if what == "call":
                h = item[1]
                self._handle_call(h, item[2], item[3])
                if h.extra is not None and "taken" in h.extra:  # no answer comes back:
                    self.taken.took(h.extra["taken"])  # its sender hears that it was taken
            elif what == "supervise":
                self.supervision.on_mailbox_entry()
            elif what == "run":  # between two messages: a reload's pause, a class swap
                item[1](self)
            elif what == STOP:
                self._stop(item[1])
                self.rt.loop.call_soon(self.server.actor_stopped, self)
                return
            del item  # free the message (its buffers) before waiting for the next one
            if self.taken.counts and mailbox.empty():  # nothing more to take now: say so
                self.taken.flush()

    def _init(self) -> None:
        assert self._spawn is not None  # set by __init__, taken once, here
        body, buffers = self._spawn
        self._spawn = None
        try:
            cls, args, kwargs = loads(body, buffers, serialized=True)
            self.endpoints = endpoints_of(cls)
            self.instance = cls.__new__(cls)
            init = self.instance.__init__(*args, **kwargs)
            if inspect.iscoroutine(init):
                self.aloop.run(init)
        except BaseException as e:  # noqa: BLE001 - reported to the owner
            if self.server.stopping and isinstance(e, KeyboardInterrupt):
                self.set_state("stopped")  # its proc's stop interrupted it: no failure
                self.instance = None  # half made: no __cleanup__
                return
            tb = traceback.format_exc()
            self.failed = f"__init__ raised {type(e).__name__}: {e}"
            self.set_state("failed")
            self.rt.send(self.owner_addr, Header(Kind.ACTOR_FAILED, actor=self.actor_id,
                                                 rank=self.rank, extra={
                "cause": self.failed, "traceback": tb, "init": True}))
            return
        self.set_state("idle")
        self.rt.send(self.owner_addr, Header(Kind.ACTOR_READY, actor=self.actor_id,
                                             rank=self.rank))
        self.injector.start()  # inject_actor_failures: its rolls, if its class is named

    def set_state(self, state: ActorStatus, endpoint: Optional[str] = None) -> None:
        """What the actor is doing now (its heartbeats report it): "idle", "busy" (in
        `endpoint`), "paused" (in a debugger), "failed", "stopped"."""
        self.state = state
        self.endpoint = endpoint
        self.since = time.time()

    def event_loop(self) -> Any:
        """This actor's asyncio loop (made on first use; run only by its thread)."""
        return self.aloop.get()

    def _reply(self, h: Header, status: int, body: bytes, buffers: tuple = ()) -> None:
        """Answer a call: a result or an error to its reply address, on the same connection
        as (so in order with) everything else this proc sends the caller."""
        self.rt.send(h.reply, Header(Kind.REPLY, port=h.port, rank=self.rank, status=status,
                                     actor=self.actor_id, extra=reply_extra(h)), body, buffers)

    def _reply_error(self, h: Header, exc: BaseException) -> None:
        """Answer a call with an error. One that cannot be pickled, or is over the message
        limit, goes as an ActorError with its text (cut to fit); one that cannot be sent at
        all is logged: the actor's thread goes on either way."""
        try:
            body, bufs = dumps(exc)
            if len(body) + sum(memoryview(b).nbytes for b in bufs) > config.max_message_bytes:
                raise ValueError("over the message limit")
        except Exception:
            text = str(exc)
            room = max(1024, config.max_message_bytes // 2 - 4096)
            if len(text) > room:
                text = text[:room] + f"... ({len(text) - room} more characters)"
            body, bufs = dumps(ActorError(text, mesh=self.name, rank=self.rank,
                                          endpoint=h.method))
        try:
            self._reply(h, ERROR, body, tuple(bufs))
        except Exception:  # noqa: BLE001 - the actor's thread must survive its reply
            log.exception("%s rank %d: the error reply to %s could not be sent", self.name,
                          self.rank, h.method)

    def _handle_call(self, h: Header, body: Any, buffers: list) -> None:
        try:
            self._handle_call_inner(h, body, buffers)
        finally:
            if h.port and self.calls_open.pop((h.src, h.port), None) is not None:
                self.calls_done.append((h.method, h.reply, time.monotonic()))

    def _handle_call_inner(self, h: Header, body: Any, buffers: list) -> None:
        if self.failed is not None:
            if h.port:
                self._reply_error(h, _endpoints.failed_reply(self, self.failed))
            return
        if h.port and self.server.was_cancelled(h.src, h.port):
            return  # cancelled while it waited here (Future.cancel()): not run
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
        self.set_state("busy", name)
        t0, errors0 = timeline.now_ns(), self.errors  # the timeline's record (%mesh timeline)
        self.current_port = h.port
        self.current_src = h.src
        self.current_reply = h.reply if h.extra is None else extra_get(h, "caller", h.reply)
        ok = False
        result = None
        view = h.extra.get("view") if isinstance(h.extra, dict) else None
        token = message_view.set(_view_shape(view) if view else None)
        try:
            args, kwargs = self._load_arguments(body, buffers, ep)
            if ep.explicit_response_port:
                args = (_endpoints.response_port(self, h), *args)
            if _call_hook is not None:
                _call_hook()
            self.injector.maybe_raise()  # inject_actor_failures(mode="raise") hit it
            if ep.concurrent:
                self.aloop.start(self._run_concurrent(ep, h, ep.fn(self.instance, *args, **kwargs)),
                                 ep.name)
                return
            result = ep.fn(self.instance, *args, **kwargs)
            if type(result) is _COROUTINE:  # inspect.iscoroutine, without its frame
                result = self.aloop.run_endpoint(result)
            ok = not ep.explicit_response_port
        except BaseException as e:  # noqa: BLE001 - delivered to the caller
            self.report_error(h, ep, e)
        finally:
            message_view.reset(token)
            self.current_port = -1
            self.handled += 1
            timeline.record_call(t0, name, self.name, self.rank,
                                 self.errors != errors0 or self.failed is not None)
            if self.failed is None:
                self.set_state("idle")
        if ok and h.port:
            if self.failed is not None:  # __supervise__ failed it meanwhile
                self._reply_error(h, _endpoints.failed_reply(self, self.failed))
            else:
                self._send_result(h, name, result)
        if self.abort_reason is not None and self.failed is None:  # context().abort()
            self.fail(f"actor {self.class_name} {self.name} aborted: {self.abort_reason}")

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
            self.fail(cause, tb, call=f"Actor call {self.name}.{name} failed with {kind}")
            if h.port:
                self._reply_error(h, _endpoints.failed_reply(self, cause))
            return
        err = ActorError(f"{type(e).__name__}: {e}", remote_traceback=tb,
                         exception_type=type(e).__name__, mesh=self.name, rank=self.rank,
                         endpoint=name)
        if h.port:
            self._reply_error(h, err)
        else:
            self.fail(f"{name}() raised {type(e).__name__}: {e} (no caller to receive it)", tb)

    async def _run_concurrent(self, ep: Any, h: Header, coro: Any) -> None:
        """A `@concurrent_endpoint` call, a task on the actor's loop: its result or error
        to the caller; an error with no caller (or a fatal one) fails the actor, as in
        Monarch."""
        import asyncio  # here, not at import: most procs never need it

        try:
            result = await coro
        except asyncio.CancelledError:
            if h.port and not ep.explicit_response_port:
                self._reply_error(h, ActorError(f"{ep.name}() was cancelled (the actor stopped)",
                                                mesh=self.name, rank=self.rank, endpoint=ep.name))
            raise
        except BaseException as e:  # noqa: BLE001 - to the caller, or the actor fails
            self.report_error(h, ep, e)
            return
        if h.port and not ep.explicit_response_port:
            self._send_result(h, ep.name, result)

    def _send_result(self, h: Header, name: str, result: Any) -> None:
        """Reply with an endpoint's return value (or why it cannot travel)."""
        try:
            encoded = encode_result(h, name, result, self.name, self.rank)
        except UnsendableResult as e:
            if e.unpicklable:
                self.errors += 1
            self._reply_error(h, e.error)
            return
        body, bufs, left = encoded
        try:
            self._reply(h, OK, body, bufs)
        except Exception as e:  # noqa: BLE001 - the caller hears why, the thread goes on
            self._reply_error(h, ActorError(
                f"endpoint {name}() returned a value that could not be sent: "
                f"{type(e).__name__}: {e}", mesh=self.name, rank=self.rank, endpoint=name))
            return
        if left:
            self._wait_taken(h, left)

    def _wait_taken(self, h: Header, left: list) -> None:
        """An answer left on the data plane is sent once its caller has read it: wait for
        that (the caller drops each buffer after reading it), so that an answer whose send
        returned counts even if this proc dies next (docs/transport.md, promise 2). Ends
        early if the caller is known dead or this proc is stopping."""
        caller = h.src
        for buf in left:
            while not buf.wait_dropped(0.1):
                if caller in self.rt.dead_procs or self.server.stopping:
                    return

    def fail(self, cause: str, tb: str = "", caused_by: Optional[MeshFailure] = None,
             call: str = "", injected: bool = False) -> None:
        """The actor fails for good: its owner hears why (ACTOR_FAILED, with the child's
        failure that caused it, if any); later calls get a SupervisionError."""
        self.failed = cause
        self.set_state("failed")
        body = b""
        if caused_by is not None:
            try:
                body, _ = dumps(caused_by)
            except Exception:
                body = b""
        extra: dict[str, Any] = {"cause": cause, "traceback": tb, "call": call}
        if injected:
            extra["injected"] = True
        self.rt.send(self.owner_addr, Header(Kind.ACTOR_FAILED, actor=self.actor_id,
                                             rank=self.rank, extra=extra), body)

    def _stop(self, h: Optional[Header]) -> None:
        self.aloop.cancel_all()  # concurrent endpoint tasks end before __cleanup__
        # children first: meshes this actor owns
        _features.call("meshes.stop_owned", self.rt, self.actor_id, config.stop_timeout)
        cleanup = getattr(self.instance, "__cleanup__", None)
        if cleanup is not None and self.instance is not None:
            try:
                r = cleanup(None)
                if inspect.iscoroutine(r):
                    self.aloop.run(r)
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
        self.set_state("stopped")
        if h is not None and h.reply:
            self.rt.send(h.reply, Header(Kind.ACTOR_STOPPED, actor=self.actor_id, rank=self.rank))
            if h.port:
                self._reply(h, OK, dumps(None)[0])
        self.aloop.close()

    def stop_self(self, reason: str) -> None:
        """context().actor_instance.stop(): queue this actor's own stop behind the message it
        is handling; its owner learns the rank stopped (ACTOR_STOPPED), not failed."""
        log.info("actor %s[%d] stops itself: %s", self.name, self.rank, reason)
        self.mailbox.put((STOP, Header(Kind.STOP_ACTOR, actor=self.actor_id, rank=self.rank,
                                        reply=self.owner_addr)))

    def waiting_on(self) -> Optional[dict]:
        """What this actor's thread is blocked on now, for a diagnosis (`runtime.diagnose`):
        a call (its actor mesh and ranks), another future (its label), an async endpoint's
        await, a C call it is blocked in (since the last heartbeat at least: a sleep, a
        lock, I/O; "c" names it), or None (running code, or idle)."""
        fut = waiting_in(self.thread.ident)
        if fut is None:
            if self._at_await():
                return {"label": "an await in its async endpoint"}
            c = self.c_watch.sample(self.thread.ident, self.since)
            return {"label": f"a C call ({c['kind']})", "c": c} if c is not None else None
        for port in fut.reply_ports:
            w = self.rt.ports.waiter(port)
            target = getattr(w, "target", None)
            if target is not None:
                return target()
        return {"label": fut.label or "a future"}

    def _at_await(self) -> bool:
        """Whether this actor's thread waits in its asyncio loop now (an async endpoint at
        an await), not running code (which may be sync code inside an async endpoint, such
        as a %%mesh cell's)."""
        tid = self.thread.ident
        if not self.aloop.in_async or tid is None:
            return False
        frame = sys._current_frames().get(tid)
        name = frame.f_code.co_filename if frame is not None else ""
        return os.sep + "asyncio" + os.sep in name or name.endswith("selectors.py")

    def interrupt(self, cancel: bool = False) -> None:
        """Raise KeyboardInterrupt in this actor's thread at its next Python instruction;
        `cancel`: a running async endpoint is cancelled at its next await instead."""
        if cancel and self._at_await() and self.aloop.cancel_running():
            return
        tid = self.thread.ident
        if tid is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid),
                                                       ctypes.py_object(KeyboardInterrupt))


class Confirmations:
    """An actor's count of the messages without an answer (broadcast, send) it took, per
    sender, until it tells the sender (TAKEN: they leave its call window): once a quarter of
    the window was taken, or when nothing more waits in the mailbox (one message per batch,
    not per message). Only the actor's thread uses it."""

    def __init__(self, actor: "ActorInstance") -> None:
        self.actor = actor
        self.counts: dict[str, int] = {}  # sender's address -> taken since it was told

    def took(self, sender: Any) -> None:
        """One more message from `sender` (the address its TAKEN goes to) was handled."""
        if not isinstance(sender, str):
            return
        n = self.counts.get(sender, 0) + 1
        if n < config.mailbox_limit // 4 and not self.actor.mailbox.empty():
            self.counts[sender] = n
            return
        self.counts.pop(sender, None)
        self._tell(sender, n)

    def flush(self) -> None:
        """Tell every sender what was taken of its messages so far."""
        for sender in list(self.counts):
            self._tell(sender, self.counts.pop(sender))

    def _tell(self, sender: str, n: int) -> None:
        a = self.actor
        try:
            a.rt.send(sender, Header(Kind.TAKEN, actor=a.actor_id, rank=a.rank, extra={"n": n}))
        except Exception:  # noqa: BLE001 - the sender is gone: nothing waits on it
            log.debug("%s rank %d: TAKEN to %s not sent", a.name, a.rank, sender)


_COROUTINE = types.CoroutineType


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
