"""The actor side: a pdb whose input and output travel to the controller.

`breakpoint()` / `pdb.set_trace()` in an actor thread create a `RemotePdb`. Its stdout
buffers text and sends it; its stdin sends a "read" (with the text and where the frame
stopped) and blocks the actor thread until the controller sends a line. The proc's I/O
thread keeps heartbeating meanwhile, and the actor reports itself "paused".
"""

from __future__ import annotations

import bdb
import itertools
import linecache
import logging
import os
import pdb
import queue
import sys
import threading
import time
from typing import Any, Optional

from ..transport.framing import Header
from . import settings
from .protocol import (FROM_ACTOR, RELEASE_COMMAND, BreakpointWithoutDebugger, header, op_of)

log = logging.getLogger("runtime.debugging")

#: modules whose frames pdb steps over (the runtime's own plumbing)
SKIP = ["runtime.proc", "runtime.debugging.*", "runtime.core", "runtime.future",
        "threading", "asyncio.*", "concurrent.*", "queue"]

ACK_TIMEOUT = 5.0  # seconds to wait for the controller to acknowledge a breakpoint
_ids = itertools.count(1)


class ProcDebugger:
    """Per-proc state: routes controller messages to the waiting pdb sessions."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.inboxes: dict[str, queue.Queue] = {}
        self._source_waiters: dict[int, queue.Queue] = {}
        self._source_ids = itertools.count(1)
        self._no_source: set = set()
        self._lock = threading.Lock()

    # -- I/O thread ------------------------------------------------------------------------
    def on_message(self, h: Header, body: Any, buffers: list) -> None:
        op = op_of(h)
        e = h.extra if isinstance(h.extra, dict) else {}
        if op in FROM_ACTOR:  # from a proc this proc owns: pass it up to our owner
            if self.rt.owner_address:
                self.rt.send(self.rt.owner_address, h)
            return
        if op == "source_reply":
            w = self._source_waiters.pop(int(e.get("req", 0)), None)
            if w is not None:
                w.put(e.get("lines"))
            return
        if op == "postmortem":
            self._start_postmortem(e)
            return
        box = self.inboxes.get(str(e.get("sid", "")))
        if box is not None:
            box.put((op, e))
        elif op not in ("ack",):
            log.warning("debug message %r for unknown session %r dropped", op, e.get("sid"))

    # -- actor threads ------------------------------------------------------------------------
    def send(self, op: str, **fields: Any) -> None:
        if not self.rt.owner_address:
            return
        owner = self.rt.owner_address
        # the address the owner can reach us at (tcp across hosts, ipc on the same host)
        self.rt.send(owner, header(op, addr=self.rt.reply_address_for(owner), **fields))

    def fetch_source(self, filename: str, timeout: float = 5.0) -> Optional[list]:
        """Lines of `filename` from the controller's linecache (None if it lacks them)."""
        if filename in self._no_source or not self.rt.owner_address:
            return None
        req = next(self._source_ids)
        w: queue.Queue = queue.Queue()
        self._source_waiters[req] = w
        self.send("source", req=req, file=filename)
        try:
            lines = w.get(timeout=timeout)
        except queue.Empty:
            lines = None
        finally:
            self._source_waiters.pop(req, None)
        if not lines:
            self._no_source.add(filename)
            return None
        return [str(x) for x in lines]

    def ensure_source(self, filename: str) -> None:
        """Put the controller's copy of a file into linecache when this proc lacks it."""
        if not filename or filename in self._no_source:
            return
        entry = linecache.cache.get(filename)
        if entry is not None and entry[2]:
            return
        if not filename.startswith("<") and os.path.exists(filename):
            return
        lines = self.fetch_source(filename)
        if lines:
            linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)

    def _start_postmortem(self, e: dict) -> None:
        sid = str(e.get("sid", ""))
        # the ProcServer (its bound handle() is the runtime's host_handler) holds the actors
        server = getattr(getattr(self.rt, "host_handler", None), "__self__", None)
        actor = getattr(server, "actors", {}).get(str(e.get("actor", ""))) if server else None
        exc = getattr(actor, "last_exception", None) if actor is not None else None
        if exc is None or exc.__traceback__ is None:
            self.send("nopm", sid=sid, reason="no failed frame is kept" if actor else
                      f"no actor {e.get('actor')!r} in proc {self.rt.proc_id}")
            return
        t = threading.Thread(target=_run_postmortem, args=(self, actor, exc, sid),
                             name=f"debug-postmortem-{actor.name}-{actor.rank}", daemon=True)
        t.start()


