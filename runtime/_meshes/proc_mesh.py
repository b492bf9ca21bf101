"""ProcMesh: a mesh of procs; `spawn` starts one actor per proc."""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Generator, Optional

from .._base import context as _context
from .._base import features as _features
from .._core import ActorMeshRecord, ProcRecord, Runtime
from ..actor import (Actor, creator_record, endpoints_of, methods_of,
                     plain_signature, qualified_class)
from ..config import config
from ..errors import MeshStoppedError, SerializationError, SupervisionError
from ..future import Future, completed
from ..shapes import MeshTrait, Shape
from ..supervision import injection as _injection
from ..supervision.health import ActorHealth, ActorState
from ..transport.framing import Header, Kind
from ..transport.serialization import check_size, dumps
from .collector import cancel_calls

if TYPE_CHECKING:
    from .actor_mesh import ActorMesh

__all__ = [
    "ProcInfo", "ProcMesh", "endpoint_signatures", "caller_signature", "method_signatures",
    "active_mesh_names", "claim_health_name", "runtime_of", "view_procs", "all_procs",
    "stop_owned_meshes",
]


@dataclass(frozen=True)
class ProcInfo:
    """Where one proc of a mesh runs, and its state when it was read (starting, running,
    failed, stopped ...)."""

    rank: int
    proc_id: str
    host: str
    pid: int
    address: str
    state: str = ""


