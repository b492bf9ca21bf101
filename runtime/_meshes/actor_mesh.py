"""ActorMesh: a mesh of actors, one per proc; endpoints are attributes with adverbs."""

from __future__ import annotations

import inspect
from typing import Any, Generator, Optional, Protocol

from .._core import ActorMeshRecord, Runtime, get_runtime, reach
from ..future import Future, resolved
from ..shapes import MeshTrait, Shape
from ..transport.framing import Header, Kind, extra_get
from .adverbs import EndpointRef, MeshRef, NotAnEndpoint
from .collector import cancel_calls

__all__ = [
    "ProcView", "ActorMesh", "ref_of", "view_of", "forget_endpoints", "stop_now", "arm_raise",
    "rebuild_actor_mesh",
]


class ProcView(Protocol):
    """What an actor mesh uses of the proc mesh its actors run on (a `ProcMesh`, which
    spawns it): the unsliced mesh it was sliced from, and its shape."""

    @property
    def root(self) -> Any: ...

    @property
    def shape(self) -> Shape: ...


class ActorMesh(MeshTrait):
    """A mesh of actors, one per proc; endpoints are attributes with call/choose/... adverbs.
    `ActorMesh[T]` is the class itself (Monarch's generic annotation)."""

    def __class_getitem__(cls, item: Any) -> type:
        return cls

    def __init__(self, rt: Runtime, rec: ActorMeshRecord, shape: Shape,
                 proc_mesh: Optional[ProcView], actor_class: Optional[type] = None) -> None:
        self._ref = MeshRef(rt, rec, shape, proc_mesh, actor_class)  # what endpoints get
        for name in _MESH_METHODS.intersection(rec.sigs):  # as in Monarch, an endpoint named
            self.__dict__[name] = EndpointRef(self, self._ref, name, rec.sigs[name])  # wins

    # this view's parts, all held by its MeshRef (`ref_of` below gives it to other modules)
    _rt = property(lambda self: self._ref.rt)
    _rec = property(lambda self: self._ref.rec)
    _shape = property(lambda self: self._ref.shape)
    _proc_mesh = property(lambda self: self._ref.proc_mesh)
    _class = property(lambda self: self._ref.actor_class)

    @property
    def name(self) -> str:
        return self._rec.name

    @property
    def proc_mesh(self) -> Optional[ProcView]:
        return self._proc_mesh

    @property
    def stopped(self) -> bool:
        """True once these actors (or their procs) were stopped."""
        return self._rec.stopped

    _stopped_flag = stopped  # the older name, still asserted by a kernel test

    @property
    def health_name(self) -> str:
        """This mesh's key in the runtime's health model (`rt.health`): its name, or e.g.
        "name~2" while another live mesh has the name; "" where this process does not own it."""
        return self._rec.health_name

    @property
    def internal(self) -> bool:
        """True for a mesh the runtime or a front-end spawned for its own work
        (`ProcMesh.spawn_internal`): views and `runtime.get_runtime().meshes()` leave it out."""
        return self._rec.internal

    @property
    def class_name(self) -> str:
        """The name of the actor class."""
        return self._rec.cls_name

    def restricted_to(self, procs: ProcView) -> "ActorMesh":
        """The actors of this mesh that live on `procs`, a view (slice) of the unsliced proc
        mesh this actor mesh was spawned on, with the dimensions of that view."""
        pm = self._proc_mesh
        if pm is None or pm.root is not pm or procs.root is not pm:
            raise ValueError(f"{procs!r} is not a view of the proc mesh actor mesh "
                             f"{self.name!r} was spawned on")
        return self._new_with_shape(procs.shape)

    def _new_with_shape(self, shape: Shape) -> "ActorMesh":
        return ActorMesh(self._rt, self._rec, shape, self._proc_mesh, self._class)

    def _ranks(self) -> list[int]:
        return self._ref.ranks()

    def __getattr__(self, name: str) -> "EndpointRef | NotAnEndpoint":
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        ref = self.__dict__.get("_ref")
        if ref is None:
            raise AttributeError(name)
        rec = ref.rec
        if name not in rec.sigs:
            if name in rec.methods:
                return NotAnEndpoint(self, ref, name)
            have = ", ".join(sorted(rec.sigs)) or "none"
            raise AttributeError(
                f"{rec.cls_name} has no endpoint {name!r} (its endpoints: {have})"
                + _reloaded_elsewhere(ref.rt, rec, name))
        ep = EndpointRef(self, ref, name, rec.sigs[name])
        self.__dict__[name] = ep  # endpoints are looked up once per view
        return ep

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._rec.sigs))

    def __await__(self) -> Generator[Any, None, "ActorMesh"]:
        """`await mesh` (older Monarch programs await what `spawn` returns): waits for
        `initialized` and gives back the mesh itself."""
        yield from self.initialized.__await__()
        return self

    @property
    def initialized(self) -> Future:
        """Resolves when every actor ran `__init__`; raises if one failed there."""
        rec = self._rec
        if rec.initialized is None:
            return resolved(None)
        return rec.initialized

    def cancel_calls(self) -> int:
        """Cancel every call this process has in flight to these actors, as
        `Future.cancel()` does (`%mesh cancel`); returns how many."""
        rec = self._rec
        return cancel_calls(self._rt, set(rec.proc_ids), rec.actor_id)

    def kill(self) -> Future:
        """SIGKILL the procs that host these actors (this view's), for a handler that
        cancel cannot stop (one blocked in a C call): every actor on those procs fails,
        and the failure (`__supervise__`, waiting calls, the fault report) says the user
        killed it. Returns a Future resolved once each death is known."""
        rec = self._rec
        ids = [rec.proc_ids[r] for r in self._shape.global_ranks()]
        return self._rt.kill_procs(ids, f"killed by the user (kill() of actor mesh "
                                        f"{rec.name!r})")

    def stop(self, reason: str = "stopped by client") -> Future:
        """Stop these actors (running `__cleanup__`); their procs keep running. `reason` (as
        in Monarch) is accepted for the record only."""
        rt = self._rt
        rec = self._rec
        fut: Future = Future(f"{rec.name}.stop")

        def mark() -> set:
            rec.stopped = True
            rt.state.retire_actor_mesh(rec.actor_id)  # stopped means gone (state.py)
            return {r for r in range(len(rec.proc_ids))
                    if rec.proc_ids[r] not in rt.state.dead_procs}

        def done() -> None:  # on the I/O thread
            if rec.health_name:
                rt.health.remove_mesh(rec.health_name)
            fut.set_result(None)

        remaining = rt.state.change(mark)
        if not remaining:
            rt.loop.call_soon(done)
            return fut

        def on_stopped(h: Header, body: Any, buffers: list) -> None:
            remaining.discard(h.rank)
            if not remaining:
                rt.close_port(port)
                done()

        def on_fail(exc: BaseException, **_: Any) -> None:
            rt.close_port(port)
            done()

        port = rt.open_port(on_stopped, on_fail, {rec.proc_ids[r] for r in remaining})
        for r in list(remaining):
            addr, route = rec.target(r)
            reply = rt.reply_address_for(addr or (route or ("",))[0])
            rt.send_to_proc(addr, route, Header(Kind.STOP_ACTOR, actor=rec.actor_id, rank=r,
                                                reply=reply, port=port),
                            base=rec.agents() if rec.routes else None)  # after its casts
        return fut

    def _stop_now(self, timeout: float = 5.0) -> None:
        ActorMesh.stop(self).get(timeout)  # not an endpoint called stop

    def __reduce__(self) -> Any:
        r = self._rec
        state = {
            "actor_id": r.actor_id, "name": r.name, "cls_name": r.cls_name,
            "proc_ids": r.proc_ids, "addresses": r.addresses, "hosts": r.hosts,
            "routes": r.routes, "sizes": r.sizes, "sigs": r.sigs, "shape": self._shape,
            "methods": r.methods, "explicit_ports": r.explicit_ports,
            "internal": r.internal, "serves": r.serves,
            "alts": reach.alternatives(self._rt, r.addresses, r.alts),
        }
        return (rebuild_actor_mesh, (state,))

    def __repr__(self) -> str:
        return f"<ActorMesh {self._rec.name!r} {self._rec.cls_name} {self.sizes}>"

    def _repr_html_(self) -> str:
        from ..hooks import mesh_html  # the views' display hook, else <pre>repr</pre>

        return mesh_html(self, "actor_mesh")


