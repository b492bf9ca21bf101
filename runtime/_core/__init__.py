"""The runtime's private core: the per-process Runtime and its parts.

Nothing outside `runtime` imports this package; the facade is `runtime/__init__.py`.

Layer 4 (core): imports the basics and `runtime.transport`; the debugger and the
admin endpoint, above it, are started through `runtime._base.features`.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from ..future import Future

from .._base import features as _features
from .records import ActorMeshRecord, AgentRecord, ProcRecord
from .runtime import Runtime, start_admin_endpoint

log = logging.getLogger("runtime")

_runtime: Optional[Runtime] = None
_runtime_lock = threading.Lock()


def get_runtime() -> Runtime:
    """This process's Runtime, created on first use (the controller's, or the proc's)."""
    global _runtime
    rt = _runtime
    if rt is not None and not rt.closed:
        return rt
    with _runtime_lock:
        if _runtime is None or _runtime.closed:
            _runtime = Runtime()
            atexit.register(_shutdown_at_exit)
            try:  # debugging is a feature above the core: reached through _features
                _features.call("debugging.install_in_controller", _runtime)
            except Exception:
                log.exception("debugger not installed")
            from ..hooks import run_startup_hooks

            run_startup_hooks(_runtime)  # front-ends registered with runtime.hooks
        return _runtime


def set_runtime(rt: Runtime) -> None:
    global _runtime
    _runtime = rt


def current_runtime() -> Optional[Runtime]:
    """The running runtime of this process, or None; never starts one."""
    rt = _runtime
    if rt is None or rt.closed:
        return None
    return rt


def shutdown(timeout: float = 5.0) -> "Future[None]":
    """Stop every mesh this process started; returns a resolved Future[None] (Monarch's
    shutdown calls return futures: `.get()` and `await` both work)."""
    from ..future import resolved

    global _runtime
    rt = _runtime
    if rt is not None:
        rt.shutdown(timeout)
        if rt is _runtime and not rt.is_proc:
            _runtime = None
    return resolved(None)


def _shutdown_at_exit() -> None:
    rt = _runtime
    if rt is not None and not rt.is_proc:
        try:
            rt.shutdown(timeout=2.0)
        except Exception:
            pass


__all__ = ["ActorMeshRecord", "AgentRecord", "ProcRecord", "Runtime", "current_runtime",
           "get_runtime", "set_runtime", "shutdown", "start_admin_endpoint"]