class ProcMesh(MeshTrait):
    """A mesh of procs; `spawn` starts one actor per proc."""

    def __init__(self, rt: Runtime, name: str, procs: list[ProcRecord], shape: Shape,
                 host_mesh: MeshTrait, _root: Optional["ProcMesh"] = None) -> None:
        self._rt = rt
        self.name = name
        self._procs = procs
        self._shape = shape
        self._host_mesh = host_mesh
        self._root = _root or self
        ctx = _context.get_context()
        self._owner_actor = ctx.actor_id if ctx is not None else None
        self._stopped_flag = False
        self._borrowed = False  # a reference received from another process (unpickled)
        #: actor meshes kept with these procs and reattached here (runtime._meshes.reattach)
        self.kept_actor_meshes: dict = {}
        #: the previous controller's calls lost with it (`reattach.LostCall`), when reattached
        self.lost_calls: list = []
        self._foreign = False  # ... by a process of another controller's session

    def _new_with_shape(self, shape: Shape) -> "ProcMesh":
        return ProcMesh(self._rt, self.name, self._procs, shape, self._host_mesh, self._root)

    @property
    def host_mesh(self) -> MeshTrait:
        """The host mesh (a `HostMesh`) these procs run on (this_host() for this_proc())."""
        if self._host_mesh is None and self._root is not self:
            return self._root.host_mesh  # a view of this_proc() (local.ThisProcMesh)
        return self._host_mesh

    @property
    def root(self) -> "ProcMesh":
        """The unsliced proc mesh this view was sliced from (the mesh itself if unsliced)."""
        return self._root

    @property
    def stopped(self) -> bool:
        """True once `stop()` was called on this proc mesh or on any view of it."""
        return self._stopped_flag or self._root._stopped_flag

    def _view_procs(self) -> list[ProcRecord]:
        return [self._procs[r] for r in self._shape.global_ranks()]

    @property
    def procs(self) -> list[ProcInfo]:
        """Where each proc of this view runs (pid 0 until the proc has said hello)."""
        return [ProcInfo(i, p.proc_id, p.host, p.pid, p.address, str(p.state))
                for i, p in enumerate(self._view_procs())]

    def __await__(self) -> Generator[Any, None, "ProcMesh"]:
        """`await mesh` (older Monarch programs await what `spawn` returns): waits for
        `initialized` and gives back the mesh itself."""
        yield from self.initialized.__await__()
        return self

    @property
    def initialized(self) -> Future:
        """Resolves to True (as Monarch's) once every proc of the view has started, or fails
        if one died."""
        fut: Future = Future(f"{self.name}.initialized")
        recs = self._view_procs()
        loop = self._rt.loop

        def poll() -> None:
            if all(r.pid for r in recs):
                fut.set_result(True)
                return
            bad = [r for r in recs if r.state in ("failed", "stopped") and not r.pid]
            if bad:
                fut.set_exception(SupervisionError(f"proc {bad[0].proc_id} failed to start: "
                                                   f"{bad[0].failure}", bad[0].failure))
                return
            loop.call_later(0.01, poll)

        loop.call_soon(poll)
        return fut

    def spawn(self, name: str, actor_class: type, *args: Any, **kwargs: Any) -> "ActorMesh":
        """Start one `actor_class(*args, **kwargs)` per proc (non-blocking)."""
        return self._spawn(name, actor_class, args, kwargs, internal=False)

    def spawn_internal(self, name: str, actor_class: type, *args: Any,
                       **kwargs: Any) -> "ActorMesh":
        """`spawn` for the runtime's or a front-end's own work on these procs (a notebook's
        cell runner, the tensor engine, SPMD set-up): the mesh is internal, so views,
        `get_runtime().meshes()` and the health snapshot leave it out, its name never
        takes one of the user's (its health name is `<proc mesh>.<name>`), and its
        failures are reported against this proc mesh."""
        return self._spawn(name, actor_class, args, kwargs, internal=True)

    def _spawn(self, name: str, actor_class: type, args: tuple, kwargs: dict,
               internal: bool) -> "ActorMesh":
        from .actor_mesh import ActorMesh

        if not isinstance(name, str) or not name:
            raise TypeError(f"spawn(name, ActorClass, ...): name must be a non-empty str, "
                            f"got {name!r}")
        if not (isinstance(actor_class, type) and issubclass(actor_class, Actor)):
            raise TypeError(f"spawn({name!r}, ...): {actor_class!r} is not an Actor subclass")
        if self.stopped:
            raise MeshStoppedError(f"`ProcMesh` has already been stopped (proc mesh "
                                   f"{self.name!r}); it cannot spawn actors")
        if self._root._foreign:
            raise RuntimeError(
                f"proc mesh {self.name!r} belongs to another controller's session (it was "
                "pickled there and unpickled in this separately started process); its procs "
                "only take messages from their own session. Spawn procs of your own, or pass "
                "the mesh to an actor of that controller")
        _check_init_args(actor_class, args, kwargs)
        try:
            body, bufs = dumps((actor_class, args, kwargs), "actor class and arguments")
        except SerializationError as e:
            raise SerializationError(f"spawn({name!r}, {actor_class.__name__}): {e}") from None
        check_size(body, bufs, f"spawn({name!r}, {actor_class.__name__})'s class and arguments")
        rt = self._rt
        procs = self._view_procs()
        labels, sizes = self._shape.labels, self._shape.sizes_
        ctx = _context.get_context()
        creator = creator_record(ctx)
        rec = ActorMeshRecord(
            actor_id=rt.new_id(name), name=name, cls_name=actor_class.__name__,
            proc_ids=[p.proc_id for p in procs], addresses=[p.address for p in procs],
            routes=[p.route for p in procs],
            hosts=[p.host for p in procs], sizes=dict(zip(labels, sizes)), owned=True,
            owner_actor=ctx.actor_id if ctx is not None else None,
            owner_name=str(ctx) if ctx is not None else "<root>",
            qual_cls=qualified_class(actor_class),
            ready=[None] * len(procs), inflight=[0] * len(procs),
            sigs=endpoint_signatures(actor_class), initialized=Future(f"{name}.initialized"),
            propagates={n: ep.propagate for n, ep in endpoints_of(actor_class).items()
                        if ep.propagate is not None},
            internal=internal, serves=self.name if internal else "",
        )
        rec.methods = method_signatures(actor_class)
        rec.explicit_ports = frozenset(n for n, ep in endpoints_of(actor_class).items()
                                       if ep.explicit_response_port)
        shape = Shape(labels, sizes)
        first = procs[0] if procs else None
        reply = rt.reply_address_for(
            (first.address or (first.agent.address if first.agent is not None else ""))
            if first is not None else "")

        def add() -> list:
            """On the I/O thread: record the mesh; the ranks whose proc is already dead."""
            rec.health_name = health_name = claim_health_name(rt, rec, self.name)
            rt.state.add_actor_mesh(rec)
            rt.health.add_mesh(health_name, self.name, rec.sizes, [
                ActorHealth(health_name, i, shape.coords_of(i), ActorState.STARTING,
                            proc_id=p.proc_id, host=p.host, pid=p.pid)
                for i, p in enumerate(procs)], internal=internal,
                keep=max((p.keep for p in procs), default=0.0))
            dead = []
            for i, p in enumerate(procs):
                if p.proc_id in rt.state.dead_procs or p.state in ("failed", "stopped"):
                    rec.ready[i] = f"proc {p.proc_id} is dead"
                    rec.failed.setdefault(i, p.failure)
                    dead.append(i)
            rt.failures.check_initialized(rec)
            return dead

        dead = set(rt.state.change(add))
        injection = None if internal else _injection.rules_here()  # inject_actor_failures
        base = {"name": name, "labels": list(labels), "sizes": list(sizes),
                "cls": actor_class.__name__, "qcls": qualified_class(actor_class),
                "creator": creator}
        if injection is not None:
            base["inject"] = injection
        routed: dict[str, int] = {}  # proc id -> rank, for the procs only an agent reaches
        targets = []
        for i, p in enumerate(procs):
            if i in dead:
                continue
            if not p.address and p.route:
                routed[p.proc_id] = i
                targets.append((p.address, p.route))
                continue
            h = Header(Kind.SPAWN_ACTOR, actor=rec.actor_id, reply=reply, rank=i,
                       extra={**base, "rank": i})
            rt.send_to_proc(p.address, p.route, h, body, tuple(bufs))
        if routed:  # one cast: one message per agent, or down the mesh's cast tree, so the
            # spawn goes the way the mesh's calls will (docs/transport.md, "The cast tree")
            h = Header(Kind.SPAWN_ACTOR, actor=rec.actor_id, reply=reply,
                       extra={**base, "rank": -1, "ranks": routed})
            rt.messenger.cast(targets, h, body, tuple(bufs),
                              base=rec.agents() if rec.routes else None)
        am = ActorMesh(rt, rec, shape, self, actor_class)
        rt.register_mesh(am)
        return am

    def actor_mesh(self, name: str) -> "ActorMesh":
        """The live actor mesh `name` on these procs: spawned here, or kept with them for a
        reattaching controller (its actors' state intact). KeyError naming the ones there are."""
        live = self._live_actor_meshes()
        if name not in live:
            raise KeyError(f"no live actor mesh {name!r} on proc mesh {self.name!r}; there "
                           f"are: {sorted(live) or 'none'}")
        return live[name]

    def _live_actor_meshes(self) -> dict:
        root = self._root
        found = dict(root.kept_actor_meshes)
        for m in self._rt.meshes():
            pm = getattr(m, "proc_mesh", None) if not isinstance(m, ProcMesh) else None
            if pm is not None and pm._root is root:
                found.setdefault(m.name, m)
        return {n: m for n, m in found.items() if not m.stopped}

    def actor_mesh_names(self) -> list[str]:
        """The names of the live actor meshes on these procs (see `actor_mesh`)."""
        return sorted(self._live_actor_meshes())

    @property
    def keep(self) -> float:
        """Seconds the agents keep these procs after their controller goes away (0: none)."""
        return max((p.keep for p in self._procs), default=0.0)

    def cancel_calls(self) -> int:
        """Cancel every call this process has in flight to actors on these procs, as
        `Future.cancel()` does (`%mesh cancel`); returns how many."""
        return cancel_calls(self._rt, {p.proc_id for p in self._view_procs()})

    def kill(self) -> Future:
        """SIGKILL the procs of this view, for work that cancel cannot stop (a handler
        blocked in a C call): their actors fail, and the failure says the user killed them
        (`stop()` ends procs cleanly instead). Returns a Future resolved once each death is
        known."""
        if self._root._borrowed:
            raise RuntimeError(f"proc mesh {self.name!r} was received from another process; "
                               "only its owner can kill it")
        return self._rt.kill_procs([p.proc_id for p in self._view_procs()],
                                   f"killed by the user (kill() of proc mesh {self.name!r})")

    def stop(self, reason: str = "stopped by client") -> Future:
        """Stop every proc of this mesh (actors run `__cleanup__` first). Returns a Future.
        `reason` (as in Monarch) is accepted for the record only."""
        rt = self._rt
        procs = self._procs
        if self._root._borrowed:
            raise RuntimeError(f"proc mesh {self.name!r} was received from another process; "
                               "only its owner can stop it (stop the actors you spawned on it)")
        fut: Future = Future(f"{self.name}.stop")
        self._stopped_flag = True
        self._root._stopped_flag = True
        ids = {p.proc_id for p in procs}

        def mark() -> list:
            """On the I/O thread: mark the meshes stopped; the procs still to stop."""
            for m in rt.state.actor_meshes.values():
                if ids.intersection(m.proc_ids):
                    m.stopped_with_procs = not m.stopped
                    m.stopped = True
                    for r in range(len(m.proc_ids)):
                        rt.health.update(m.health_name, r, ActorState.STOPPED)
            pending = [p for p in procs if p.state in ("starting", "running")]
            for p in pending:
                p.stopping = True
                p.exited = Future()
            return pending

        pending = rt.state.change(mark)
        if not pending:
            fut.set_result(None)
            return fut
        # one cast: one message per agent, or down the cast tree of the mesh's agents (the
        # way casts to its actors go when they span it), not one message per proc
        base = tuple(dict.fromkeys(p.route[0] for p in self._procs if p.route))
        rt.messenger.cast([(p.address, p.route) for p in pending], Header(Kind.STOP_PROC),
                          base=base or None)
        deadline = time.monotonic() + config.stop_timeout + 1.0

        def check() -> None:
            if all(p.exited.done() for p in pending):
                rt.output.flush()  # their aggregated output, before stop() returns
                for m in [m for m in rt.state.actor_meshes.all_values()
                          if set(m.proc_ids) <= ids]:
                    rt.health.remove_mesh(m.health_name)
                rt.output.writer.when_drained(partial(_set_none, fut))  # printed, too
                return
            if time.monotonic() > deadline:
                for p in pending:
                    if not p.exited.done() and p.agent is not None:
                        rt.kill_proc(p.proc_id)
                if time.monotonic() > deadline + 2.0:
                    for p in pending:
                        rt.failures.stopped_unreported(p.proc_id)
                    fut.set_result(None)
                    return
            rt.loop.call_later(0.02, check)

        rt.loop.call_soon(check)
        return fut

    def logging_option(self, stream_to_client: bool = True,
                       aggregate_window_sec: Optional[float] = 3,
                       level: int = logging.INFO) -> Future:
        """Monarch's `logging_option`: stream these procs' output to this controller or not
        (it is kept in each proc's log either way), aggregate similar lines from many ranks
        over `aggregate_window_sec` seconds (None: line by line), and the level their
        `Actor.logger` records print at. Applied when it returns; the Future[None] it returns
        may be awaited, passed to `asyncio.run` (Monarch's is `async def`) or ignored."""
        if not isinstance(level, int) or isinstance(level, bool) or not 0 <= level <= 255:
            raise ValueError(f"invalid logging level: {level!r}")
        window = 0.0
        if aggregate_window_sec is not None:
            if isinstance(aggregate_window_sec, bool) or not isinstance(
                    aggregate_window_sec, (int, float)) or aggregate_window_sec <= 0:
                raise ValueError(f"aggregate_window_sec must be positive seconds or None, "
                                 f"got {aggregate_window_sec!r}")
            window = float(aggregate_window_sec)
        rt = self._rt
        procs = self._view_procs()

        def apply() -> None:
            rt.output.flush()  # what was held under the old setting goes out first
            for p in procs:
                p.log_stream = bool(stream_to_client)
                p.log_window = window

        rt.state.change(apply)
        for p in procs:
            if p.state in ("starting", "running"):
                rt.send_to_proc(p.address, p.route, Header(Kind.LOG_LEVEL, extra={"level": level}))
        return completed(None)

    def _stop_now(self, timeout: float = 5.0) -> None:
        self.stop().get(timeout + 3.0)

    def __reduce__(self) -> Any:
        """A reference another actor can spawn on, slice or stop (the procs stay owned by
        their creator, who alone sees their exits)."""
        procs = [(p.proc_id, p.rank, p.mesh, p.address, p.host, p.pid,
                  (p.agent.agent_id, p.agent.address, p.agent.host, p.agent.remote)
                  if p.agent is not None else None) for p in self._procs]
        return (_rebuild_proc_mesh, (self.name, procs, self._shape, self._host_mesh,
                                     _session_tag(self._rt)))

    def activate(self) -> Any:
        """A context manager making this mesh the calling thread's active mesh: torch
        factories and ops then run on its procs (the tensor engine, docs/tensors.md)."""
        # the tensor engine is a feature above the meshes: reached through _features
        return _counted(self.name, _features.call("tensor.activate", self))

    def __enter__(self) -> "ProcMesh":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop().get(config.stop_timeout + 5.0)

    def to_table(self) -> str:
        """A text table of the procs: rank, coordinates, host and pid (Monarch's
        `to_table()`, printed by its examples)."""
        dims = list(self.sizes)
        rows = [["rank", *dims, "host", "pid"]]
        for r, p in enumerate(self.procs):
            c = self.shape.coords_of(r)
            rows.append([str(r), *(str(c[d]) for d in dims), p.host, str(p.pid)])
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in rows]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<ProcMesh {self.name!r} {self.sizes}>"

    def _repr_html_(self) -> str:
        from ..hooks import mesh_html  # the views' display hook, else <pre>repr</pre>

        return mesh_html(self, "proc_mesh")


