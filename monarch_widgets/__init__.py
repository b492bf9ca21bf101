"""Views of the runtime's health model: a live notebook dashboard and static renderings.

`dashboard()` returns the live widget; `render_text` / `render_html` render a snapshot
without widgets (for `%mesh status`, and for meshes' `_repr_html_` through the display
hook below). The terminal admin lives in `monarch_widgets.tui` (console script
`monarch-admin`).

Meshes show as a health grid in notebooks once this package is imported (or loaded with
`%load_ext monarch_widgets`, or by the Monarch kernel): it installs `mesh_html` as the
runtime's display hook (`runtime.hooks.set_display_hook`). A notebook that only imports
`runtime` shows meshes as their text `repr`.
"""

from __future__ import annotations

from typing import Any, Optional

from monarch_widgets.live import dashboard
from monarch_widgets.render import render_html, render_text
from runtime import hooks as _hooks

__all__ = ["dashboard", "install_display_hook", "mesh_html", "render_html", "render_text",
           "status_html"]


def mesh_html(mesh: Any, kind: str) -> Optional[str]:
    """The display hook: HTML of the health of one proc mesh or actor mesh (`kind`
    "proc_mesh" or "actor_mesh") from the running runtime; None to fall back to text."""
    import runtime

    from monarch_widgets.render import select

    rt = runtime.current_runtime()
    if rt is None:
        return None
    if kind == "proc_mesh":
        snap = select(rt.health.snapshot(), proc_mesh=mesh.name)
    elif kind == "actor_mesh" and getattr(mesh, "health_name", ""):
        snap = select(rt.health.snapshot(), mesh=mesh.health_name)
    else:
        return None
    return render_html(snap) if snap else None  # nothing in the health model: the text


def install_display_hook(replace: bool = True) -> None:
    """Make meshes display as `mesh_html` in notebooks; with `replace=False`, only if no
    other display hook is installed."""
    if replace or _hooks.get_display_hook() is None:
        _hooks.set_display_hook(mesh_html)


install_display_hook(replace=False)  # importing the views is asking for them


def status_html(mesh_name: Optional[str] = None, runtime: Any = None) -> str:
    """HTML of the current health of one mesh (actor or proc mesh, by name) or of all."""
    if runtime is None:
        from runtime import get_runtime

        runtime = get_runtime()
    snap = runtime.health.snapshot()
    if mesh_name is not None:
        snap = [m for m in snap if m.name == mesh_name or m.proc_mesh == mesh_name]
    return render_html(snap)


def load_ipython_extension(ip: Any) -> None:
    """`%load_ext monarch_widgets`: meshes display as health grids, and a `%mesh` with the
    view subcommands (status, stop, attach, admin) unless a `%mesh` is registered already
    (the Monarch kernel's, whose grammar builds on the views': `monarch_widgets.views`)."""
    install_display_hook()
    from monarch_widgets.views import register_magic

    register_magic(ip)