# Public methods of ActorMesh; an endpoint of the same name shadows one on the mesh (`stop`:
# `mesh.stop` is the endpoint, `ActorMesh.stop(mesh)` still stops the actors).
_MESH_METHODS = frozenset(n for n in dir(ActorMesh) if not n.startswith("_")
                          and inspect.isfunction(inspect.getattr_static(ActorMesh, n)))


def ref_of(mesh: ActorMesh) -> MeshRef:
    """The MeshRef `mesh` holds (its runtime, record, view, proc mesh and class): how the
    runtime's other modules reach an actor mesh's parts."""
    return mesh._ref


def view_of(mesh: ActorMesh, shape: Shape) -> ActorMesh:
    """The view of `mesh`'s actors with `shape` (a shape over the same record)."""
    return mesh._new_with_shape(shape)


def forget_endpoints(mesh: ActorMesh) -> None:
    """Drop the endpoints `mesh` looked up (looked up again, from its record, on next use)."""
    for k in [k for k, v in mesh.__dict__.items() if isinstance(v, EndpointRef)]:
        del mesh.__dict__[k]


def stop_now(mesh: ActorMesh, timeout: float) -> None:
    """Stop `mesh`'s actors and wait (an owning actor's stop, `stop_owned_meshes`)."""
    mesh._stop_now(timeout=timeout)