def _set_none(fut: Future) -> None:
    """Resolve `fut` with None (a callback that returns nothing)."""
    fut.set_result(None)


def _check_init_args(actor_class: type, args: tuple, kwargs: dict) -> None:
    """A TypeError at the call site when the arguments do not fit the actor's __init__."""
    init = getattr(actor_class, "__init__")
    if init is object.__init__:
        if args or kwargs:
            raise TypeError(f"{actor_class.__name__}() takes no arguments (it defines no "
                            f"__init__), got {len(args)} positional and {len(kwargs)} keyword")
        return
    try:
        inspect.signature(init).bind(None, *args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{actor_class.__name__}.__init__: {e}") from None
    except ValueError:
        pass


def endpoint_signatures(actor_class: type) -> dict:
    """Endpoint name -> the signature a caller passes (None where it cannot be read)."""
    sigs = {}
    for ep_name, ep in endpoints_of(actor_class).items():
        sigs[ep_name] = caller_signature(ep.fn, ep.explicit_response_port)
    return sigs


# function -> {explicit_port: caller signature}: every spawn of a class shares its
# signatures (immutable), so what keys on them (adverbs' arity cache) does not grow with
# spawns; an entry goes with its function (a class redefined in a cell).
_SIGNATURES: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def caller_signature(fn: Any, explicit_port: bool) -> Optional[inspect.Signature]:
    """What a caller passes: the method's parameters without `self` (and without the
    response port of an explicit-port endpoint); None where it cannot be read."""
    try:
        known = _SIGNATURES.get(fn)
    except TypeError:  # not weakly referable
        return _readcaller_signature(fn, explicit_port)
    if known is not None and explicit_port in known:
        return known[explicit_port]
    sig = _readcaller_signature(fn, explicit_port)
    _SIGNATURES.setdefault(fn, {})[explicit_port] = sig
    return sig


def _readcaller_signature(fn: Any, explicit_port: bool) -> Optional[inspect.Signature]:
    """`caller_signature` without the cache."""
    try:
        sig = plain_signature(fn)
    except (TypeError, ValueError):
        return None
    if explicit_port:
        params = list(sig.parameters.values())
        P = inspect.Parameter
        if params and params[0].kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD):
            sig = sig.replace(parameters=params[1:])
        elif not (params and params[0].kind == P.VAR_POSITIONAL):
            raise TypeError(f"{getattr(fn, '__qualname__', fn)}: an endpoint with "
                            "explicit_response_port=True takes the port as its first argument")
    return sig


