"""Actions the views offer (stop a mesh, attach to a paused actor, serve the admin endpoint),
callable from any thread.

The dashboard's buttons, the `%mesh` magics and the admin TUI all go through these, so a
button and its magic do the same thing.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

__all__ = [
    "AttachHandler", "stop_mesh", "serve_admin", "set_attach_handler", "attach", "stacks_text",
    "timeline_html_all",
]

AttachHandler = Callable[[str, int], Any]
_attach_handler: Optional[AttachHandler] = None
_lock = threading.Lock()


def _runtime(runtime: Any) -> Any:
    if runtime is not None:
        return runtime
    from runtime import get_runtime

    return get_runtime()


def _names(mesh: Any) -> set[str]:
    """The names a live mesh answers to: its own, and its health-model name if different."""
    # ActorMesh.health_name: the health model may say "name~2"
    return {str(getattr(mesh, "name", "")), str(getattr(mesh, "health_name", ""))} - {""}


def stop_mesh(name: str, runtime: Any = None, timeout: float = 30.0) -> str:
    """Stop every live actor mesh or proc mesh called `name`; returns a one-line report."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"mesh name must be a non-empty string, got {name!r}")
    rt = _runtime(runtime)
    found = [m for m in rt.meshes() if name in _names(m)]
    if not found:
        known = sorted({n for m in rt.meshes() for n in _names(m)})
        raise KeyError(f"no live mesh named {name!r}; live meshes: {known}")
    for m in found:
        res = type(m).stop(m)  # not an endpoint called stop
        if hasattr(res, "get"):
            res.get(timeout=timeout)
    return f"stopped mesh {name}"


def serve_admin(runtime: Any = None) -> str:
    """Serve this controller's admin endpoint (if not yet) and say how to attach the
    terminal admin (`monarch-admin`) to it."""
    from runtime.admin import serve

    srv = serve(_runtime(runtime))
    return (f"admin endpoint {srv.address}\nconnection file {srv.connection_file}\n"
            f"attach with: monarch-admin -f {srv.connection_file}")


def set_attach_handler(fn: Optional[AttachHandler]) -> None:
    """Register how to attach a debugger to a paused actor: `fn(mesh, rank)`.

    The debugger / kernel registers it; the dashboard's "attach" button and
    `%mesh attach` call it."""
    global _attach_handler
    with _lock:
        _attach_handler = fn


def attach(mesh: str, rank: int) -> str:
    """Attach the registered debugger front-end to actor `mesh[rank]` (paused at a breakpoint)."""
    with _lock:
        fn = _attach_handler
    if fn is None:
        raise RuntimeError("no debugger attach handler is registered "
                           "(monarch_widgets.controls.set_attach_handler)")
    res = fn(mesh, int(rank))
    return res if isinstance(res, str) else f"attached to {mesh}[{rank}]"


def stacks_text(mesh: str, rank: int, runtime: Any = None, native: bool = False,
                timeout: float = 10.0) -> str:
    """Every thread of the proc under actor `mesh[rank]`, taken from outside by py-spy
    (`runtime.proc_stacks`; works while C code holds its GIL), as text."""
    from runtime import ActorMesh, proc_stacks

    rt = _runtime(runtime)
    found = [m for m in rt.meshes() if isinstance(m, ActorMesh) and mesh in _names(m)
             and m.proc_mesh is not None]
    if not found:
        raise KeyError(f"no live actor mesh named {mesh!r}")
    return "\n\n".join(str(s) for s in proc_stacks(found[0].proc_mesh, rank=int(rank),
                                                    native=native, timeout=timeout))


def timeline_html_all(runtime: Any = None, last: float = 300.0) -> str:
    """The timeline (`runtime.read_timeline`) of every live proc mesh, drawn as HTML (the
    dashboard's timeline tab)."""
    from monarch_widgets.timeline_view import timeline_html
    from runtime import ProcMesh, read_timeline

    rt = _runtime(runtime)
    meshes = [m for m in rt.meshes() if isinstance(m, ProcMesh) and not m.stopped
              and m.root is m]
    if not meshes:
        return "<div class='mw-hint'>no live proc mesh</div>"
    return "".join(timeline_html(read_timeline(m, last=last)) for m in meshes)
