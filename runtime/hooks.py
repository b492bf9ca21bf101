"""Hooks: how the views, the kernel, debugging and the admin endpoint plug into the runtime
without the runtime importing them.

- Start-up hooks, `add_startup_hook(fn)`: `fn(runtime)` runs once per controller runtime,
  when it creates its first mesh (debugging and the admin endpoint register here).
- The display hook, `set_display_hook(fn)`: `fn(mesh)` returns the HTML a notebook shows for
  a ProcMesh or ActorMesh (monarch_widgets registers its dashboard view), or None.
"""

from __future__ import annotations

import html
import logging
import threading
from typing import Any, Callable, Optional

log = logging.getLogger("runtime")

_startup: list[Callable[[Any], None]] = []
_started: "set[int]" = set()
_lock = threading.Lock()
_display: Optional[Callable[[Any], Optional[str]]] = None


def add_startup_hook(fn: Callable[[Any], None]) -> None:
    """Run `fn(runtime)` once per controller runtime when its first mesh is created."""
    with _lock:
        if fn not in _startup:
            _startup.append(fn)


def run_controller_hooks(rt: Any) -> None:
    """Run the start-up hooks for `rt` unless they already ran (called by the runtime)."""
    with _lock:
        if id(rt) in _started:
            return
        _started.add(id(rt))
        hooks = list(_startup)
    for fn in hooks:
        try:
            fn(rt)
        except Exception:
            log.exception("start-up hook %r failed", fn)


def set_display_hook(fn: Optional[Callable[[Any], Optional[str]]]) -> None:
    """Make `fn(mesh) -> html or None` render meshes in notebooks (None: plain text)."""
    global _display
    _display = fn


def render_html(obj: Any) -> str:
    """The HTML of a mesh: the display hook's, else its repr in a <pre>."""
    fn = _display
    if fn is not None:
        try:
            out = fn(obj)
            if out is not None:
                return out
        except Exception:
            log.exception("display hook failed")
    return f"<pre>{html.escape(repr(obj))}</pre>"
