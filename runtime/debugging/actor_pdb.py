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
import time
from typing import IO, Any, Literal, Optional, cast

from . import breakpoints, settings
from .proc_side import ProcDebugger, running_actor
from .protocol import RELEASE_COMMAND, BreakpointWithoutDebugger

__all__ = [
    "SKIP", "ACK_TIMEOUT", "RemotePdb", "start", "stop_at", "stop_on_exception", "run_postmortem",
]

log = logging.getLogger("runtime.debugging")

#: modules whose frames pdb steps over (the runtime's own plumbing)
# modules pdb never stops in: the runtime's own frames, and the standard library's weakref
# callbacks, which the garbage collector may run on the actor's thread while it steps (a
# stop there took the user's `q`, and its BdbQuit was swallowed as "Exception ignored")
SKIP = ["runtime.proc", "runtime.proc.*", "runtime.debugging.*",
        "runtime._core.*", "runtime._meshes.*", "runtime.future", "threading", "asyncio.*",
        "concurrent.*", "queue", "_weakrefset", "weakref"]

ACK_TIMEOUT = 5.0  # seconds to wait for the controller to acknowledge a breakpoint
_ids = itertools.count(1)


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
        self.refs: dict[int, Any] = {}  # variable references of the panel (this stop only)

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
        self.refs.clear()
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
            if op == "dap":  # a structured request (the Debugger panel), answered here
                from .dap_engine import answer

                self.debugger.send("dap_reply", sid=self.sid, req=int(e.get("req", 0)),
                                   **answer(self, str(e.get("command", "")),
                                            dict(e.get("args") or {})))

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
        # pdb reads readline() and writes write()/flush(): the two channel ends are enough
        super().__init__(stdin=cast(IO[str], chan.stdin), stdout=cast(IO[str], chan.stdout),
                         skip=SKIP, nosigint=True, readrc=False)
        self.use_rawinput = False
        self.chan = chan
        self.continued = False
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

    def do_break(self, arg: str, temporary: bool | Literal[0, 1] = False) -> Optional[bool]:
        fname = arg.split(":", 1)[0].strip() if ":" in arg else ""
        if fname:
            self.chan.debugger.ensure_source(fname)
        return super().do_break(arg, temporary)

    do_b = do_break

    def lookupmodule(self, filename: str) -> Any:
        found = super().lookupmodule(filename)
        entry = linecache.cache.get(filename)
        if found is None and entry is not None and len(entry) > 2 and entry[2]:
            return filename  # a cell's code: its source came from the controller
        return found

    def set_continue(self) -> None:
        super().set_continue()
        self.continued = True
        breakpoints.rearm(sys._getframe().f_back)  # the panel's breakpoints stay live
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


# -- entry points (imported on the first breakpoint of a proc) ---------------------------------
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
    a = running_actor()
    if a is None:
        return
    if paused:
        if a.state != "paused":
            a._debug_endpoint = a.endpoint
            a.set_state("paused", a.endpoint)
    elif a.state == "paused":
        a.set_state("busy", getattr(a, "_debug_endpoint", a.endpoint))


def start(debugger: ProcDebugger, actor: Any, frame: Any, header: Optional[str] = None) -> None:
    """Stop the actor's thread in a RemotePdb at `frame` (breakpoint / pdb.set_trace)."""
    chan = _Channel(debugger, _meta(actor, debugger.rt), "breakpoint")
    p = RemotePdb(chan)
    if header is not None:
        chan.stdout.write(header + "\n")
    p.set_trace(frame)


def stop_at(debugger: ProcDebugger, actor: Any, frame: Any) -> Any:
    """Stop the actor's thread in a RemotePdb at `frame`'s current line (a line breakpoint
    from the controller's table); returns the trace function the frame goes on with."""
    chan = _Channel(debugger, _meta(actor, debugger.rt), "breakpoint")
    p = RemotePdb(chan)
    p.reset()
    f = frame
    while f is not None:  # as bdb's set_trace, without stepping to the next line first
        f.f_trace = p.trace_dispatch
        p.botframe = f
        f = f.f_back
    sys.settrace(p.trace_dispatch)
    p.continued = False
    p.interaction(frame, None)
    if p.continued and not p.quitting:
        return breakpoints.local if breakpoints.table() else None
    return p.trace_dispatch


def stop_on_exception(debugger: ProcDebugger, actor: Any, exc: BaseException) -> None:
    """pdb in the frames of `exc`, which an endpoint raised, on the actor's own thread (the
    call waits); continuing lets the error go to the caller."""
    chan = _Channel(debugger, _meta(actor, debugger.rt), "exception")
    p = RemotePdb(chan)
    chan.stdout.write(f"{type(exc).__name__}: {exc}\n")
    saved = sys.gettrace()
    try:
        p.reset()
        p.interaction(None, exc.__traceback__)
    except (bdb.BdbQuit, BreakpointWithoutDebugger):
        pass
    finally:
        chan.resumed()
        chan.close()
        sys.settrace(saved if saved is breakpoints.gate else None)


def run_postmortem(debugger: ProcDebugger, actor: Any, exc: BaseException, sid: str) -> None:
    """A post-mortem session on the frames of `exc` (runs on its own thread in the proc)."""
    chan = _Channel(debugger, _meta(actor, debugger.rt), "postmortem")
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
