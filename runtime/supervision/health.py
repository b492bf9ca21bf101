"""The health model: per-actor state as plain data, with snapshots and change events.

The runtime writes it (from its I/O thread); views (the notebook dashboard, the admin
TUI) read snapshots or subscribe to events. It holds no sockets and no processes.
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

__all__ = [
    "ActorState", "ProcStats", "ActorHealth", "waits_text", "MeshHealth", "HealthEvent",
    "Subscriber", "HealthModel",
]


class ActorState(str, enum.Enum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    PAUSED = "paused"  # stopped at a breakpoint
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(frozen=True)
class ProcStats:
    """Resource figures of one proc, as last reported."""

    proc_id: str
    host: str
    pid: int
    cpu_percent: float = 0.0
    rss_bytes: int = 0
    gpu_mem_bytes: Optional[int] = None
    tensor_bytes: Optional[int] = None  # what the tensor engine's shards hold in this proc


@dataclass(frozen=True)
class ActorHealth:
    """The state of one actor of a mesh."""

    mesh: str
    rank: int
    coords: dict[str, int]
    state: ActorState
    proc_id: str = ""
    host: str = ""
    pid: int = 0
    endpoint: Optional[str] = None  # the endpoint running, when busy or paused
    since: float = field(default_factory=time.time)  # when the state began (epoch s)
    handled: int = 0  # messages handled so far
    errors: int = 0  # endpoint calls that raised
    last_error: Optional[str] = None
    last_traceback: Optional[str] = None
    #: messages waiting in its mailbox, and what its running handler waits on, in words
    #: (`waits_text`), from its last heartbeat: what `runtime.diagnose` reads
    queued: int = 0
    waits: Optional[str] = None


def waits_text(w: Any) -> Optional[str]:
    """What a busy actor's handler waits on, short, for the views: a heartbeat's `waits`
    (a call's actor mesh and ranks, a C call it is blocked in, a port, a future) in words;
    None for nothing (it runs code)."""
    if not isinstance(w, dict):
        return None
    c = w.get("c")
    if isinstance(c, dict):
        return (f"a C call ({c.get('kind') or 'C code'}): {c.get('call') or '?'}, "
                "not cancellable (kill() ends its proc)")
    if "actor" in w:
        ranks = w.get("ranks") or []
        r = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
        return f"a call {w.get('label') or ''} to {w.get('mesh') or '?'} {r}".replace("  ", " ")
    label = w.get("label") or "a future"
    if label == "PortReceiver.recv":
        return "a value on a Channel port (recv)"
    return str(label)


@dataclass(frozen=True)
class MeshHealth:
    """A snapshot of every actor of one actor mesh."""

    name: str
    proc_mesh: str
    sizes: dict[str, int]
    actors: tuple[ActorHealth, ...]
    procs: tuple[ProcStats, ...] = ()
    #: spawned by the runtime or a front-end for its own work: views leave it out
    internal: bool = False
    #: seconds its procs' agents keep them after this controller goes away (a kept mesh,
    #: `spawn_procs(keep=)`: the lease runs from then); 0: they end with the controller
    keep: float = 0.0
    #: when this controller reattached it (time.time(); `Job.load(path).state()`, `%mesh
    #: attach-job`); None: this controller spawned it
    reattached: Optional[float] = None

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.actors:
            out[a.state.value] = out.get(a.state.value, 0) + 1
        return out

    @property
    def state(self) -> str:
        """One word for the mesh: failed if any actor failed, else the commonest state."""
        c = self.counts()
        if not c:
            return "empty"
        for s in ("failed", "stopped", "starting", "paused", "busy"):
            if c.get(s) == len(self.actors) or (s == "failed" and c.get(s)):
                return s
        if c.get("busy"):
            return "busy"
        if c.get("paused"):
            return "paused"
        if c.get("starting"):
            return "starting"
        return "idle"


@dataclass(frozen=True)
class HealthEvent:
    """One actor changed state."""

    mesh: str
    rank: int
    old: Optional[ActorState]
    new: ActorState
    time: float
    detail: Optional[str] = None


Subscriber = Callable[[HealthEvent], None]


class HealthModel:
    """Thread-safe store of actor health, with change subscribers."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._meshes: dict[str, dict[str, Any]] = {}
        self._actors: dict[str, dict[int, ActorHealth]] = {}
        # field changes that keep an actor's state (heartbeat counters: every actor, twice
        # a second), applied when read: cheaper than a new record per heartbeat
        self._pending: dict[str, dict[int, dict[str, Any]]] = {}
        self._procs: dict[str, ProcStats] = {}
        self._subs: list[Subscriber] = []
        self.version = 0

    # -- writers (runtime) -------------------------------------------------------------
    def add_mesh(self, name: str, proc_mesh: str, sizes: dict[str, int],
                 actors: list[ActorHealth], internal: bool = False, keep: float = 0.0,
                 reattached: Optional[float] = None) -> None:
        """Add (or replace) mesh `name`; `internal` marks one that views leave out; `keep`
        and `reattached` as in MeshHealth (a kept mesh's lease, when it was reattached)."""
        with self._lock:
            self._meshes[name] = {"proc_mesh": proc_mesh, "sizes": dict(sizes),
                                  "internal": bool(internal), "keep": float(keep or 0.0),
                                  "reattached": reattached}
            self._actors[name] = {a.rank: a for a in actors}
            self.version += 1
        for a in actors:
            self._emit(HealthEvent(name, a.rank, None, a.state, time.time()))

    def rename_mesh(self, old: str, new: str) -> None:
        """Move mesh `old` to the name `new` (its actors' records follow); no event."""
        with self._lock:
            if old not in self._meshes or new in self._meshes:
                return
            self._meshes[new] = self._meshes.pop(old)
            self._actors[new] = {r: replace(a, mesh=new)
                                 for r, a in self._actors.pop(old).items()}
            if old in self._pending:
                self._pending[new] = self._pending.pop(old)
            self.version += 1

    def remove_mesh(self, name: str) -> None:
        with self._lock:
            self._meshes.pop(name, None)
            self._actors.pop(name, None)
            self._pending.pop(name, None)
            self.version += 1

    def update(self, mesh: str, rank: int, state: Optional[ActorState] = None,
               detail: Optional[str] = None, **fields: Any) -> None:
        """Change one actor's record; emits an event when its state changes."""
        with self._lock:
            actors = self._actors.get(mesh)
            if actors is None or rank not in actors:
                return
            old = actors[rank]
            if old.state in (ActorState.FAILED, ActorState.STOPPED) and state not in (
                None, ActorState.STOPPED
            ):
                return  # terminal states stick (a stale busy report must not revive it)
            pending = self._pending.get(mesh, {}).get(rank)
            if state is None or state == old.state:
                if any((pending[k] if pending and k in pending else getattr(old, k)) != v
                       for k, v in fields.items()):
                    self._pending.setdefault(mesh, {}).setdefault(rank, {}).update(fields)
                    self.version += 1
                return
            if pending:
                del self._pending[mesh][rank]
            changes = {**(pending or {}), **fields, "state": state}
            changes.setdefault("since", time.time())
            actors[rank] = replace(old, **changes)
            self.version += 1
        if state is not None:
            self._emit(HealthEvent(mesh, rank, old.state, state, time.time(), detail))

    def remove_proc(self, proc_id: str) -> None:
        """Forget a proc's resource figures (it is gone)."""
        with self._lock:
            if self._procs.pop(proc_id, None) is not None:
                self.version += 1

    def __len__(self) -> int:
        """The number of meshes in the model."""
        with self._lock:
            return len(self._meshes)

    def update_proc(self, stats: ProcStats) -> None:
        with self._lock:
            self._procs[stats.proc_id] = stats
            self.version += 1

    # -- readers (views) ------------------------------------------------------------------
    def _apply_pending(self) -> None:
        for mesh, ranks in self._pending.items():
            actors = self._actors.get(mesh, {})
            for rank, fields in ranks.items():
                if rank in actors:
                    actors[rank] = replace(actors[rank], **fields)
        self._pending.clear()

    def snapshot(self, internal: bool = False) -> list[MeshHealth]:
        """Every mesh's health; the internal meshes too only with `internal=True`."""
        with self._lock:
            self._apply_pending()
            out = []
            for name, meta in self._meshes.items():
                if meta.get("internal") and not internal:
                    continue
                actors = tuple(sorted(self._actors[name].values(), key=lambda a: a.rank))
                pids = []
                seen = set()
                for a in actors:
                    if a.proc_id in self._procs and a.proc_id not in seen:
                        seen.add(a.proc_id)
                        pids.append(self._procs[a.proc_id])
                out.append(MeshHealth(name, meta["proc_mesh"], meta["sizes"], actors,
                                      tuple(pids), bool(meta.get("internal")),
                                      meta.get("keep", 0.0), meta.get("reattached")))
            return out

    def mesh(self, name: str) -> Optional[MeshHealth]:
        """The health of mesh `name` (internal or not), or None."""
        for m in self.snapshot(internal=True):
            if m.name == name:
                return m
        return None

    def proc_stats(self, proc_id: str) -> Optional[ProcStats]:
        with self._lock:
            return self._procs.get(proc_id)

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call `fn(event)` on every state change (on the runtime's thread; keep it short).

        Returns a function that unsubscribes."""
        with self._lock:
            self._subs.append(fn)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._subs:
                    self._subs.remove(fn)

        return unsubscribe

    def _emit(self, ev: HealthEvent) -> None:
        with self._lock:
            subs = list(self._subs)
        for fn in subs:
            try:
                fn(ev)
            except Exception:
                import logging

                logging.getLogger("runtime").exception("health subscriber failed")