def arm_raise(mesh: ActorMesh, rank: int, reason: str) -> Future:
    """`runtime.inject_raise` (checked there): ask the actor at `rank` of this view to raise
    InjectedFault at its next endpoint call. Future[bool]: whether it was armed (False: that
    actor is gone or failed); fails (SupervisionError) if its proc dies first."""
    rt, rec = mesh._rt, mesh._rec
    ranks = mesh._ranks()
    if not 0 <= rank < len(ranks):
        raise IndexError(f"inject_raise: rank {rank} is not in actor mesh {rec.name!r} "
                         f"({len(ranks)} actors)")
    g = ranks[rank]
    fut: Future = Future(f"inject_raise({rec.name}, {rank})")
    if rec.stopped or rec.proc_ids[g] in rt.state.dead_procs or g in rec.failed:
        fut.set_result(False)
        return fut

    def on_reply(h: Header, body: Any, buffers: list) -> None:
        rt.close_port(port)
        fut.set_result(bool(extra_get(h, "armed", False)))

    def on_fail(exc: BaseException, **_: Any) -> None:
        rt.close_port(port)
        fut.set_exception(exc)

    port = rt.open_port(on_reply, on_fail, {rec.proc_ids[g]})
    addr, route = rec.target(g)
    reply = rt.reply_address_for(addr or (route or ("",))[0])
    rt.send_to_proc(addr, route, Header(Kind.INJECT, actor=rec.actor_id, rank=g, reply=reply,
                                        port=port, extra={"reason": str(reason)}))
    return fut


def rebuild_actor_mesh(state: dict) -> ActorMesh:
    """An ActorMesh from the state `ActorMesh.__reduce__` gives (its record found or added)."""
    rt = get_runtime()
    rec = rt.state.actor_meshes.get(state["actor_id"])
    if rec is None:
        n = len(state["proc_ids"])
        alts = state.get("alts") or []
        rec = ActorMeshRecord(
            actor_id=state["actor_id"], name=state["name"], cls_name=state["cls_name"],
            proc_ids=state["proc_ids"], hosts=state["hosts"],
            addresses=reach.choose(rt, state["addresses"], state["hosts"], alts),
            sizes=state["sizes"], owned=False, ready=[True] * n, inflight=[0] * n,
            health_name="", sigs=state["sigs"], routes=state.get("routes") or [],
            methods=state.get("methods") or {},
            explicit_ports=state.get("explicit_ports") or frozenset(),
            internal=bool(state.get("internal")), serves=state.get("serves") or "",
            alts=alts,
        )
        rec = rt.state.change(rt.state.add_actor_mesh, rec)
    return ActorMesh(rt, rec, state["shape"], None)


_rebuild_actor_mesh = rebuild_actor_mesh  # the name in pickles of older versions


def _reloaded_elsewhere(rt: Optional[Runtime], rec: ActorMeshRecord, name: str) -> str:
    """When live actors of another mesh run a reloaded version of this mesh's class that has
    endpoint `name`: a sentence saying this mesh has the class from before the reload, and
    what to do; else ""."""
    if rt is None:
        return ""
    qual = rec.qual_cls or rec.cls_name
    others = [r.name for r in list(rt.state.actor_meshes.values())
              if r is not rec and not r.stopped and name in r.sigs
              and (r.qual_cls or r.cls_name) == qual]
    if not others:
        return ""
    module, _, cls = qual.rpartition(".")
    redo = (f"re-run the cell that defines {cls}" if module in ("", "__main__") else
            f"importlib.reload({module}) and `from {module} import {cls}` again")
    return (f". Live actors of {others[0]!r} run {cls} as reloaded, which has it; "
            f"{rec.name!r} was spawned with the controller's copy of {cls} from before the "
            f"reload (the controller is not reloaded): {redo}, then spawn again, or give "
            "these actors the new class with runtime.reload_actor_class (%mesh reload)")
