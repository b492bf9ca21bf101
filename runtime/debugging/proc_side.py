"""The proc side's always-loaded part: routes debugger messages and installs the hooks.

Kept free of `pdb` so procs start fast: `breakpoint()` imports the remote pdb
(`actor_pdb`) on first use, and `pdb.set_trace` is patched the moment `pdb` is imported.
"""

from __future__ import annotations

import itertools
import json
import linecache
import logging
import os
import queue
import sys
import threading
from typing import TYPE_CHECKING, Any, Optional, cast

from ..transport.framing import Header
from .protocol import FROM_ACTOR, header, op_of

if TYPE_CHECKING:
    from importlib.abc import Loader

__all__ = [
    "BREAKS_ENV", "spawn_env", "ProcDebugger", "running_actor", "set_trace", "breakpointhook",
    "install",
]

log = logging.getLogger("runtime.debugging")

#: the line-breakpoint table and exception filters a proc starts with (JSON), set by its
#: spawner: the table is armed before the proc's first call (a `getbreaks` answer comes by
#: another path than that call, and could come after it)
BREAKS_ENV = "MONARCH_DEBUG_BREAKS"


def spawn_env() -> dict[str, str]:
    """The environment that hands this process's breakpoint table to procs it spawns
    (empty when no breakpoint or exception filter is set)."""
    from . import breakpoints

    t, exc = breakpoints.table(), breakpoints.exceptions()
    if not t and not exc:
        return {}
    return {BREAKS_ENV: json.dumps({"table": t, "exc": exc})}


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
        if op == "getbreaks":  # a proc this proc owns starts: give it our table
            from . import breakpoints
            from .dap_client import send_table_to

            t = breakpoints.table()
            if t or breakpoints.exceptions():
                send_table_to(self.rt, str(e.get("proc_id", "")), str(e.get("addr", "")), t)
            return
        if op == "breaks":  # the controller's line breakpoints: arm, and pass them on
            from . import breakpoints

            breakpoints.set_table(dict(e.get("table") or {}), list(e.get("exc") or []))
            self.send_breaks()
            return
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

    def send_breaks(self) -> None:
        """Send the line-breakpoint table to every proc this proc owns."""
        from . import breakpoints

        t = breakpoints.table()
        exc = breakpoints.exceptions()
        for rec in list(getattr(self.rt, "procs", {}).values()):
            try:
                self.rt.send_to_proc(rec.address, rec.route,
                                     header("breaks", table=t, exc=exc))
            except Exception:  # noqa: BLE001 - a proc going away
                log.debug("breakpoints to %s not sent", rec.proc_id, exc_info=True)

    def ask_breaks(self) -> None:
        """A starting proc asks its owner for the line-breakpoint table."""
        self.send("getbreaks", proc_id=self.rt.proc_id)

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
        if entry is not None and (len(entry) == 1 or entry[2]):  # lazy (a loader's) or read
            return
        if not filename.startswith("<") and os.path.exists(filename):
            return
        lines = self.fetch_source(filename)
        if lines:
            linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)

    def _start_postmortem(self, e: dict) -> None:
        sid = str(e.get("sid", ""))
        server = getattr(self.rt.role, "server", None)  # the ProcServer holds the actors
        actor = getattr(server, "actors", {}).get(str(e.get("actor", ""))) if server else None
        exc = getattr(actor, "last_exception", None) if actor is not None else None
        if actor is None or exc is None or exc.__traceback__ is None:
            self.send("nopm", sid=sid, reason="no failed frame is kept" if actor is not None else
                      f"no actor {e.get('actor')!r} in proc {self.rt.proc_id}")
            return
        from .actor_pdb import run_postmortem  # import cost (pdb, on first use only)

        t = threading.Thread(target=run_postmortem, args=(self, actor, exc, sid),
                             name=f"debug-postmortem-{actor.name}-{actor.rank}", daemon=True)
        t.start()


