"""The controller side: the registry of paused actors and the operations on them.

Messages from actors arrive on the runtime's I/O thread; users (the notebook prompt, the
`%mesh debug` magic, the `monarch-debug` console) call the methods from their own threads.
"""

from __future__ import annotations

import collections
import linecache
import logging
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Literal, Optional, get_args

from ..transport.framing import Header
from . import settings
from .protocol import header, op_of
from .selectors import RankSelector, parse_selector

__all__ = [
    "NOTE_AFTER", "TICK_S", "SessionState", "session_state", "Session", "DebugError", "FrontEndHooks", "DebugRegistry", "install",
    "on_install", "current_registry", "get_registry",
]

log = logging.getLogger("runtime.debugging")

NOTE_AFTER = 1.0  # seconds a breakpoint waits unattended before a note is printed
TICK_S = 0.25  # how often sessions are checked (notes, timeouts, dead procs) while there are any


#: a debug session's life: paused (pdb waits for a line) <-> running (a line was sent) ->
#: ended (final: the actor went on, or its proc is gone)
SessionState = Literal["paused", "running", "ended"]


def session_state(value: object) -> SessionState:
    """A session's state as read from the wire (the admin endpoint's answers)."""
    for state in get_args(SessionState):
        if value == state:
            return state
    raise ValueError(f"not a debug session's state: {value!r}")


@dataclass
class Session:
    """One actor stopped in pdb (at a breakpoint, or post-mortem in a failed frame)."""

    sid: str
    addr: str
    kind: str = "breakpoint"
    mesh: str = ""
    rank: int = -1
    coords: dict = field(default_factory=dict)
    host: str = ""
    pid: int = 0
    proc_id: str = ""
    actor_id: str = ""
    port: int = 0
    endpoint: str = ""
    file: str = ""
    line: int = 0
    function: str = ""
    since: float = field(default_factory=time.time)
    state: SessionState = "paused"
    prompt: str = "(Pdb) "
    output: list = field(default_factory=list)
    attached: bool = False
    unattended_since: float = field(default_factory=time.monotonic)
    noted: bool = False
    end_reason: str = ""

    @property
    def label(self) -> str:
        return f"{self.mesh} rank {self.rank}"

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def coords_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.coords.items())

    def header_line(self) -> str:
        """The line shown when a prompt opens: mesh, rank, host, pid and location."""
        what = "post-mortem" if self.kind == "postmortem" else "breakpoint"
        coords = f" ({self.coords_text()})" if self.coords else ""
        fn = f" in {self.function}()" if self.function else ""
        return (f"--- {what}: mesh {self.mesh!r} rank {self.rank}{coords} on {self.host} "
                f"pid {self.pid}, at {self.where}{fn} ---")

    def describe(self) -> str:
        coords = f" ({self.coords_text()})" if self.coords else ""
        ep = f" {self.endpoint}()" if self.endpoint else ""
        age = time.time() - self.since
        return (f"{self.mesh} rank {self.rank}{coords}{ep} [{self.kind}, {self.state}] "
                f"at {self.where} on {self.host} pid {self.pid}, {age:.0f}s")

    def as_dict(self) -> dict:
        return {"sid": self.sid, "kind": self.kind, "mesh": self.mesh, "rank": self.rank,
                "coords": dict(self.coords), "host": self.host, "pid": self.pid,
                "proc_id": self.proc_id, "actor_id": self.actor_id, "port": self.port,
                "endpoint": self.endpoint, "file": self.file, "line": self.line,
                "function": self.function, "since": self.since, "state": self.state,
                "attached": self.attached}


class DebugError(RuntimeError):
    """A debugger operation that cannot be done (no such session, not paused, ...)."""