class _Output:
    """pdb's stdout: buffers text; flushing sends it to the controller."""

    def __init__(self, chan: "_Channel") -> None:
        self._chan = chan
        self._buf: list[str] = []
        self.encoding = "utf-8"

    def write(self, s: str) -> int:
        self._buf.append(str(s))
        return len(s)

    def take(self) -> str:
        text, self._buf = "".join(self._buf), []
        return text

    def flush(self) -> None:
        if self._chan.pdb is not None and self._chan.pdb.prompt and \
                "".join(self._buf).endswith(self._chan.pdb.prompt):
            return  # the prompt goes with the next read
        text = self.take()
        if text:
            self._chan.debugger.send("output", sid=self._chan.sid, text=text)

    def isatty(self) -> bool:
        return False


class _Input:
    """pdb's stdin: each readline asks the controller for a line and waits for it."""

    def __init__(self, chan: "_Channel") -> None:
        self._chan = chan

    def readline(self) -> str:
        return self._chan.read_line()

    def isatty(self) -> bool:
        return False


class _Channel:
    """One pdb session's link to the controller."""

    def __init__(self, debugger: ProcDebugger, meta: dict, kind: str) -> None:
        self.debugger = debugger
        self.sid = f"{debugger.rt.proc_id}/{meta.get('actor_id', '')}/{next(_ids)}"
        self.meta = dict(meta, kind=kind)
        self.inbox: queue.Queue = queue.Queue()
        debugger.inboxes[self.sid] = self.inbox
        self.stdout = _Output(self)
        self.stdin = _Input(self)
        self.pdb: Optional["RemotePdb"] = None
        self.acked = False
        self.resumed_sent = False

    def close(self) -> None:
        self.debugger.inboxes.pop(self.sid, None)

    def where(self) -> dict:
        p = self.pdb
        f = getattr(p, "curframe", None) if p is not None else None
        if f is None:
            return {}
        return {"file": f.f_code.co_filename, "line": f.f_lineno, "function": f.f_code.co_name}

    def read_line(self) -> str:
        p = self.pdb
        text = self.stdout.take()
        prompt = p.prompt if p is not None else "(Pdb) "
        if text.endswith(prompt):
            text = text[: -len(prompt)]
        self.resumed_sent = False
        self.debugger.send("read", sid=self.sid, text=text, prompt=prompt, **self.meta,
                           **self.where())
        _set_paused(True)
        try:
            return self._wait_line()
        finally:
            _set_paused(False)

    def _wait_line(self) -> str:
        start = time.monotonic()
        while True:
            try:
                op, e = self.inbox.get(timeout=0.5)
            except queue.Empty:
                # Until the controller acknowledges, it may have no debugger; after that it
                # enforces the unattended timeout itself (and this proc dies with it).
                if not self.acked and time.monotonic() - start > ACK_TIMEOUT:
                    return self._no_controller()
                continue
            if op == "ack":
                self.acked = True
                continue
            if op == "input":
                return str(e.get("line", "")).rstrip("\n") + "\n"
            if op == "release":
                return f"{RELEASE_COMMAND} {'clear' if e.get('clear') else ''}\n"
            if op == "abort":
                raise BreakpointWithoutDebugger(str(e.get("reason") or self._describe()))

    def _describe(self) -> str:
        w = self.where()
        return (f"breakpoint at {w.get('file', '?')}:{w.get('line', '?')} in "
                f"{self.meta.get('mesh', '?')} rank {self.meta.get('rank', '?')}")

    def _no_controller(self) -> str:
        why = "the controller did not acknowledge it (no debugger installed there)"
        pol = settings.policy()
        log.warning("%s: %s; policy %r", self._describe(), why, pol)
        if pol == "continue":
            return f"{RELEASE_COMMAND} clear\n"
        raise BreakpointWithoutDebugger(
            f"{self._describe()}: {why}; set MONARCH_DEBUG_POLICY=continue to continue instead")

    def resumed(self) -> None:
        if not self.resumed_sent:
            self.resumed_sent = True
            out = self.stdout.take()
            self.debugger.send("resumed", sid=self.sid, text=out)


