"""The controller's side of structured debugging (the Jupyter Debugger panel): requests to
paused sessions (`request`: stackTrace, scopes, variables, evaluate, answered by the actor's
thread, see dap_engine.py), and the line-breakpoint table pushed to every proc, to procs
that start later (they ask with `getbreaks`) and, through owner procs, to nested procs.
Everything rides the runtime's authenticated control plane (Kind.DEBUG)."""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from typing import Any, Collection, Optional

from . import breakpoints, registry
from .protocol import header
from .registry import DebugError, DebugRegistry, Session

__all__ = ["REQUEST_TIMEOUT", "DapClient", "send_table_to", "client"]

log = logging.getLogger("runtime.debugging")

REQUEST_TIMEOUT = 10.0  # seconds a paused actor has to answer (evaluate: 30)


class DapClient:
    """Structured requests to paused actors of one controller, and breakpoint pushes."""

    def __init__(self, reg: DebugRegistry) -> None:
        self.reg = reg
        self.rt = reg.rt
        self._ids = itertools.count(1)
        self._waiters: dict[int, queue.Queue] = {}
        reg.op_handlers["dap_reply"] = self._on_reply
        reg.op_handlers["getbreaks"] = self._on_getbreaks

    # -- I/O thread ------------------------------------------------------------------------
    def _on_reply(self, e: dict) -> None:
        w = self._waiters.pop(int(e.get("req", 0)), None)
        if w is not None:
            w.put(e)

    def _on_getbreaks(self, e: dict) -> None:
        t = breakpoints.table()
        if t or breakpoints.exceptions():
            send_table_to(self.rt, str(e.get("proc_id", "")), str(e.get("addr", "")), t)

    def broadcast(self, table: dict) -> None:
        """Send the table to every live proc this controller owns, from the calling thread
        (so a call this thread makes next finds the table there)."""
        dead: Collection[str] = getattr(self.rt, "dead_procs", ())
        for _ in range(3):
            try:
                recs = list(self.rt.procs.values())
                break
            except RuntimeError:  # changed meanwhile (the I/O thread adds procs)
                recs = []
        for rec in recs:
            if rec.proc_id in dead or rec.state in ("failed", "stopped"):
                continue
            try:
                self.rt.send_to_proc(rec.address, rec.route, header(
                    "breaks", table=table, exc=breakpoints.exceptions()))
            except Exception:  # noqa: BLE001 - a proc going away
                log.debug("breakpoints to %s not sent", rec.proc_id, exc_info=True)

    # -- any thread ------------------------------------------------------------------------
    def request(self, s: Session, command: str, args: Optional[dict] = None,
                timeout: Optional[float] = None) -> dict:
        """Ask the paused session `s`; returns the body, or raises DebugError."""
        if s.state != "paused":
            raise DebugError(f"{s.label} is not paused (it is {s.state})")
        req = next(self._ids)
        w: queue.Queue = queue.Queue()
        self._waiters[req] = w
        limit = timeout or (30.0 if command == "evaluate" else REQUEST_TIMEOUT)
        self.rt.send(s.addr, header("dap", sid=s.sid, req=req, command=command,
                                    args=dict(args or {})))
        try:
            e = w.get(timeout=limit)
        except queue.Empty:
            raise DebugError(f"{s.label} did not answer {command} within {limit:g} s") from None
        finally:
            self._waiters.pop(req, None)
        if not e.get("ok"):
            raise DebugError(str(e.get("message") or f"{command} failed"))
        return dict(e.get("body") or {})


def send_table_to(rt: Any, proc_id: str, addr: str, table: dict) -> None:
    """Answer a starting proc's `getbreaks`: through its record when this runtime owns it
    (before its hello a proc on another host is reached only through its host agent),
    else at the address it gave."""
    rec = rt.procs.get(proc_id) if proc_id else None
    h = header("breaks", table=table, exc=breakpoints.exceptions())
    if rec is not None and (rec.address or rec.route):
        rt.send_to_proc(rec.address, rec.route, h)
    elif addr:
        rt.send(addr, h)


_client: Optional[DapClient] = None
_lock = threading.Lock()


def _on_table(table: dict) -> None:
    c = _client
    if c is not None and not getattr(c.rt, "closed", False):
        c.broadcast(table)


def client(reg: Optional[DebugRegistry] = None) -> Optional[DapClient]:
    """The DapClient of the controller's registry (None when no runtime runs)."""
    global _client
    if reg is None:
        reg = registry.get_registry(create=False)
    if reg is None:
        return None
    with _lock:
        if _client is None or _client.reg is not reg:
            _client = DapClient(reg)
            breakpoints.add_listener(_on_table)
        return _client


registry.on_install(client)  # every registry made from now on has its client
