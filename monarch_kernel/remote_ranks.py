"""Paused remote ranks as DAP threads for the Jupyter Debugger panel.

Each paused actor (a session of the runtime's debug registry) is a thread named
`trainers[2] @ host`. Stock JupyterLab shows one stopped thread at a time, so one rank has
the focus: it gets the `stopped` event; the others wait in a queue (listed by `threads` and
`debugInfo`) and get theirs when the focused one continues. Ids of remote threads, frames
and variables count up from 2**52: disjoint from debugpy's small ids and ipykernel's id()
references, below JavaScript's largest safe integer. Frame and variable ids of a rank are
dropped each time it runs again.
"""

from __future__ import annotations

import itertools
import logging
import threading
from typing import Any, Callable, Optional

__all__ = ["REMOTE_BASE", "PROMOTE_DELAY", "STEP_COMMANDS", "thread_name", "RemoteRanks"]

log = logging.getLogger("monarch_kernel.debugger")

REMOTE_BASE = 1 << 52
PROMOTE_DELAY = 0.3  # seconds between a rank's `continued` and the next rank's `stopped`
STEP_COMMANDS = {"next": "next", "stepIn": "step", "stepOut": "return"}


def thread_name(s: Any) -> str:
    """`mesh[rank] @ host`: how a paused rank is listed among the panel's threads."""
    return f"{s.mesh}[{s.rank}] @ {s.host}"