def _default_note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class FrontEndHooks:
    """Where a front-end (the Jupyter Debugger panel) plugs into the registry: `claim(s)`
    takes a new session (it is then attended there: no prompt, no unattended timeout),
    listeners hear `("paused" | "ended", session)` on the I/O thread (be quick), and
    `op_handlers[op](extra)` receive debug messages that are not a session's."""

    def __init__(self) -> None:
        self.claim: Optional[Callable[[Session], bool]] = None
        self.listeners: list[Callable[[str, Session], None]] = []
        self.op_handlers: dict[str, Callable[[dict], None]] = {}

    def _emit(self, what: str, s: Session) -> None:
        for fn in list(self.listeners):
            try:
                fn(what, s)
            except Exception:
                log.exception("debug session listener failed")

    def _claimed(self, s: Session) -> bool:
        try:
            return bool(self.claim is not None and self.claim(s))
        except Exception:
            log.exception("debug session claim failed")
            return False


class DebugRegistry(FrontEndHooks):
    """Thread-safe registry of paused sessions of one controller. A session unattended for
    `debug_timeout` seconds on `clock` (time.monotonic; tests pass theirs) meets the policy."""

    def __init__(self, rt: Any, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.rt = rt
        self.clock = clock
        self._cond = threading.Condition()
        self._sessions: dict[str, Session] = {}
        self._ticking = False  # `tick` runs every TICK_S while there are sessions
        self._pm_errors: dict[str, str] = {}
        self.notify: Callable[[str], None] = _default_note
        # (time, what, label, where): a short history for views
        self.events: collections.deque = collections.deque(maxlen=200)

    # -- I/O thread ------------------------------------------------------------------------
    def on_message(self, h: Header, body: Any, buffers: list) -> None:
        op = op_of(h)
        e = h.extra if isinstance(h.extra, dict) else {}
        if op == "source":
            _answer_source(self.rt, e)
            return
        if op in self.op_handlers:
            self.op_handlers[op](e)
            return
        sid = str(e.get("sid", ""))
        if not sid:
            log.warning("debug message %r without a session id dropped", op)
            return
        if op == "read":
            self._on_read(sid, e)
        elif op == "output":
            with self._cond:
                s = self._sessions.get(sid)
                if s is not None:
                    s.output.append(str(e.get("text", "")))
                    self._cond.notify_all()
        elif op == "resumed":
            self._on_resumed(sid, str(e.get("text", "")))
        elif op == "nopm":
            with self._cond:
                self._pm_errors[sid] = str(e.get("reason", "no failed frame"))
                self._cond.notify_all()
        else:
            log.warning("unexpected debug message %r dropped", op)

    def _on_read(self, sid: str, e: dict) -> None:
        addr = str(e.get("addr", ""))
        with self._cond:
            s = self._sessions.get(sid)
            new = s is None
            if s is None:
                s = Session(sid=sid, addr=addr, kind=str(e.get("kind", "breakpoint")),
                            mesh=str(e.get("mesh", "")), rank=int(e.get("rank", -1)),
                            coords=dict(e.get("coords") or {}), host=str(e.get("host", "")),
                            pid=int(e.get("pid", 0)), proc_id=str(e.get("proc_id", "")),
                            actor_id=str(e.get("actor_id", "")), port=int(e.get("port", 0)),
                            endpoint=str(e.get("endpoint", "")), unattended_since=self.clock())
                self._sessions[sid] = s
                s.attached = self._claimed(s)
                if not self._ticking:  # the checks run while there are sessions
                    self._ticking = True
                    self.rt.loop.call_soon(self.tick)
            s.file = str(e.get("file", s.file))
            s.line = int(e.get("line", s.line) or 0)
            s.function = str(e.get("function", s.function))
            s.prompt = str(e.get("prompt", s.prompt))
            if e.get("text"):
                s.output.append(str(e["text"]))
            was = s.state
            s.state = "paused"
            if not s.attached and was != "paused":
                s.unattended_since = self.clock()
            self._cond.notify_all()
        if addr:
            self.rt.send(addr, header("ack", sid=sid))
        if new:
            self.events.append((time.time(), "paused", s.label, s.where))
            _set_health(self.rt, s, paused=True)
        self._emit("paused", s)

    def _on_resumed(self, sid: str, text: str) -> None:
        with self._cond:
            s = self._sessions.pop(sid, None)
            if s is None:
                return
            if text:
                s.output.append(text)
            s.state = "ended"
            s.end_reason = s.end_reason or "continued"
            self._cond.notify_all()
        self.events.append((time.time(), "resumed", s.label, s.where))
        _set_health(self.rt, s, paused=False)
        self._emit("ended", s)

    def tick(self) -> None:
        """Every TICK_S while sessions last (I/O thread): notes, timeouts, dead procs."""
        self._ticking = bool(self._sessions)
        if self._ticking:
            self.rt.loop.call_later(TICK_S, self.tick)
        now = self.clock()
        dead: Collection[str] = getattr(self.rt, "dead_procs", ())
        notes, expired = [], []
        with self._cond:
            for s in list(self._sessions.values()):
                if s.proc_id in dead:
                    self._sessions.pop(s.sid, None)
                    s.state = "ended"
                    s.end_reason = "its process died"
                    self._cond.notify_all()
                    self._emit("ended", s)
                    continue
                if s.attached or s.state != "paused":
                    continue
                idle = now - s.unattended_since
                if idle >= min(NOTE_AFTER, settings.timeout()) and not s.noted:
                    s.noted = True
                    notes.append(s)
                if idle >= settings.timeout():
                    expired.append(s)
        for s in notes:
            self._note(f"monarch: {s.label} paused at {s.where} ({s.kind}); "
                       "run `%mesh debug` (or `monarch-debug`) to attach")
        for s in expired:
            pol = settings.policy()
            msg = (f"{s.kind} at {s.where} in {s.label} unattended for "
                   f"{settings.timeout():g} s (MONARCH_DEBUG_TIMEOUT)")
            log.warning("%s; policy %r", msg, pol)
            self._note(f"monarch: {msg}; {'the actor continues' if pol == 'continue' else 'failing the call'}")
            self.apply_policy(s, msg, pol)

    def _note(self, text: str) -> None:
        try:
            self.notify(text)
        except Exception:
            log.exception("debug note failed")

    # -- queries ---------------------------------------------------------------------------
    def sessions(self) -> list[Session]:
        """Every live session (paused or running a command), by mesh and rank."""
        with self._cond:
            return sorted(self._sessions.values(), key=lambda s: (s.mesh, s.rank, s.since))

    def paused(self) -> list[Session]:
        return [s for s in self.sessions() if s.state == "paused"]

    def has_unattended(self) -> bool:
        with self._cond:
            return any(s.state == "paused" and not s.attached for s in self._sessions.values())

    def get(self, sid: str) -> Optional[Session]:
        with self._cond:
            return self._sessions.get(sid)

    def find(self, rank: Optional[int] = None, mesh: Optional[str] = None) -> Session:
        """The session of `rank` (of `mesh` if given), or the oldest one; DebugError if none."""
        cands = self.sessions()
        if mesh is not None:
            cands = [s for s in cands if s.mesh == mesh]
        if rank is not None:
            cands = [s for s in cands if s.rank == rank]
        if not cands:
            what = " ".join(x for x in (f"mesh {mesh!r}" if mesh else "",
                                        f"rank {rank}" if rank is not None else "") if x)
            have = ", ".join(s.label for s in self.sessions()) or "none"
            raise DebugError(f"no paused actor{' with ' + what if what else ''} "
                             f"(paused: {have})")
        return cands[0]

    def select(self, selector: str | RankSelector, mesh: Optional[str] = None) -> list[Session]:
        sel = parse_selector(selector) if isinstance(selector, str) else selector
        return [s for s in self.sessions()
                if (mesh is None or s.mesh == mesh) and sel.matches(s.rank, s.coords)]

    # -- operations --------------------------------------------------------------------------
    def attach(self, s: Session) -> Session:
        with self._cond:
            if s.sid not in self._sessions:
                raise DebugError(f"{s.label} is no longer paused")
            s.attached = True
        return s

    def detach(self, s: Session, release: bool = False) -> None:
        """Stop attending `s`; with release=True the actor continues (breakpoints cleared)."""
        with self._cond:
            s.attached = False
            s.unattended_since = self.clock()
            s.noted = True
        if release and s.state != "ended":
            self.release(s, clear=True)

    def send_line(self, s: Session, line: str) -> None:
        """Give pdb of `s` one command line."""
        with self._cond:
            if s.state == "ended":
                raise DebugError(f"{s.label} is no longer paused")
            if s.state != "paused":
                raise DebugError(f"{s.label} is still running its last command")
            s.state = "running"
        self.rt.send(s.addr, header("input", sid=s.sid, line=line))

    def release(self, s: Session, clear: bool = False) -> None:
        """Let the actor continue (like pdb's `c`; `clear` also drops its breakpoints)."""
        with self._cond:
            if s.state == "ended":
                return
            s.state = "running"
        self.rt.send(s.addr, header("release", sid=s.sid, clear=bool(clear)))

    def abort(self, s: Session, reason: str) -> None:
        """Raise BreakpointWithoutDebugger(reason) in the actor: its call fails with it."""
        with self._cond:
            if s.state == "ended":
                return
            s.state = "running"
            s.end_reason = reason
            self._sessions.pop(s.sid, None)
            self._cond.notify_all()
        self.rt.send(s.addr, header("abort", sid=s.sid, reason=reason))
        _set_health(self.rt, s, paused=False)
        self._emit("ended", s)

    def apply_policy(self, s: Session, reason: str, pol: Optional[str] = None) -> None:
        """What happens to a breakpoint no one can attend: fail the call or continue."""
        pol = pol or settings.policy()
        if pol == "continue" or s.kind == "postmortem":
            self.release(s, clear=True)
        else:
            self.abort(s, f"{reason}; set MONARCH_DEBUG_POLICY=continue to continue instead")

    def wait(self, s: Session, timeout: Optional[float] = None,
             stop: Optional[Callable[[], bool]] = None) -> tuple[str, SessionState]:
        """Wait until `s` wants a line or ended (or `stop()` is true); returns (output, state)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while s.state == "running":
                if stop is not None and stop():
                    break
                left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
                if left <= 0:
                    break
                self._cond.wait(left)
            text = "".join(s.output)
            s.output.clear()
            return text, s.state

    def run_command(self, s: Session, line: str,
                    timeout: float = 30.0) -> tuple[str, SessionState]:
        """Send one line and wait for pdb's answer; returns (output, state)."""
        self.send_line(s, line)
        return self.wait(s, timeout)

    def cast(self, selector: str | RankSelector, command: str, mesh: Optional[str] = None,
             timeout: float = 30.0) -> list[tuple[Session, str, SessionState]]:
        """Send `command` to every paused session selected; [(session, output, state)]."""
        targets = [s for s in self.select(selector, mesh) if s.state == "paused"]
        if not targets:
            raise DebugError(f"no paused actor matches {selector}"
                             + (f" in mesh {mesh!r}" if mesh else ""))
        for s in targets:
            self.send_line(s, command)
        out = []
        for s in targets:
            text, state = self.wait(s, timeout)
            out.append((s, text, state))
        return out

    def continue_all(self, clear: bool = False) -> int:
        """Let every paused actor continue; returns how many."""
        n = 0
        for s in self.sessions():
            if s.state == "paused":
                self.release(s, clear=clear)
                n += 1
        return n

    def postmortem(self, actor_id: str, rank: int, timeout: float = 10.0) -> Session:
        """Open pdb in the frame where rank `rank` of actor mesh `actor_id` last failed."""
        rec = self.rt.actor_meshes.get(actor_id)
        if rec is None:
            raise DebugError(f"unknown actor mesh {actor_id!r}")
        if not 0 <= rank < len(rec.addresses):
            raise DebugError(f"rank {rank} out of range for mesh {rec.name!r} "
                             f"({len(rec.addresses)} ranks)")
        if rank in rec.failed:
            raise DebugError(f"rank {rank} of mesh {rec.name!r} has failed; its frames are gone")
        if rec.initialized is not None:
            rec.initialized.get(timeout)  # spawning is asynchronous: let the actors exist
        sid = f"pm-{uuid.uuid4().hex[:8]}"
        self.rt.send(rec.addresses[rank], header("postmortem", sid=sid, actor=actor_id))
        deadline = time.monotonic() + timeout
        with self._cond:
            while sid not in self._sessions and sid not in self._pm_errors:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DebugError(f"rank {rank} of mesh {rec.name!r} did not open a "
                                     f"post-mortem session within {timeout:g} s")
                self._cond.wait(min(left, 0.1))
            if sid in self._pm_errors:
                raise DebugError(f"no post-mortem for {rec.name!r} rank {rank}: "
                                 f"{self._pm_errors.pop(sid)}")
            return self._sessions[sid]


def _answer_source(rt: Any, e: dict) -> None:
    """A proc asks for the lines of a file it lacks: the controller's linecache answers."""
    name = str(e.get("file", ""))
    addr = str(e.get("addr", ""))
    lines = linecache.getlines(name) if name else []
    if addr:
        rt.send(addr, header("source_reply", req=int(e.get("req", 0)), lines=list(lines) or None))


_registry: Optional[DebugRegistry] = None
_lock = threading.Lock()
#: what each new registry is handed to as `install` makes it (`on_install`)
_installers: list[Callable[[DebugRegistry], Any]] = []


def on_install(fn: Callable[[DebugRegistry], Any]) -> None:
    """Call `fn(registry)` on every registry `install` makes from now on, before it is
    returned (the DAP client, `dap_client`, adds itself when imported; the package,
    `runtime.debugging`, imports it before it installs a registry)."""
    with _lock:
        if fn not in _installers:
            _installers.append(fn)


def _set_health(rt: Any, s: Session, paused: bool) -> None:
    """Show a breakpoint session's actor as paused (or busy again) in the health model."""
    if s.kind != "breakpoint":
        return
    try:
        from ..supervision.health import ActorState

        rec = rt.actor_meshes.get(s.actor_id)
        if rec is None or not rec.health_name:
            return
        rank = rec.proc_ids.index(s.proc_id) if s.proc_id in rec.proc_ids else s.rank
        rt.health.update(rec.health_name, rank, ActorState.PAUSED if paused else ActorState.BUSY,
                         detail=f"{'breakpoint at' if paused else 'continued from'} {s.where}",
                         endpoint=s.endpoint or None)
    except Exception:
        log.exception("health update for a debug session failed")


def install(rt: Any) -> DebugRegistry:
    """Create this controller's registry and route Kind.DEBUG messages to it (idempotent)."""
    global _registry
    from ..transport.framing import Kind

    with _lock:
        if _registry is not None and _registry.rt is rt:
            return _registry
        reg = DebugRegistry(rt)
        rt.register_handler(Kind.DEBUG, reg.on_message)
        _registry = reg
        for fn in list(_installers):  # the DAP client: structured requests, breakpoint pushes
            fn(reg)
        return reg


def current_registry() -> Optional[DebugRegistry]:
    """The registry made last in this process, or None (whatever runtime it serves; never
    makes one: the console's wait hook asks)."""
    return _registry


def get_registry(create: bool = True) -> Optional[DebugRegistry]:
    """The registry of this process's controller runtime (created on first use)."""
    from .._core import current_runtime, get_runtime

    rt = current_runtime()
    if rt is None or rt.closed:
        if not create:
            return None
        rt = get_runtime()
    if _registry is not None and _registry.rt is rt:
        return _registry
    if getattr(rt, "is_proc", False):
        return None
    return install(rt)
