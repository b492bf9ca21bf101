"""The notebook dashboard: one anywidget model for every actor of every mesh, updated live.

A background thread is the only writer of the widget's state: it wakes on health events
(or every second, for proc figures), snapshots the health model, and pushes at most
`max_rate` updates a second, so the view stays live while a cell is busy and many
changes at once cost one update. Front-end actions run on a worker thread.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import anywidget
import traitlets

from monarch_widgets import controls
from monarch_widgets.state import build_state
from runtime import active_mesh_names
from runtime.supervision.health import HealthModel

__all__ = ["Dashboard"]

log = logging.getLogger("monarch_widgets")
_STATIC = Path(__file__).parent / "static"


class Dashboard(anywidget.AnyWidget):
    """Live grid of every actor, colored by state, with per-proc figures and details."""

    _esm = _STATIC / "dashboard.js"
    _css = _STATIC / "dashboard.css"
    # compact JSON of monarch_widgets.state.build_state, sent as one binary buffer
    payload = traitlets.Bytes(b"{}").tag(sync=True)
    # the timeline tab's drawing (HTML with an SVG) and the actor detail's py-spy stacks
    timeline = traitlets.Unicode("").tag(sync=True)
    stacks = traitlets.Unicode("").tag(sync=True)  # JSON {mesh, rank, text}

    def __repr__(self) -> str:
        """Plain-text frontends (nbclient, a terminal) see the text rendering."""
        from .render import render_text

        return render_text(self._health.snapshot())

    def __init__(self, health: HealthModel, *, runtime: Any = None, max_rate: float = 4.0,
                 clock: Callable[[], float] = time.time, **kwargs: Any) -> None:
        if not isinstance(health, HealthModel):
            raise TypeError(f"health must be a HealthModel, got {type(health).__name__}")
        if max_rate <= 0:
            raise ValueError(f"max_rate must be > 0 updates/s, got {max_rate}")
        super().__init__(**kwargs)
        self.state: dict[str, Any] = {}  # the last state pushed, as a dict
        self._health = health
        self._runtime = runtime
        self._interval = 1.0 / max_rate
        self._clock = clock
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._notice = ""
        self._notice_lock = threading.Lock()
        self._seen_version = -1
        self.pushes = 0  # how many states were pushed (for tests and benchmarks)
        self._push()
        self._unsubscribe = health.subscribe(lambda ev: self._wake.set())
        self.on_msg(self._on_front_msg)
        self._thread = threading.Thread(target=self._run, name="monarch-dashboard",
                                        daemon=True)
        self._thread.start()

    # -- pushing state --------------------------------------------------------------------
    def _push(self) -> None:
        version = self._health.version
        with self._notice_lock:
            notice = self._notice
        snap = self._health.snapshot()
        st = build_state(snap, version=version, now=self._clock(), notice=notice,
                         active=active_mesh_names())
        self.payload = json.dumps(st, separators=(",", ":")).encode()
        self.state = st
        self._seen_version = version
        self.pushes += 1

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stopped.is_set():
            self._wake.wait(1.0)
            if self._stopped.is_set():
                break
            # coalesce: at most one push per interval, however many events arrived
            delay = last + self._interval - time.monotonic()
            if delay > 0 and self._stopped.wait(delay):
                break
            self._wake.clear()
            if self._health.version == self._seen_version and not self._notice_dirty():
                continue
            try:
                self._push()
            except Exception:
                log.exception("dashboard update failed")
            last = time.monotonic()

    def _notice_dirty(self) -> bool:
        """Whether the notice or the active meshes changed since the last push (neither
        changes the health model's version; the loop checks every second)."""
        if active_mesh_names() != self.state.get("active", []):
            return True
        with self._notice_lock:
            return self._notice != self.state.get("notice", "")

    def set_notice(self, text: str) -> None:
        """Show a one-line message (an action's outcome) on the next update."""
        with self._notice_lock:
            self._notice = text
        self._wake.set()

    def refresh(self) -> None:
        """Push the current snapshot on the next tick (e.g. after proc figures changed)."""
        self._seen_version = -1
        self._wake.set()

    # -- front-end actions ----------------------------------------------------------------
    def _on_front_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if not isinstance(content, dict):
            return
        threading.Thread(target=self.handle_action, args=(content,), daemon=True,
                         name="monarch-dashboard-action").start()

    def handle_action(self, content: dict[str, Any]) -> str:
        """Run one front-end action ({"action": "stop_mesh"|"attach"|"timeline"|"stacks",
        ...}); returns its notice."""
        action = content.get("action")
        try:
            if action == "stop_mesh":
                msg = controls.stop_mesh(str(content["mesh"]), runtime=self._runtime)
            elif action == "attach":
                msg = controls.attach(str(content["mesh"]), int(content["rank"]))
            elif action == "timeline":
                self.timeline = controls.timeline_html_all(self._runtime)
                msg = "timeline drawn"
            elif action == "stacks":
                mesh, rank = str(content["mesh"]), int(content["rank"])
                text = controls.stacks_text(mesh, rank, self._runtime,
                                            native=bool(content.get("native")))
                self.stacks = json.dumps({"mesh": mesh, "rank": rank, "text": text})
                msg = f"stacks of {mesh}[{rank}] taken by py-spy"
            else:
                msg = f"unknown action {action!r}"
        except Exception as e:
            msg = f"{action} failed: {type(e).__name__}: {e}"
        self.set_notice(msg)
        return msg

    @property
    def health(self) -> HealthModel:
        return self._health

    @property
    def runtime(self) -> Any:
        return self._runtime

    @property
    def max_rate(self) -> float:
        return 1.0 / self._interval

    def is_live(self) -> bool:
        """True until `close()`: the widget is still being updated."""
        return not self._stopped.is_set()

    def close(self) -> None:
        """Stop live updates and close the widget."""
        if hasattr(self, "_stopped"):
            self._stopped.set()
            self._wake.set()
        unsub = getattr(self, "_unsubscribe", None)
        if unsub is not None:
            unsub()
        super().close()