def method_signatures(actor_class: type) -> dict:
    """The non-endpoint public methods (for `as_endpoint`): name -> caller signature."""
    return {n: caller_signature(getattr(actor_class, n), False)
            for n in methods_of(actor_class)}


def _session_tag(rt: Runtime) -> str:
    """Which controller's session a runtime belongs to (a digest of its token, not the token)."""
    return hashlib.sha256(b"proc-mesh-session:" + rt.token).hexdigest()[:16]


def _rebuild_proc_mesh(name: str, procs: list, shape: Shape, host_mesh: Any,
                       session: Optional[str] = None) -> ProcMesh:
    from .._core import AgentRecord, get_runtime

    rt = get_runtime()
    recs = []
    for proc_id, rank, mesh, address, host, pid, agent in procs:
        rec = rt.state.proc(proc_id)
        if rec is None:
            a = None
            if agent is not None:
                a = rt.state.agents.get(agent[0]) or AgentRecord(agent[0], agent[1], agent[2],
                                                                 remote=agent[3])
            rec = ProcRecord(proc_id, rank, mesh, a, address, host=host, pid=pid,
                             state="running")
        recs.append(rec)
    pm = ProcMesh(rt, name, recs, shape, host_mesh)
    pm._borrowed = True
    pm._foreign = session is not None and session != _session_tag(rt)
    return pm


