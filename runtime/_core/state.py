"""The state table: records of the agents, procs and actor meshes this process knows.

Invariant: records change only on the I/O thread. Other threads ask (`proc()`,
`live_meshes()`, ...) and submit changes with `change(fn, *args)`, which runs `fn` on the
I/O thread and waits for it. The one table written from user threads is the registry of
user-facing mesh objects (weak references, under a lock).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Iterator, Optional

from ..transport.loop import IOLoop
from .records import ActorMeshRecord, AgentRecord, ProcRecord


class State:
    """Agents, procs, actor meshes and dead procs of one runtime."""

    def __init__(self, loop: IOLoop) -> None:
        self.loop = loop
        self.agents: dict[str, AgentRecord] = {}
        self.agent_alias: dict[str, AgentRecord] = {}  # agents' own ids -> records
        self.procs: dict[str, ProcRecord] = {}
        self.actor_meshes: dict[str, ActorMeshRecord] = {}
        self.dead_procs: set[str] = set()
        self._mesh_objects: list = []
        self._lock = threading.Lock()

    # -- changes (I/O thread) ------------------------------------------------------------
    def change(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run the change `fn(*args)` on the I/O thread and return its result."""
        return self.loop.run_sync(fn, *args)

    def add_agent(self, rec: AgentRecord) -> None:
        self.agents[rec.agent_id] = rec

    def add_procs(self, recs: list[ProcRecord]) -> None:
        for rec in recs:
            self.procs[rec.proc_id] = rec
            if rec.agent is not None:
                rec.agent.procs.add(rec.proc_id)

    def add_actor_mesh(self, rec: ActorMeshRecord) -> ActorMeshRecord:
        """Add `rec` unless a record of that actor id exists; returns the one kept."""
        return self.actor_meshes.setdefault(rec.actor_id, rec)

    def alias_agent(self, src: str, rec: AgentRecord) -> None:
        self.agent_alias[src] = rec

    # -- questions (any thread) -----------------------------------------------------------
    def proc(self, proc_id: str) -> Optional[ProcRecord]:
        """The record of a proc, or None."""
        return self.procs.get(proc_id)

    def agent_for(self, src: str) -> Optional[AgentRecord]:
        return self.agents.get(src) or self.agent_alias.get(src)

    def meshes_on(self, proc_id: str) -> Iterator[tuple[ActorMeshRecord, int]]:
        """(actor mesh, rank) for every actor mesh with an actor on `proc_id`."""
        for m in list(self.actor_meshes.values()):
            r = m.rank_of(proc_id)
            if r >= 0:
                yield m, r

    def running_procs(self) -> list[ProcRecord]:
        return [p for p in self.procs.values() if p.state == "running"]

    def health_names(self) -> set[str]:
        return {m.health_name for m in self.actor_meshes.values() if not m.stopped}

    # -- user-facing mesh objects (any thread) ----------------------------------------------
    def register_mesh(self, obj: Any) -> None:
        with self._lock:
            self._mesh_objects = [r for r in self._mesh_objects if r() is not None]
            self._mesh_objects.append(weakref.ref(obj))

    def live_meshes(self) -> list:
        """The ProcMesh and ActorMesh objects of this process that are not stopped."""
        out = []
        for ref in list(self._mesh_objects):
            obj = ref()
            if obj is not None and not obj.stopped:
                out.append(obj)
        return out
