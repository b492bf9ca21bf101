"""Reattach: a controller takes over the procs and actors that host agents kept for it
after the controller before it went away (`spawn_procs(keep=...)`, docs/multihost.md
"Kept meshes"). The agents' attach answers list the kept procs (`AgentRecord.kept`); each
proc, asked with REATTACH, makes this controller its owner and lists its actors and the
old controller's calls that were lost with it. From these the usual records are rebuilt:
ProcRecords, ActorMeshRecords, health entries, and the ProcMesh and ActorMesh objects.
"""

from __future__ import annotations

import logging
import math
import pickle
import threading
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from .._core import ActorMeshRecord, ProcRecord, Runtime
from ..future import Future
from ..shapes import MeshTrait, Shape
from ..supervision.health import ActorHealth, ActorState
from ..transport.framing import Header, Kind

if TYPE_CHECKING:
    from .actor_mesh import ActorMesh
    from .proc_mesh import ProcMesh

__all__ = ["LostCall", "LostCallsWarning", "adopt_kept"]

log = logging.getLogger("runtime")


@dataclass(frozen=True)
class LostCall:
    """A call the previous controller made that had not answered it when it went away:
    `state` is "queued", "running" or "finished" (its answer went to the old controller)."""

    mesh: str
    rank: int
    endpoint: str
    state: str


class LostCallsWarning(UserWarning):
    """Calls of the controller before this one were lost with it (shown once, at reattach)."""


def adopt_kept(rt: Runtime, hm: MeshTrait, agents: list, spawned: Callable[[Any], None],
               timeout: float = 30.0) -> dict[str, "ProcMesh"]:
    """Rebuild here every proc mesh that `agents` (those of host mesh `hm`) kept for this
    controller, once (later calls return the same objects); `spawned(pm)` records each
    with `hm`. Returns name -> ProcMesh."""
    groups: dict[str, list] = {}

    def take() -> None:
        for a in agents:
            for info in a.kept:
                groups.setdefault(info["mesh"], []).append((a, info))
            a.kept = []

    rt.state.change(take)
    for name, items in groups.items():
        pm = _adopt_proc_mesh(rt, hm, name, items, spawned, timeout)
        for a, _ in items:
            a.adopted[name] = pm
    out: dict[str, ProcMesh] = {}
    for a in agents:
        out.update(a.adopted)
    return out


def _adopt_proc_mesh(rt: Runtime, hm: MeshTrait, name: str, items: list,
                     spawned: Callable[[Any], None], timeout: float) -> "ProcMesh":
    from .proc_mesh import ProcMesh

    labels, sizes = items[0][1].get("labels"), items[0][1].get("sizes")
    if labels is None or sizes is None:  # kept by an agent that did not record the shape
        labels, sizes = ["procs"], [len(items)]
    shape = Shape(tuple(labels), tuple(sizes))
    by_rank = {int(info["rank"]): (a, info) for a, info in items}
    procs: list[ProcRecord] = []
    missing = []
    for r in range(math.prod(sizes)):
        if r in by_rank:
            a, info = by_rank[r]
            procs.append(ProcRecord(info["proc_id"], r, name, a, "", host=a.host,
                                    pid=int(info.get("pid") or 0), state="running",
                                    keep=float(info.get("keep") or 0.0)))
        else:
            procs.append(ProcRecord(f"{name}-{r}-gone", r, name, None, ""))
            missing.append(procs[-1].proc_id)
    rt.state.change(rt.state.add_procs, procs)
    for proc_id in missing:
        rt.state.change(rt.failures.proc_failed, proc_id,
                        "the proc ended while no controller was attached (during the lease)")
    pm = ProcMesh(rt, name, procs, shape, hm)
    rt.register_mesh(pm)
    spawned(pm)
    answers = _ask_procs(rt, [p for p in procs if p.agent is not None], timeout)
    pm.kept_actor_meshes.update(_adopt_actor_meshes(rt, hm, pm, procs, answers))
    lost = [LostCall(c["mesh"], int(c["rank"]), c["endpoint"], c["state"])
            for ans in answers.values() for c in ans.get("lost", ())]
    pm.lost_calls = lost
    if lost:
        calls = ", ".join(f"{c.mesh}[{c.rank}].{c.endpoint} ({c.state})" for c in lost[:10])
        more = f" and {len(lost) - 10} more" if len(lost) > 10 else ""
        warnings.warn(LostCallsWarning(
            f"{len(lost)} call(s) of the previous controller to proc mesh {name!r} were lost "
            f"with it (their results went to it): {calls}{more}"), stacklevel=4)
    return pm