_active_lock = threading.Lock()
_active: dict[str, int] = {}  # proc mesh name -> activations open in any thread


@contextlib.contextmanager
def _counted(name: str, ctx: Any) -> Any:
    """`ctx` (an activation), counted in `_active` while it is open (views show it)."""
    with ctx as mesh:
        with _active_lock:
            _active[name] = _active.get(name, 0) + 1
        try:
            yield mesh
        finally:
            with _active_lock:
                n = _active.pop(name) - 1
                if n:
                    _active[name] = n


def active_mesh_names() -> list[str]:
    """The names of the proc meshes active (`ProcMesh.activate()`, `%mesh activate`) in any
    thread of this process, for views: the tensor engine runs torch on them."""
    with _active_lock:
        return sorted(_active)


def claim_health_name(rt: Any, rec: ActorMeshRecord, proc_mesh: str) -> str:
    """The health-model name of a new actor mesh (on the I/O thread). The user's names are
    unique among themselves (`name`, then `name~2`, ...) and win over internal ones: an
    internal mesh holding the name moves to the next free one. An internal mesh's name is
    `<proc mesh>.<name>`, clear of every name in use."""
    if rec.internal:
        return _unused(f"{proc_mesh}.{rec.name}", rt.state.health_names())
    name = _unused(rec.name, rt.state.health_names(internal=False))
    for m in rt.state.actor_meshes.all_values():
        if m.internal and not m.stopped and m.health_name == name:
            moved = _unused(name, rt.state.health_names() | {name})
            rt.health.rename_mesh(name, moved)
            m.health_name = moved
    return name


