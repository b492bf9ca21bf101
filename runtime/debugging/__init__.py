"""Remote debugging: `breakpoint()` in an actor opens pdb where the controller waits.

Actor side: `install_in_proc(rt)` (called in every proc) makes breakpoint() and
pdb.set_trace() in actor threads open a `RemotePdb` whose I/O travels to the controller.
Controller side: `install_in_controller(rt)` keeps the registry of paused actors and opens
the prompt in the thread waiting on a call (`Future.get()`).

Layer 8 (a feature): may import every layer up to `proc` (proc, admin, _core,
transport, basics); nothing below imports it: it is installed through `runtime._base.features`.
"""

from __future__ import annotations

from typing import Any

from .protocol import BreakpointWithoutDebugger
from .settings import policy, set_policy, set_timeout, timeout

__all__ = ["BreakpointWithoutDebugger", "get_dap_client", "get_registry", "install_in_controller",
           "install_in_proc", "line_breakpoints", "policy", "set_exception_breakpoints",
           "set_line_breakpoints",
           "set_policy", "set_timeout", "timeout"]


def install_in_proc(rt: Any) -> None:
    """Make breakpoint()/pdb.set_trace() in this proc's actors remote (call once per proc)."""
    from . import proc_side

    proc_side.install(rt)


def install_in_controller(rt: Any) -> Any:
    """Route debugger traffic of controller `rt` to its registry and hook waiting threads."""
    from ..future import add_wait_hook
    from . import dap_client, registry  # noqa: F401 - dap_client: each registry's DAP client
    from .console import wait_hook

    reg = registry.install(rt)
    add_wait_hook(wait_hook)
    return reg


def get_registry(create: bool = True) -> Any:
    """The controller's DebugRegistry (paused sessions, attach, cast, continue)."""
    from . import dap_client  # noqa: F401 - a registry made here has its DAP client
    from .registry import get_registry as _get

    return _get(create)


def set_line_breakpoints(path: str, lines: list) -> dict:
    """Set the line breakpoints of file `path` in every proc, now and for procs started
    later (an empty list clears them); returns the whole table {file: [lines]}. Actors stop
    there in the same pdb `breakpoint()` opens. No breakpoints: no tracing cost."""
    from . import breakpoints

    return breakpoints.set_file(path, list(lines))


def line_breakpoints() -> dict:
    """The line breakpoints set with set_line_breakpoints: {file: [lines]}."""
    from . import breakpoints

    return breakpoints.table()


def get_dap_client() -> Any:
    """The controller's DapClient (structured requests to paused actors), or None when no
    runtime runs in this process."""
    from .dap_client import client

    return client()


def set_exception_breakpoints(filters: list) -> None:
    """While `filters` is non-empty (the Debugger panel's "raised" / "uncaught"), an endpoint
    that raises stops in pdb in its frames, on its actor, before the caller hears of it (in
    every proc, now and later). An empty list turns it off."""
    from . import breakpoints

    breakpoints.set_exceptions(list(filters))