def _ask_procs(rt: Runtime, procs: list[ProcRecord], timeout: float) -> dict[str, dict]:
    """Send REATTACH to each proc and wait for the answers: proc id -> answer."""
    answers: dict[str, dict] = {}
    errors: dict[str, str] = {}
    done = threading.Event()
    want = {p.proc_id for p in procs}
    ports: dict[str, int] = {}

    def finish() -> None:
        if set(answers) | set(errors) >= want:
            done.set()

    for p in procs:
        def on_reply(h: Header, body: Any, buffers: list, p: ProcRecord = p) -> None:
            rt.close_port(ports[p.proc_id])
            answers[p.proc_id] = pickle.loads(bytes(body))
            finish()

        def on_fail(exc: BaseException, p: ProcRecord = p, **_: Any) -> None:
            rt.close_port(ports[p.proc_id])
            errors[p.proc_id] = str(exc)
            finish()

        ports[p.proc_id] = rt.open_port(on_reply, on_fail, {p.proc_id})
    for p in procs:
        a = p.agent
        assert a is not None
        reply = rt.reply_address_for(a.address)
        silent = a.prev_silent_for
        rt.send_to_proc(p.address, p.route, Header(
            Kind.REATTACH, reply=reply, port=ports[p.proc_id],
            extra={"owner": reply, "silent_for": silent, "old_alive": a.prev_alive}))
    if procs and not done.wait(timeout):
        late = sorted(want - set(answers) - set(errors))
        raise TimeoutError(f"kept procs {late} did not answer the reattach within {timeout:g} s")
    for proc_id, err in errors.items():
        log.warning("kept proc %s did not reattach: %s", proc_id, err)

    def update() -> None:
        for p in procs:
            ans = answers.get(p.proc_id)
            if ans is None:
                continue
            p.pid = int(ans.get("pid") or p.pid)
            p.tcp_address = ans.get("tcp") or ""
            if p.tcp_address and p.agent is not None:
                rt.messenger.same_cluster_as(p.tcp_address, p.agent.address)
            p.last_seen = time.monotonic()

    rt.state.change(update)
    return answers


def _adopt_actor_meshes(rt: Runtime, hm: MeshTrait, pm: "ProcMesh", pm_procs: list,
                        answers: dict[str, dict]) -> dict[str, "ActorMesh"]:
    """ActorMesh objects for the actors the procs of `pm` (`pm_procs`, by rank) listed:
    name -> mesh."""
    from .actor_mesh import ActorMesh

    by_id: dict[str, list] = {}
    proc_of = {p.proc_id: p for p in pm_procs}
    for proc_id, ans in answers.items():
        for act in ans.get("actors", ()):
            by_id.setdefault(act["actor_id"], []).append((proc_of[proc_id], act))
    out: dict[str, ActorMesh] = {}
    for actor_id, items in by_id.items():
        first = items[0][1]
        shape = Shape(tuple(first["labels"]), tuple(first["sizes"]))
        n = len(shape)
        ranked: dict[int, tuple] = {int(act["rank"]): (p, act) for p, act in items}
        if len(ranked) != n:  # an actor on a proc that ended during the lease: left out
            log.warning("kept actor mesh %r: ranks %s are gone", first["name"],
                        sorted(set(range(n)) - set(ranked)))
            continue
        procs = [ranked[r][0] for r in range(n)]
        cls = _load_class(first)
        rec = _record(rt, actor_id, first, procs, shape, cls)
        view = pm if [p.proc_id for p in pm_procs] == [p.proc_id for p in procs] else None
        if view is None:  # spawned on a slice of the proc mesh
            from .proc_mesh import ProcMesh

            view = ProcMesh(rt, pm.name, procs, shape, hm, _root=pm)

        def add(rec: ActorMeshRecord = rec) -> None:
            from .proc_mesh import claim_health_name

            rec.health_name = claim_health_name(rt, rec, pm.name)
            rt.state.add_actor_mesh(rec)
            rt.health.add_mesh(rec.health_name, pm.name, rec.sizes, [
                ActorHealth(rec.health_name, i, shape.coords_of(i), ActorState.IDLE,
                            proc_id=p.proc_id, host=p.host, pid=p.pid)
                for i, p in enumerate(procs)], internal=False,
                keep=max((p.keep for p in procs), default=0.0), reattached=time.time())
            for r in range(n):
                act = ranked[r][1]
                if act.get("failed"):
                    rec.ready[r] = act["failed"]
            rt.failures.check_initialized(rec)

        rt.state.change(add)
        am = ActorMesh(rt, rec, shape, view, cls)
        rt.register_mesh(am)
        out[rec.name] = am
    return out


def _load_class(act: dict) -> Optional[type]:
    """The actor class the proc sent (None when it cannot be unpickled here)."""
    if not act.get("pickled"):
        return None
    try:
        return pickle.loads(act["pickled"])
    except Exception as e:  # noqa: BLE001 - the mesh works by endpoint names without it
        log.info("the class of kept actor mesh %r cannot be loaded here (%s); its endpoints "
                 "are called by name", act["name"], e)
        return None


def _record(rt: Runtime, actor_id: str, act: dict, procs: list[ProcRecord], shape: Shape,
            cls: Optional[type]) -> ActorMeshRecord:
    """The owner's record of an adopted actor mesh (as `ProcMesh.spawn` makes one)."""
    from ..actor import endpoints_of
    from .proc_mesh import endpoint_signatures, method_signatures

    n = len(procs)
    rec = ActorMeshRecord(
        actor_id=actor_id, name=act["name"], cls_name=act.get("cls") or "",
        proc_ids=[p.proc_id for p in procs], addresses=[p.address for p in procs],
        routes=[p.route for p in procs], hosts=[p.host for p in procs],
        sizes=dict(zip(shape.labels, shape.sizes_)), owned=True,
        qual_cls=act.get("qcls") or "", ready=[True] * n, inflight=[0] * n,
        sigs=endpoint_signatures(cls) if cls is not None else {e: None for e in act["endpoints"]},
        initialized=Future(f"{act['name']}.initialized"))
    if cls is not None:
        eps = endpoints_of(cls)
        rec.methods = method_signatures(cls)
        rec.explicit_ports = frozenset(k for k, ep in eps.items() if ep.explicit_response_port)
        rec.propagates = {k: ep.propagate for k, ep in eps.items() if ep.propagate is not None}
    return rec
