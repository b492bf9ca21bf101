"""Views of the runtime's health model: a live notebook dashboard and static renderings.

`dashboard()` returns the live widget; `render_text` / `render_html` render a snapshot
without widgets (for `%mesh status` and meshes' `_repr_html_`). The terminal admin lives
in `monarch_widgets.tui` (console script `monarch-admin`).
"""

from __future__ import annotations

from typing import Any, Optional

from monarch_widgets.render import render_html, render_text

__all__ = ["dashboard", "render_html", "render_text", "status_html"]


_dashboards: dict[int, Any] = {}


def dashboard(runtime: Any = None, *, health: Any = None, max_rate: float = 4.0) -> Any:
    """The live dashboard widget of `runtime` (default: `runtime.get_runtime()`).

    Pass `health` (a HealthModel) to show one you fill yourself. Calling it again (a
    re-run cell) returns the same widget while it is open, so no stale updater piles up."""
    from monarch_widgets.widget import Dashboard

    if health is None:
        if runtime is None:
            from runtime import get_runtime

            runtime = get_runtime()
        health = runtime.health
    old = _dashboards.get(id(health))
    if (old is not None and old.is_live() and old.health is health
            and old.max_rate == max_rate and old.runtime is runtime):
        return old
    w = Dashboard(health, runtime=runtime, max_rate=max_rate)
    _dashboards[id(health)] = w
    return w


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
    """`%load_ext monarch_widgets` registers `%mesh status|stop|attach|admin`."""
    from monarch_widgets.magic import load_ipython_extension as load

    load(ip)