class RemoteRanks:
    """The remote side of the panel: paused ranks, their ids, the focus, the events."""

    def __init__(self, send_event: Callable[[dict], None]) -> None:
        self.send_event = send_event
        self.enabled = False
        self._lock = threading.RLock()
        self._ids = itertools.count(REMOTE_BASE)
        self.tids: dict[str, int] = {}  # session id -> thread id
        self.sessions: dict[int, Any] = {}  # thread id -> Session
        self.frames: dict[int, tuple[str, int]] = {}  # frame id -> (sid, frame index)
        self.refs: dict[int, tuple[str, int]] = {}  # variables reference -> (sid, remote ref)
        self.focus: Optional[int] = None
        self.stepping: set = set()  # sids running a step command
        self.step_out: set = set()  # sids running the panel's step out
        self.reg: Any = None

    # -- wiring to the runtime's registry ------------------------------------------------------
    def wire(self) -> Any:
        """Attach to the running controller's debug registry (None if no runtime runs)."""
        from runtime.debugging import get_registry

        reg = get_registry(create=False)
        if reg is not None and reg is not self.reg:
            self.reg = reg
            reg.claim = lambda s: self.enabled
            reg.listeners.append(self.on_session)
            for s in reg.paused():  # paused before the panel came on
                self.on_session("paused", s)
        return reg

    def client(self) -> Any:
        from runtime.debugging import get_dap_client

        self.wire()
        return get_dap_client()

    @staticmethod
    def is_remote(ident: Any) -> bool:
        return isinstance(ident, int) and ident >= REMOTE_BASE

    # -- registry events (runtime I/O thread: be quick) ---------------------------------------
    def on_session(self, what: str, s: Any) -> None:
        if not self.enabled and what == "paused":
            return
        events: list[dict] = []
        with self._lock:
            if what == "paused":
                self._forget_ids(s.sid)
                tid = self.tids.get(s.sid)
                if tid is None:
                    tid = self.tids[s.sid] = next(self._ids)
                    self.sessions[tid] = s
                if s.sid in self.step_out and "--Return--" in "".join(s.output):
                    # pdb's `return` stops at the return event: one more step reaches
                    # the caller, where the panel's step out lands
                    self.step_out.discard(s.sid)
                    s.output.clear()
                    self.reg.send_line(s, "next")
                    return
                self.step_out.discard(s.sid)
                reason = "step" if s.sid in self.stepping else \
                    "exception" if s.kind == "exception" else "breakpoint"
                self.stepping.discard(s.sid)
                if self.focus is None or self.focus == tid:
                    self.focus = tid
                    events.append(self._stopped(tid, reason))
            else:
                tid = self.tids.pop(s.sid, None)
                if tid is None:
                    return
                self.sessions.pop(tid, None)
                self._forget_ids(s.sid)
                self.stepping.discard(s.sid)
                events.append({"event": "continued", "type": "event", "seq": 0,
                               "body": {"threadId": tid, "allThreadsContinued": False}})
                if self.focus == tid:
                    self.focus = None
                    # JupyterLab clears its view when the `continue` reply arrives, after
                    # this event may have come: show the next rank a moment later
                    t = threading.Timer(PROMOTE_DELAY, self.promote)
                    t.daemon = True
                    t.start()
        for e in events:
            self.send_event(e)

    def promote(self) -> None:
        """Give the focus to the next paused rank (lowest mesh, rank) and show it."""
        with self._lock:
            if self.focus is not None:
                return
            nxt = self._next()
            if nxt is None:
                return
            self.focus = nxt
            e = self._stopped(nxt, "exception" if self.sessions[nxt].kind == "exception"
                              else "breakpoint")
        self.send_event(e)

    def _stopped(self, tid: int, reason: str) -> dict:
        s = self.sessions[tid]
        return {"event": "stopped", "type": "event", "seq": 0,
                "body": {"reason": reason, "threadId": tid, "allThreadsStopped": False,
                         "preserveFocusHint": False,
                         "description": f"{thread_name(s)} paused at {s.file}:{s.line}",
                         "text": thread_name(s)}}

    def _next(self) -> Optional[int]:
        paused = [(s.mesh, s.rank, s.since, tid) for tid, s in self.sessions.items()
                  if s.state == "paused"]
        return min(paused)[3] if paused else None

    def _forget_ids(self, sid: str) -> None:
        for table in (self.frames, self.refs):
            for k in [k for k, v in table.items() if v[0] == sid]:
                del table[k]

    # -- queries ---------------------------------------------------------------------------------
    def threads(self) -> list[dict]:
        with self._lock:
            return [{"id": tid, "name": thread_name(s)} for tid, s in
                    sorted(self.sessions.items(), key=lambda kv: (kv[1].mesh, kv[1].rank))]

    def stopped_ids(self) -> list[int]:
        with self._lock:
            rest = [t for t in self.sessions if t != self.focus]
            return ([self.focus] if self.focus is not None else []) + rest

    def session_of(self, tid: int) -> Any:
        with self._lock:
            s = self.sessions.get(tid)
        if s is None:
            raise KeyError(f"thread {tid} is not a paused rank (it ran on)")
        return s

    def frame_of(self, fid: int) -> tuple[Any, int]:
        with self._lock:
            sid, index = self.frames[fid]
            return self.sessions[self.tids[sid]], index

    def ref_of(self, ref: int) -> tuple[Any, int]:
        with self._lock:
            sid, rref = self.refs[ref]
            return self.sessions[self.tids[sid]], rref

    def new_frame(self, s: Any, index: int) -> int:
        with self._lock:
            fid = next(self._ids)
            self.frames[fid] = (s.sid, index)
            return fid

    def new_ref(self, s: Any, rref: int) -> int:
        if not rref:
            return 0
        with self._lock:
            ref = next(self._ids)
            self.refs[ref] = (s.sid, int(rref))
            return ref

    # -- the panel on and off ----------------------------------------------------------------
    def enable(self) -> None:
        self.enabled = True
        try:
            self.wire()
        except Exception:  # noqa: BLE001 - no runtime yet: wired when one starts
            log.debug("no debug registry yet", exc_info=True)

    def disable(self) -> None:
        """The panel is off: paused ranks continue; the text pdb takes breakpoints again."""
        self.enabled = False
        with self._lock:
            sessions = list(self.sessions.values())
        for s in sessions:
            try:
                if self.reg is not None:
                    self.reg.release(s)
            except Exception:  # noqa: BLE001
                log.debug("release failed", exc_info=True)
