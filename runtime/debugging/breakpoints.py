"""Line breakpoints set from the controller (the Jupyter Debugger panel's gutter).

One table `{file: {line, ...}}` per process. In the controller it is what the front-end set
(`set_breakpoints`); every proc holds a copy (the controller pushes changes to its procs,
a proc asks its owner when it starts, and an owner proc passes changes on to the procs it
owns). In a proc, an actor's thread is armed at the start of an endpoint call only while the
table is non-empty: `sys.settrace(gate)`, where `gate` traces only code objects of a listed
file whose lines include a breakpoint. With no breakpoint, no trace function is installed.
A hit opens the same RemotePdb the text debugger uses (`actor_pdb.stop_at`).
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Optional

__all__ = [
    "table", "version", "set_file", "exceptions", "set_exceptions", "set_table", "add_listener",
    "gate", "local", "rearm", "on_call", "install_in_proc",
]

_lock = threading.Lock()
_table: dict[str, frozenset] = {}
_version = 0
_relevant: dict[Any, bool] = {}  # code object -> has a breakpoint line (reset on changes)
_armed: set = set()  # idents of actor threads with the gate installed
_on_hit: Optional[Callable[[Any], Any]] = None  # frame -> trace function to go on with
_listeners: list[Callable[[dict], None]] = []
_exceptions: frozenset = frozenset()  # exception filters set: an endpoint that raises stops


def table() -> dict[str, list[int]]:
    """The breakpoints of this process: {file: sorted lines}."""
    return {f: sorted(lines) for f, lines in _table.items()}


def version() -> int:
    """A number that changes with every change of the table."""
    return _version


def set_file(path: str, lines: list[int]) -> dict[str, list[int]]:
    """Set the breakpoints of one file (an empty list clears them); returns the table."""
    new = dict(_table)
    if lines:
        new[str(path)] = frozenset(int(x) for x in lines)
    else:
        new.pop(str(path), None)
    return set_table(new)


def exceptions() -> list[str]:
    """The exception filters set (the panel's "raised", "uncaught"): while any is set, an
    endpoint that raises stops in its frames before the caller hears of it."""
    return sorted(_exceptions)


def set_exceptions(filters: list) -> None:
    """Set the exception filters (an empty list clears them); listeners hear of it."""
    set_table(dict(table()), filters)


def set_table(new: dict, exception_filters: Any = None) -> dict[str, list[int]]:
    """Replace the whole table ({file: lines}) and, if given, the exception filters;
    listeners hear of the change."""
    global _table, _version, _exceptions
    with _lock:
        _table = {str(f): frozenset(int(x) for x in ls) for f, ls in new.items() if ls}
        if exception_filters is not None:
            _exceptions = frozenset(str(x) for x in exception_filters)
        _version += 1
        _relevant.clear()
        listeners = list(_listeners)
    t = table()
    for fn in listeners:
        try:
            fn(t)
        except Exception:  # noqa: BLE001 - one listener's bug must not stop the others
            import logging

            logging.getLogger("runtime.debugging").exception("breakpoint listener failed")
    return t


def add_listener(fn: Callable[[dict], None]) -> None:
    """Call `fn(table)` after each change (the controller broadcasts it to its procs)."""
    if fn not in _listeners:
        _listeners.append(fn)


# -- proc side: arming actor threads ---------------------------------------------------------
def _has_line(code: Any, lines: frozenset) -> bool:
    hit = _relevant.get(code)
    if hit is None:
        try:
            own = {ln for _, _, ln in code.co_lines() if ln is not None}
        except Exception:  # noqa: BLE001
            own = set()
        hit = _relevant[code] = bool(own & lines)
    return hit


def gate(frame: Any, event: str, arg: Any) -> Any:
    """The global trace function of an armed thread: trace only code with a breakpoint."""
    if event == "call":
        lines = _table.get(frame.f_code.co_filename)
        if lines and _has_line(frame.f_code, lines):
            return local
    return None


def local(frame: Any, event: str, arg: Any) -> Any:
    """The per-frame trace function: stop where a breakpoint is."""
    if event == "line":
        lines = _table.get(frame.f_code.co_filename)
        if not lines:
            return None
        if frame.f_lineno in lines and _on_hit is not None:
            return _on_hit(frame)
    return local


def rearm(frame: Any = None) -> None:
    """After pdb continues: put the gate back on this thread (and on its frames that have
    breakpoints) while the table is non-empty."""
    if not _table:
        return
    sys.settrace(gate)
    f = frame or sys._getframe().f_back
    while f is not None:
        lines = _table.get(f.f_code.co_filename)
        if lines and _has_line(f.f_code, lines):
            f.f_trace = local
        f = f.f_back


def on_call() -> None:
    """The proc's call hook (start of every endpoint call on an actor thread)."""
    ident = threading.get_ident()
    if _table:
        if sys.gettrace() is None:
            sys.settrace(gate)
            _armed.add(ident)
        return
    if sys.gettrace() is gate:
        sys.settrace(None)
    _armed.discard(ident)
    if not _armed:
        _set_call_hook(None)


def _set_call_hook(fn: Any) -> None:
    from ..proc import set_call_hook

    set_call_hook(fn)


def install_in_proc(on_hit: Callable[[Any], Any], on_error: Callable[[Any, Any], Any]) -> None:
    """Arm actor threads at their next call while the table is non-empty, and stop in
    failed endpoints while exception filters are set (proc side)."""
    global _on_hit
    _on_hit = on_hit

    def changed(t: dict) -> None:
        if t:
            _set_call_hook(on_call)
        from ..proc import set_error_hook

        set_error_hook(on_error if _exceptions else None)

    add_listener(changed)
    if _table or _exceptions:
        changed(table())
