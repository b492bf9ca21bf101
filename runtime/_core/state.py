"""The state table: records of the agents, procs and actor meshes this process knows.

Invariant: records change only on the I/O thread. Other threads ask (`proc()`,
`live_meshes()`, ...) and submit changes with `change(fn, *args)`, which runs `fn` on the
I/O thread and waits for it. The one table written from user threads is the registry of
user-facing mesh objects (weak references, under a lock).

Lifetimes: a proc or actor mesh that is stopped or dead is *retired*: its record leaves the
live table and stays reachable by id only through a weak reference, i.e. as long as a user
object (a ProcMesh, an ActorMesh) still holds it. So a failed mesh's report lives exactly
as long as the user's mesh object, and nothing grows under churn.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any, Callable, Iterator, Optional

from ..transport.loop import IOLoop
from .records import ActorMeshRecord, AgentRecord, ProcRecord

__all__ = ["Table", "DeadProcs", "State"]


class Table(dict):
    """A dict of live records, plus retired ones reachable by key while a user object holds
    them (weak references). Iteration and len() see the live records only."""

    def __init__(self) -> None:
        super().__init__()
        self.retired: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()

    def get(self, key: Any, default: Any = None) -> Any:
        v = dict.get(self, key)
        if v is None:
            v = self.retired.get(key, default)
        return v

    def __missing__(self, key: Any) -> Any:
        v = self.retired.get(key)
        if v is None:
            raise KeyError(key)
        return v

    def retire(self, key: Any) -> None:
        """Move `key`'s record from the live table to the weak one."""
        v = self.pop(key, None)
        if v is not None:
            self.retired[key] = v

    def all_values(self) -> list:
        """Live and still-referenced retired records."""
        return list(self.values()) + list(self.retired.values())


class DeadProcs:
    """Ids of dead procs this process has no record of (a bounded FIFO), plus every retired
    record whose state is failed or stopped; `in` answers for both."""

    LIMIT = 1024

    def __init__(self, procs: Table) -> None:
        self._procs = procs
        self._ids: collections.OrderedDict = collections.OrderedDict()

    def add(self, proc_id: str) -> None:
        rec = self._procs.get(proc_id)
        if rec is not None and rec.state in ("failed", "stopped"):
            return  # its record says it
        self._ids[proc_id] = None
        while len(self._ids) > self.LIMIT:
            self._ids.popitem(last=False)

    def discard(self, proc_id: str) -> None:
        self._ids.pop(proc_id, None)

    def __contains__(self, proc_id: object) -> bool:
        return self.first_of((proc_id,)) is not None

    def first_of(self, proc_ids: Any) -> Optional[str]:
        """The first of `proc_ids` that is dead, or None (`in` for each, in one call: every
        call asks it for the procs it waits on)."""
        ids, table, get = self._ids, self._procs, dict.get
        for p in proc_ids:
            if p in ids:
                return p
            rec = get(table, p)
            if rec is None:
                rec = table.retired.get(p)
            if rec is not None and rec.state in ("failed", "stopped"):
                return p
        return None

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._ids))

    def __len__(self) -> int:
        return len(self._ids)


