"""The live dashboard: `dashboard()` returns the notebook widget of a health model, one per
model while it is open (a re-run cell gets the same one)."""

from __future__ import annotations

from typing import Any

__all__ = ["dashboard"]

_dashboards: dict[int, Any] = {}


def dashboard(runtime: Any = None, *, health: Any = None, max_rate: float = 4.0) -> Any:
    """The live dashboard widget of `runtime` (default: `runtime.get_runtime()`).

    Pass `health` (a HealthModel) to show one you fill yourself. Calling it again (a
    re-run cell) returns the same widget while it is open, so no stale updater piles up."""
    from monarch_widgets.widget import Dashboard  # import cost (anywidget)

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