def _unused(name: str, taken: set) -> str:
    """`name`, or `name~2`, `name~3`, ... : the first not in `taken`."""
    out, k = name, 1
    while out in taken:
        k += 1
        out = f"{name}~{k}"
    return out


# -- what the runtime's other modules read of a proc mesh ----------------------------------

def runtime_of(pm: ProcMesh) -> Runtime:
    """The runtime `pm` belongs to."""
    return pm._rt


def view_procs(pm: ProcMesh) -> list[ProcRecord]:
    """The records of the procs of `pm`'s view, in its rank order."""
    return pm._view_procs()


def all_procs(pm: ProcMesh) -> list[ProcRecord]:
    """The records of every proc of the mesh `pm` is a view of."""
    return pm._procs


def stop_owned_meshes(rt: Runtime, actor_id: str, timeout: float) -> None:
    """Stop, and wait for, every mesh of this process that actor `actor_id` spawned (an
    actor's children stop before its `__cleanup__`: runtime.proc, through the feature
    "meshes.stop_owned"); a mesh that fails to stop is logged."""
    from .actor_mesh import ActorMesh, ref_of, stop_now

    for obj in list(rt.meshes(internal=True)):
        stop: Callable[[Any, float], None]
        if isinstance(obj, ActorMesh):
            if ref_of(obj).rec.owner_actor != actor_id:
                continue
            stop = stop_now
        elif isinstance(obj, ProcMesh):
            if obj._owner_actor != actor_id:
                continue
            stop = _stop_proc_mesh
        else:
            continue
        try:
            stop(obj, timeout)
        except Exception:
            logging.getLogger("runtime.proc").exception("stopping a child mesh failed")


def _stop_proc_mesh(pm: ProcMesh, timeout: float) -> None:
    pm._stop_now(timeout=timeout)