class State:
    """Agents, procs, actor meshes and dead procs of one runtime."""

    def __init__(self, loop: IOLoop) -> None:
        self.loop = loop
        self.agents: dict[str, AgentRecord] = {}
        self.agent_alias: dict[str, AgentRecord] = {}  # agents' own ids -> records
        self.procs: Table = Table()  # proc id -> ProcRecord (live; retired ones weakly)
        self.actor_meshes: Table = Table()  # actor id -> ActorMeshRecord (likewise)
        self.dead_procs = DeadProcs(self.procs)
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
        """Add `rec` unless a record of that actor id exists; returns the one kept. A mesh
        this process does not own (a reference received in a message) is kept weakly: it
        lives as long as the ActorMesh objects that use it."""
        have = self.actor_meshes.get(rec.actor_id)
        if have is not None:
            return have
        if rec.owned:
            self.actor_meshes[rec.actor_id] = rec
        else:
            self.actor_meshes.retired[rec.actor_id] = rec
        return rec

    def retire_proc(self, proc_id: str) -> list[ActorMeshRecord]:
        """The proc is dead and reported: drop it from the live tables (I/O thread).
        Returns the actor meshes retired with it (every proc of theirs is gone)."""
        rec = dict.get(self.procs, proc_id)
        if rec is None:
            return []
        self.procs.retire(proc_id)
        self.dead_procs.discard(proc_id)
        if rec.agent is not None:
            rec.agent.procs.discard(proc_id)
            if rec.agent.lost:  # may still run over there: killed when the link returns
                rec.agent.stale.add(proc_id)
        gone = []
        for m, _ in list(self.meshes_on(proc_id)):
            if all(dict.get(self.procs, p) is None for p in m.proc_ids):
                self.actor_meshes.retire(m.actor_id)
                gone.append(m)
        return gone

    def drop_agent(self, rec: AgentRecord) -> None:
        """A local host agent that exited: forget it (and its aliases) (I/O thread)."""
        if self.agents.get(rec.agent_id) is rec:
            del self.agents[rec.agent_id]
        for k in [k for k, a in self.agent_alias.items() if a is rec]:
            del self.agent_alias[k]

    def retire_actor_mesh(self, actor_id: str) -> None:
        """The actor mesh was stopped: drop it from the live table (I/O thread)."""
        self.actor_meshes.retire(actor_id)

    def sizes(self) -> dict[str, int]:
        """Entries in each table (for soak tests and benchmarks)."""
        return {"procs": len(self.procs), "actor_meshes": len(self.actor_meshes),
                "dead_procs": len(self.dead_procs), "agents": len(self.agents),
                "agent_procs": sum(len(a.procs) for a in self.agents.values()),
                "retired_procs": len(self.procs.retired),
                "retired_meshes": len(self.actor_meshes.retired),
                "mesh_objects": len(self._mesh_objects)}

    def alias_agent(self, src: str, rec: AgentRecord) -> None:
        self.agent_alias[src] = rec

    # -- questions (any thread) -----------------------------------------------------------
    def proc(self, proc_id: str) -> Optional[ProcRecord]:
        """The record of a proc, or None."""
        return self.procs.get(proc_id)

    def is_running(self, proc_id: str) -> bool:
        """Whether `proc_id` is a proc this process owns and has not seen end: its exit
        (or its agent's death) is still to be reported here."""
        rec = self.procs.get(proc_id)
        return rec is not None and rec.state in ("starting", "running")

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

    def health_names(self, internal: Optional[bool] = None) -> set[str]:
        """The health-model names of the live actor meshes: all of them, or only the
        internal (`internal=True`) or the user's (`internal=False`) ones."""
        return {m.health_name for m in self.actor_meshes.all_values()
                if not m.stopped and (internal is None or m.internal == internal)}

    def actor_mesh_of_failure(self, failure: Any) -> Optional[ActorMeshRecord]:
        """The record that holds `failure` (a MeshFailure) among its failed ranks, if any."""
        for m in self.actor_meshes.all_values():
            if any(f is failure for f in m.failed.values()):
                return m
        return None

    # -- user-facing mesh objects (any thread) ----------------------------------------------
    def register_mesh(self, obj: Any) -> None:
        with self._lock:
            self._mesh_objects = [r for r in self._mesh_objects
                                  if (o := r()) is not None and not o.stopped]
            self._mesh_objects.append(weakref.ref(obj))

    def live_meshes(self, internal: bool = False) -> list:
        """The ProcMesh and ActorMesh objects of this process that are not stopped; the
        internal ones (`ProcMesh.spawn_internal`) only with `internal=True`."""
        out = []
        for ref in list(self._mesh_objects):
            obj = ref()
            if obj is not None and not obj.stopped and (
                    internal or not getattr(obj, "internal", False)):
                out.append(obj)
        return out