class RemotePdb(pdb.Pdb):
    """pdb driven from the controller; source the proc lacks comes from the controller."""

    def __init__(self, chan: _Channel) -> None:
        super().__init__(stdin=chan.stdin, stdout=chan.stdout, skip=SKIP, nosigint=True,
                         readrc=False)
        self.use_rawinput = False
        self.chan = chan
        chan.pdb = self

    # source serving: before pdb shows anything, fetch files this proc cannot read
    def setup(self, f: Any, tb: Any) -> None:
        super().setup(f, tb)
        seen = set()
        for frame, _ in self.stack:
            name = frame.f_code.co_filename
            if name not in seen:
                seen.add(name)
                self.chan.debugger.ensure_source(name)

    def get_stack(self, f: Any, t: Any) -> Any:
        """The stack without the runtime's frames below the endpoint (threading, proc)."""
        stack, i = super().get_stack(f, t)
        k = 0
        while k < i and self.is_skipped_module(stack[k][0].f_globals.get("__name__", "")):
            k += 1
        return stack[k:], i - k

    def do_break(self, arg: str, temporary: int = 0) -> Any:
        fname = arg.split(":", 1)[0].strip() if ":" in arg else ""
        if fname:
            self.chan.debugger.ensure_source(fname)
        return super().do_break(arg, temporary)

    do_b = do_break

    def lookupmodule(self, filename: str) -> Any:
        found = super().lookupmodule(filename)
        if found is None and linecache.cache.get(filename, (0, 0, None))[2]:
            return filename  # a cell's code: its source came from the controller
        return found

    def set_continue(self) -> None:
        super().set_continue()
        self.chan.resumed()

    def set_quit(self) -> None:
        super().set_quit()
        self.chan.resumed()

    def default(self, line: str) -> Any:
        if line.startswith(RELEASE_COMMAND):
            if "clear" in line[len(RELEASE_COMMAND):]:
                self.clear_all_breaks()
            self.set_continue()
            return 1
        return super().default(line)

    def onecmd(self, line: str) -> Any:
        if line.startswith(RELEASE_COMMAND):
            return self.default(line)
        return super().onecmd(line)


# -- proc-wide installation ------------------------------------------------------------------
_debugger: Optional[ProcDebugger] = None
_orig_set_trace = pdb.set_trace
_orig_breakpointhook = sys.__breakpointhook__


def _actor() -> Any:
    from ..proc import current_actor

    return current_actor()


def _meta(actor: Any, rt: Any) -> dict:
    try:
        coords = dict(actor.shape.coords_of(actor.rank))
    except Exception:
        coords = {}
    return {"mesh": actor.name, "rank": int(actor.rank), "coords": coords,
            "actor_id": actor.actor_id, "proc_id": rt.proc_id, "host": rt.host,
            "pid": os.getpid(), "port": int(actor.current_port or 0),
            "endpoint": actor.endpoint or "", "caller": actor.current_reply or ""}


def _set_paused(paused: bool) -> None:
    """Report the actor as paused (heartbeats carry it to the health model) or busy again."""
    a = _actor()
    if a is None:
        return
    if paused:
        if a.state != "paused":
            a._debug_endpoint = a.endpoint
            a._set_state("paused", a.endpoint)
    elif a.state == "paused":
        a._set_state("busy", getattr(a, "_debug_endpoint", a.endpoint))


def set_trace(frame: Any = None, *, header: Optional[str] = None) -> None:
    """`pdb.set_trace()` replacement: a remote pdb in actor threads, plain pdb elsewhere."""
    actor = _actor()
    if actor is None or _debugger is None:
        if header is not None:
            return _orig_set_trace(header=header)
        return _orig_set_trace()
    chan = _Channel(_debugger, _meta(actor, _debugger.rt), "breakpoint")
    p = RemotePdb(chan)
    if header is not None:
        chan.stdout.write(header + "\n")
    p.set_trace(frame or sys._getframe().f_back)


def breakpointhook(*args: Any, **kws: Any) -> None:
    """`sys.breakpointhook`: PYTHONBREAKPOINT=0 disables, as for plain Python."""
    if os.environ.get("PYTHONBREAKPOINT", None) == "0":
        return
    if _actor() is None or _debugger is None:
        return _orig_breakpointhook(*args, **kws)
    set_trace(sys._getframe().f_back)


def _run_postmortem(debugger: ProcDebugger, actor: Any, exc: BaseException, sid: str) -> None:
    from ..proc import _tls

    _tls.actor = None  # this thread is not the actor's; do not report it paused
    meta = _meta(actor, debugger.rt)
    meta["endpoint"] = getattr(actor, "last_exception_endpoint", "") or meta["endpoint"]
    chan = _Channel(debugger, meta, "postmortem")
    debugger.inboxes.pop(chan.sid, None)
    chan.sid = sid
    debugger.inboxes[sid] = chan.inbox
    p = RemotePdb(chan)
    chan.stdout.write(f"post-mortem of {type(exc).__name__}: {exc}\n")
    try:
        p.reset()
        p.interaction(None, exc.__traceback__)
    except (bdb.BdbQuit, BreakpointWithoutDebugger):
        pass
    except BaseException:  # noqa: BLE001 - never let a debugging thread kill the proc
        log.exception("post-mortem session failed")
    finally:
        chan.resumed()
        chan.close()


def install(rt: Any) -> ProcDebugger:
    """Route Kind.DEBUG to this proc's debugger and make breakpoint()/pdb.set_trace() remote."""
    global _debugger
    from ..transport.framing import Kind

    if _debugger is not None and _debugger.rt is rt:
        return _debugger
    _debugger = ProcDebugger(rt)
    rt.register_handler(Kind.DEBUG, _debugger.on_message)
    sys.breakpointhook = breakpointhook
    pdb.set_trace = set_trace
    return _debugger
