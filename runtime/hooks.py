"""Where front-ends plug into the runtime: the notebook kernel and the views register here.

The runtime never imports its front-ends (`monarch_kernel`, `monarch_widgets`); they call
these functions instead, so dependencies point one way (front-ends -> runtime).

Display hook: how meshes show as HTML in notebooks. `ProcMesh._repr_html_` and
`ActorMesh._repr_html_` call `mesh_html(mesh, kind)`, which asks the hook installed with
`set_display_hook(fn)`: `fn(mesh, kind) -> str | None`, `kind` being "proc_mesh" or
"actor_mesh". Without a hook, or when it returns None or raises, a mesh shows as its
`repr` in a `<pre>`. `monarch_widgets` installs its hook (a coloured health grid) when it
is imported, with `%load_ext monarch_widgets`, and with the Monarch kernel's extension; a
notebook that only imports `runtime` gets the text form.

Start-up hooks: `add_startup_hook(fn)` registers `fn(rt)`, called with the controller's
`Runtime` each time one starts (the first `get_runtime()` of the process, and again after
`shutdown()`), in the thread that started it. A hook must be quick and must not raise (a
failing hook is logged and skipped); `get_runtime()` inside a hook returns that runtime.
Hooks are not called for a runtime already running when they are added: check
`runtime.current_runtime()` for that. Procs never run them. The kernel uses one to route
remote output into cells as soon as plain code starts the runtime.
"""

from __future__ import annotations

import html
import logging
import threading
from typing import Any, Callable, Optional

__all__ = [
    "DisplayHook", "StartupHook", "set_display_hook", "get_display_hook", "mesh_html",
    "add_startup_hook", "remove_startup_hook", "run_startup_hooks",
]

log = logging.getLogger("runtime")

#: fn(mesh, kind) -> HTML or None; kind is "proc_mesh" or "actor_mesh".
DisplayHook = Callable[[Any, str], Optional[str]]
#: fn(rt): called with the controller's Runtime when it starts.
StartupHook = Callable[[Any], None]

_lock = threading.Lock()
_display_hook: Optional[DisplayHook] = None
_startup_hooks: list[StartupHook] = []


def set_display_hook(fn: Optional[DisplayHook]) -> Optional[DisplayHook]:
    """Install `fn(mesh, kind) -> html | None` as the meshes' HTML rendering (None removes
    it, back to `<pre>repr</pre>`). Returns the hook it replaced."""
    global _display_hook
    if fn is not None and not callable(fn):
        raise TypeError(f"display hook must be callable or None, got {fn!r}")
    with _lock:
        old, _display_hook = _display_hook, fn
    return old


def get_display_hook() -> Optional[DisplayHook]:
    """The installed display hook, or None."""
    return _display_hook


def mesh_html(mesh: Any, kind: str) -> str:
    """HTML for a mesh's `_repr_html_`: the display hook's, else `<pre>repr(mesh)</pre>`."""
    hook = _display_hook
    if hook is not None:
        try:
            out = hook(mesh, kind)
            if out is not None:
                return out
        except Exception:  # a view's bug must not break displaying a mesh
            log.debug("display hook failed for %r", mesh, exc_info=True)
    return f"<pre>{html.escape(repr(mesh))}</pre>"


def add_startup_hook(fn: StartupHook) -> None:
    """Call `fn(rt)` whenever this process's controller runtime starts (once per start;
    adding the same function twice is a no-op)."""
    if not callable(fn):
        raise TypeError(f"start-up hook must be callable, got {fn!r}")
    with _lock:
        if fn not in _startup_hooks:
            _startup_hooks.append(fn)


def remove_startup_hook(fn: StartupHook) -> None:
    """Forget a start-up hook (no error if it was not added)."""
    with _lock:
        if fn in _startup_hooks:
            _startup_hooks.remove(fn)


def run_startup_hooks(rt: Any) -> None:
    """Called by the runtime when the controller's runtime `rt` has started."""
    if getattr(rt, "is_proc", False):
        return
    with _lock:
        hooks = list(_startup_hooks)
    for fn in hooks:
        try:
            fn(rt)
        except Exception:
            log.exception("runtime start-up hook %r failed", fn)