# -- proc-wide installation ------------------------------------------------------------------
_debugger: Optional[ProcDebugger] = None
_orig_breakpointhook = sys.__breakpointhook__
_orig_set_trace: Any = None  # pdb's own set_trace, once patched


def running_actor() -> Any:
    from ..proc import current_actor

    return current_actor()


def set_trace(frame: Any = None, *, header: Optional[str] = None) -> None:
    """`pdb.set_trace()` replacement: a remote pdb in actor threads, plain pdb elsewhere."""
    frame = frame or sys._getframe().f_back
    actor = running_actor()
    if actor is None or _debugger is None:
        import pdb

        p = pdb.Pdb()
        if header is not None:
            p.message(header)
        p.set_trace(frame)
        return
    from .actor_pdb import start  # import cost (pdb)

    start(_debugger, actor, frame, header)


def _stop_at(frame: Any) -> Any:
    """A line breakpoint was reached on an actor thread: pdb stops there."""
    actor = running_actor()
    if actor is None or _debugger is None:
        return None
    from .actor_pdb import stop_at  # import cost (pdb)

    return stop_at(_debugger, actor, frame)


def _stop_on_error(actor: Any, exc: BaseException) -> None:
    """An endpoint raised while exception filters are set: pdb in its frames, on the
    actor's thread, before the caller hears of it."""
    if _debugger is None or exc.__traceback__ is None or \
            not isinstance(exc, Exception):
        return
    from .actor_pdb import stop_on_exception  # import cost (pdb)

    stop_on_exception(_debugger, actor, exc)


def breakpointhook(*args: Any, **kws: Any) -> None:
    """`sys.breakpointhook`: honours PYTHONBREAKPOINT (0 disables; another hook is used)."""
    hook = os.environ.get("PYTHONBREAKPOINT", "")
    if hook == "0":
        return None
    if hook not in ("", "pdb.set_trace") or _debugger is None:
        return _orig_breakpointhook(*args, **kws)
    set_trace(sys._getframe().f_back)
    return None


def _patch_pdb(module: Any) -> None:
    global _orig_set_trace
    if module.set_trace is not set_trace:
        _orig_set_trace = module.set_trace
        module.set_trace = set_trace


class _PatchingLoader:
    """Loads pdb with its own loader, then patches its set_trace."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        _patch_pdb(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _PdbImportHook:
    """A meta-path finder that patches `pdb` when it is first imported, then goes away."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "pdb":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        import importlib.util

        spec = importlib.util.find_spec("pdb")
        if spec is not None and spec.loader is not None:
            # a Loader by duck typing (importlib.abc, not imported for it: import cost)
            spec.loader = cast("Loader", _PatchingLoader(spec.loader))
        return spec


def install(rt: Any) -> ProcDebugger:
    """Route Kind.DEBUG to this proc's debugger and make breakpoint()/pdb.set_trace() remote."""
    global _debugger
    from ..transport.framing import Kind

    if _debugger is not None and _debugger.rt is rt:
        return _debugger
    _debugger = ProcDebugger(rt)
    rt.register_handler(Kind.DEBUG, _debugger.on_message)
    from . import breakpoints

    breakpoints.install_in_proc(_stop_at, _stop_on_error)
    spec = os.environ.pop(BREAKS_ENV, "")
    if spec:  # the table when the proc was spawned: armed before its first call can run
        try:
            e = json.loads(spec)
            breakpoints.set_table(dict(e.get("table") or {}), list(e.get("exc") or []))
        except (ValueError, TypeError, AttributeError):
            log.warning("ignored a malformed %s", BREAKS_ENV)
    try:  # from this thread, before the proc's hello: the answer comes before any call
        _debugger.ask_breaks()
    except Exception:  # noqa: BLE001 - no owner reachable: no breakpoints
        log.debug("breakpoint table not asked for", exc_info=True)
    sys.breakpointhook = breakpointhook
    if "pdb" in sys.modules:
        _patch_pdb(sys.modules["pdb"])
    elif not any(isinstance(f, _PdbImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _PdbImportHook())
    return _debugger
