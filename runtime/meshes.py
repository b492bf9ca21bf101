"""HostMesh, ProcMesh and ActorMesh: the user-facing meshes and their lifecycle."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

from .actor import Actor, _get_context, endpoints_of, plain_signature
from .config import config
from .core import ActorMeshRecord, AgentRecord, ProcRecord, Runtime, get_runtime
from .adverbs import EndpointRef
from .errors import MeshStoppedError, SerializationError
from .future import Future
from .shapes import MeshTrait, Shape
from .supervision.health import ActorHealth, ActorState
from .transport.framing import Header, Kind
from .transport.serialization import dumps


@dataclass(frozen=True)
class ProcInfo:
    """Where one proc of a mesh runs."""

    rank: int
    proc_id: str
    host: str
    pid: int
    address: str


def _child_env() -> dict:
    """Environment for agents and procs: the controller's, with its import path."""
    env = dict(os.environ)
    paths = []
    for p in sys.path:
        p = p or os.getcwd()
        if os.path.isdir(p) and p not in paths:
            paths.append(p)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("MONARCH_TOKEN", None)
    _with_huge_pages(env)
    return env


def _with_huge_pages(env: dict) -> None:
    """Let glibc's malloc ask for transparent huge pages in procs (GLIBC_TUNABLES): large
    messages land in fresh memory, and 2 MiB pages make that ~1.7x faster (measured with
    64 MiB arguments). MONARCH_HUGEPAGES=0 turns it off; an existing setting is kept."""
    if env.get("MONARCH_HUGEPAGES", "1") == "0":
        return
    tunables = env.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in tunables:
        return
    env["GLIBC_TUNABLES"] = f"{tunables}:glibc.malloc.hugetlb=1" if tunables \
        else "glibc.malloc.hugetlb=1"


def _start_local_agent(rt: Runtime) -> AgentRecord:
    agent_id = rt.new_id("agent")
    env = _child_env()
    env["MONARCH_TOKEN"] = rt.token.hex()
    cmd = [sys.executable, "-m", "runtime.host", "--owner", rt.address, "--rundir", rt.rundir,
           "--agent-id", agent_id, "--parent-pid", str(os.getpid())]
    box: dict = {}

    def start() -> None:  # on the I/O thread, which outlives user threads (PDEATHSIG)
        try:
            box["p"] = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                        close_fds=True)
        except BaseException as e:  # noqa: BLE001
            box["e"] = e
        box["done"].set()

    box["done"] = threading.Event()
    if rt.loop.in_loop():
        start()
    else:
        rt.loop.call_soon(start)
        box["done"].wait(30)
    if "e" in box:
        raise box["e"]
    rec = AgentRecord(agent_id, f"ipc://{rt.rundir}/{agent_id}", rt.host, popen=box["p"])
    rt.agents[agent_id] = rec
    return rec


class HostMesh(MeshTrait):
    """A mesh of hosts; each runs a host agent that spawns procs."""

    def __init__(self, rt: Runtime, agents: list[AgentRecord], shape: Shape) -> None:
        self._rt = rt
        self._agents = agents  # by global rank of `shape`'s base
        self._shape = shape

    def _new_with_shape(self, shape: Shape) -> "HostMesh":
        return HostMesh(self._rt, self._agents, shape)

    @property
    def hosts(self) -> list[str]:
        return [self._agents[r].host for r in self._shape.global_ranks()]

    def spawn_procs(self, per_host: Optional[dict[str, int]] = None, name: Optional[str] = None,
                    env: Optional[dict[str, str]] = None) -> "ProcMesh":
        """Start procs on every host: the mesh's dims are the host dims plus `per_host`'s."""
        per_host = dict(per_host or {})
        for k, v in per_host.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"per_host[{k!r}] = {v!r}: sizes must be positive ints")
            if k in self._shape.labels:
                raise ValueError(f"per_host dimension {k!r} clashes with a host dimension")
        if env is not None and not all(isinstance(k, str) and isinstance(v, str)
                                       for k, v in env.items()):
            raise TypeError("env must map str to str")
        rt = self._rt
        if rt._closed:
            raise MeshStoppedError("the runtime was shut down")
        name = name or rt.new_id("procs")
        inner = Shape(tuple(per_host), tuple(per_host.values()))
        full = Shape(self._shape.labels + inner.labels, self._shape.sizes_ + inner.sizes_)
        procs: list[ProcRecord] = []
        by_agent: dict[str, list] = {}
        host_ranks = self._shape.global_ranks()
        n_inner = len(inner)
        for hi, hr in enumerate(host_ranks):
            agent = self._agents[hr]
            for j in range(n_inner):
                rank = hi * n_inner + j
                proc_id = f"{name}-{rank}-{os.urandom(3).hex()}"
                addr = f"ipc://{rt.rundir}/{proc_id}" if not agent.remote else ""
                if agent.remote and not agent.alive:
                    raise MeshStoppedError(f"host {agent.host} ({agent.address}) is unreachable")
                rec = ProcRecord(proc_id, rank, name, agent, addr, host=agent.host)
                procs.append(rec)
                by_agent.setdefault(agent.agent_id, []).append(
                    {"proc_id": proc_id, "rank": rank, "mesh": name, "env": env or {}})
        for rec in procs:
            rt.procs[rec.proc_id] = rec
            rec.agent.procs.add(rec.proc_id)
        for agent_id, plist in by_agent.items():
            agent = rt.agents.get(agent_id) or next(a for a in self._agents
                                                   if a.agent_id == agent_id)
            rt.send(agent.address, Header(Kind.SPAWN_PROCS, extra={
                "procs": plist, "owner": rt.reply_address_for(agent.address),
                "cwd": os.getcwd()}))
        pm = ProcMesh(rt, name, procs, full, self)
        rt.register_mesh(pm)
        return pm

    def shutdown(self) -> None:
        """Stop the agents of this host mesh and every proc they run."""
        rt = self._rt
        for r in self._shape.global_ranks():
            a = self._agents[r]
            if a.lost:  # unreachable now: stop it if the message gets through, stop waiting
                a.lost = False
                rt.send(a.address, Header(Kind.AGENT_STOP))
            if a.alive:
                for p in list(a.procs):
                    rec = rt.procs.get(p)
                    if rec is not None:
                        rec.stopping = True
                rt.send(a.address, Header(Kind.AGENT_STOP))
                a.alive = False
                if a.popen is not None:
                    try:
                        a.popen.wait(5)
                    except subprocess.TimeoutExpired:
                        a.popen.kill()
        if getattr(rt, "_this_host", None) is self:
            rt._this_host = None

    def __repr__(self) -> str:
        return f"<HostMesh {self.sizes or ''} hosts={self.hosts}>"


def this_host() -> HostMesh:
    """The host this process runs on, as a mesh of one host."""
    rt = get_runtime()
    hm = getattr(rt, "_this_host", None)
    if hm is not None and all(a.alive for a in hm._agents):
        return hm
    if rt.is_proc and getattr(rt, "agent_address", ""):
        agent = rt.agents.get(rt.host_id)
        if agent is None:
            agent = AgentRecord(rt.host_id, rt.agent_address, rt.host)
            rt.agents[rt.host_id] = agent
    else:
        agent = _start_local_agent(rt)
    hm = HostMesh(rt, [agent], Shape((), ()))
    rt._this_host = hm
    return hm


def _local_ip_for(host: str, port: int) -> str:
    """The address of this machine on the route to `host` (what the agents can reach)."""
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((host, port or 9))
        return s.getsockname()[0]
    finally:
        s.close()


def attach_to_workers(addresses: list[str], key_file: Optional[str] = None,
                      timeout: float = 30.0, name: str = "hosts") -> HostMesh:
    """Attach to host agents started with `python -m runtime.host --listen tcp://...`;
    returns a HostMesh with dimension `hosts` (CurveZMQ-authenticated and encrypted)."""
    from urllib.parse import urlparse

    from .transport import auth

    if not addresses:
        raise ValueError("attach_to_workers needs at least one agent address")
    for a in addresses:
        u = urlparse(a)
        if u.scheme != "tcp" or not u.hostname or not u.port:
            raise ValueError(f"agent address {a!r} is not of the form tcp://HOST:PORT")
    keys = auth.read_key_file(key_file) if key_file else auth.keys_from_env()
    if keys is None:
        raise PermissionError("attach_to_workers needs the cluster's key file (key_file= or "
                              "MONARCH_KEY_FILE)")
    rt = get_runtime()
    u = urlparse(addresses[0])
    my_addr = rt.enable_tcp(_local_ip_for(u.hostname, u.port), keys)
    agents = []
    for a in addresses:
        rt.add_peer(a, keys)
        rec = AgentRecord(rt.new_id("host"), a, urlparse(a).hostname or a, remote=True)
        rt.agents[rec.agent_id] = rec
        agents.append(rec)
        rt.send(a, Header(Kind.AGENT_ATTACH, extra={"owner": my_addr,
                                                    "attach_id": rec.agent_id}))
    deadline = time.monotonic() + timeout
    while not all(a.hello for a in agents):
        if time.monotonic() > deadline:
            missing = [a.address for a in agents if not a.hello]
            for a in agents:
                a.alive = False
            raise TimeoutError(f"no answer within {timeout:g} s from host agents {missing}")
        time.sleep(0.01)
    for a in agents:
        a.last_seen = time.monotonic()
    return HostMesh(rt, agents, Shape((name,), (len(agents),)))


def this_proc() -> "ProcMesh":
    """Not supported in this runtime: actors live in procs started by a host mesh."""
    raise NotImplementedError("this_proc() is not supported; use this_host().spawn_procs()")


class ProcMesh(MeshTrait):
    """A mesh of procs; `spawn` starts one actor per proc."""

    def __init__(self, rt: Runtime, name: str, procs: list[ProcRecord], shape: Shape,
                 host_mesh: HostMesh, _root: Optional["ProcMesh"] = None) -> None:
        self._rt = rt
        self.name = name
        self._procs = procs
        self._shape = shape
        self._host_mesh = host_mesh
        self._root = _root or self
        ctx = _get_context()
        self._owner_actor = ctx.actor_id if ctx is not None else None
        self._stopped_flag = False

    def _new_with_shape(self, shape: Shape) -> "ProcMesh":
        return ProcMesh(self._rt, self.name, self._procs, shape, self._host_mesh, self._root)

    @property
    def host_mesh(self) -> HostMesh:
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
        return [ProcInfo(i, p.proc_id, p.host, p.pid, p.address)
                for i, p in enumerate(self._view_procs())]

    @property
    def initialized(self) -> Future:
        """Resolves once every proc of the view has started (or fails if one died)."""
        fut: Future = Future(f"{self.name}.initialized")
        recs = self._view_procs()

        def poll() -> None:
            if all(r.pid for r in recs):
                fut.set_result(None)
                return
            bad = [r for r in recs if r.state in ("failed", "stopped") and not r.pid]
            if bad:
                from .errors import SupervisionError

                fut.set_exception(SupervisionError(f"proc {bad[0].proc_id} failed to start: "
                                                   f"{bad[0].failure}", bad[0].failure))
                return
            self._rt.loop.call_later(0.01, poll)

        self._rt.loop.call_soon(poll)
        return fut

    def spawn(self, name: str, actor_class: type, *args: Any, **kwargs: Any) -> "ActorMesh":
        """Start one `actor_class(*args, **kwargs)` per proc (non-blocking)."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"spawn(name, ActorClass, ...): name must be a non-empty str, "
                            f"got {name!r}")
        if not (isinstance(actor_class, type) and issubclass(actor_class, Actor)):
            raise TypeError(f"spawn({name!r}, ...): {actor_class!r} is not an Actor subclass")
        if self._stopped_flag or self._root._stopped_flag:
            raise MeshStoppedError(f"proc mesh {self.name!r} was stopped")
        if actor_class.__init__ is object.__init__ and (args or kwargs):
            raise TypeError(f"{actor_class.__name__}() takes no arguments (it defines no "
                            f"__init__), got {len(args)} positional and {len(kwargs)} keyword")
        try:
            inspect.signature(actor_class.__init__).bind(None, *args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{actor_class.__name__}.__init__: {e}") from None
        except ValueError:
            pass
        try:
            body, bufs = dumps((actor_class, args, kwargs), "actor class and arguments")
        except SerializationError as e:
            raise SerializationError(f"spawn({name!r}, {actor_class.__name__}): {e}") from None
        rt = self._rt
        procs = self._view_procs()
        actor_id = rt.new_id(name)
        eps = endpoints_of(actor_class)
        sigs = {}
        for ep_name, ep in eps.items():
            try:
                sigs[ep_name] = plain_signature(ep.fn)
            except (TypeError, ValueError):
                sigs[ep_name] = None
        labels, sizes = self._shape.labels, self._shape.sizes_
        health_name = name
        taken = {m.health_name for m in rt.actor_meshes.values() if not m.stopped}
        k = 1
        while health_name in taken:
            k += 1
            health_name = f"{name}~{k}"
        ctx = _get_context()
        rec = ActorMeshRecord(
            actor_id=actor_id, name=name, cls_name=actor_class.__name__,
            proc_ids=[p.proc_id for p in procs], addresses=[p.address for p in procs],
            routes=[p.route for p in procs],
            hosts=[p.host for p in procs], sizes=dict(zip(labels, sizes)), owned=True,
            owner_actor=ctx.actor_id if ctx is not None else None,
            ready=[None] * len(procs), inflight=[0] * len(procs), health_name=health_name,
            sigs=sigs, initialized=Future(f"{name}.initialized"),
        )
        rt.actor_meshes[actor_id] = rec
        shape = Shape(labels, sizes)
        rt.health.add_mesh(health_name, self.name, rec.sizes, [
            ActorHealth(health_name, i, shape.coords_of(i), ActorState.STARTING,
                        proc_id=p.proc_id, host=p.host, pid=p.pid)
            for i, p in enumerate(procs)])
        for i, p in enumerate(procs):
            if p.state in ("failed", "stopped"):
                rt.loop.call_soon(rt._proc_failed, p.proc_id, "proc already dead")
        reply = rt.reply_address_for(
            (procs[0].address or procs[0].agent.address) if procs else "")

        def send_all() -> None:
            for i, p in enumerate(procs):
                if p.proc_id in rt.dead_procs:
                    rec.ready[i] = f"proc {p.proc_id} is dead"
                    rec.failed.setdefault(i, p.failure)
                    continue
                h = Header(Kind.SPAWN_ACTOR, actor=actor_id, reply=reply, rank=i,
                           extra={"name": name, "rank": i, "labels": list(labels),
                                  "sizes": list(sizes)})
                rt.send_to_proc(p.address, p.route, h, body, tuple(bufs))
            rt._check_initialized(rec)

        rt.loop.call_soon(send_all)
        am = ActorMesh(rt, rec, shape, self, actor_class)
        rt.register_mesh(am)
        return am

    def stop(self) -> Future:
        """Stop every proc of this mesh (actors run `__cleanup__` first). Returns a Future."""
        rt = self._rt
        fut: Future = Future(f"{self.name}.stop")
        procs = self._procs
        self._stopped_flag = True
        self._root._stopped_flag = True
        pending = [p for p in procs if p.state in ("starting", "running")]
        for m in rt.actor_meshes.values():
            if any(pid in m.proc_ids for pid in (p.proc_id for p in procs)):
                m.stopped = True
                for r in range(len(m.proc_ids)):
                    rt.health.update(m.health_name, r, ActorState.STOPPED)
        if not pending:
            fut.set_result(None)
            return fut
        waits = []
        for p in pending:
            p.stopping = True
            p.exited = Future()
            waits.append(p.exited)

        def go() -> None:
            for p in pending:
                rt.send_to_proc(p.address, p.route, Header(Kind.STOP_PROC))

            deadline = time.monotonic() + config.stop_timeout + 1.0

            def check() -> None:
                if all(w.done() for w in waits):
                    for m in [m for m in rt.actor_meshes.values()
                              if set(m.proc_ids) <= {p.proc_id for p in procs}]:
                        rt.health.remove_mesh(m.health_name)
                    fut.set_result(None)
                    return
                if time.monotonic() > deadline:
                    for p in pending:
                        if not (p.exited and p.exited.done()) and p.agent is not None:
                            rt.kill_proc(p.proc_id)
                    if time.monotonic() > deadline + 2.0:
                        fut.set_result(None)
                        return
                rt.loop.call_later(0.02, check)

            check()

        rt.loop.call_soon(go)
        return fut

    def _stop_now(self, timeout: float = 5.0) -> None:
        self.stop().get(timeout + 3.0)

    def __enter__(self) -> "ProcMesh":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop().get(config.stop_timeout + 5.0)

    def __repr__(self) -> str:
        return f"<ProcMesh {self.name!r} {self.sizes}>"

    def _repr_html_(self) -> str:
        from .hooks import mesh_html  # the views' display hook, else <pre>repr</pre>

        return mesh_html(self, "proc_mesh")


class ActorMesh(MeshTrait):
    """A mesh of actors, one per proc; endpoints are attributes with call/choose/... adverbs."""

    def __init__(self, rt: Runtime, rec: ActorMeshRecord, shape: Shape,
                 proc_mesh: Optional[ProcMesh], actor_class: Optional[type] = None) -> None:
        self._rt = rt
        self._rec = rec
        self._shape = shape
        self._proc_mesh = proc_mesh
        self._class = actor_class

    @property
    def name(self) -> str:
        return self._rec.name

    @property
    def proc_mesh(self) -> Optional[ProcMesh]:
        return self._proc_mesh

    @property
    def stopped(self) -> bool:
        """True once this actor mesh was stopped (its own `stop()`, or its proc mesh's)."""
        return self._rec.stopped

    @property
    def health_name(self) -> str:
        """This mesh's key in the runtime's health model (`rt.health`): its name, or e.g.
        "name~2" while another live mesh has the name; "" where this process does not own it."""
        return self._rec.health_name

    @property
    def class_name(self) -> str:
        """The name of the actor class."""
        return self._rec.cls_name

    def restricted_to(self, procs: ProcMesh) -> "ActorMesh":
        """The actors of this mesh that live on `procs`, a view (slice) of the unsliced proc
        mesh this actor mesh was spawned on, with the dimensions of that view."""
        pm = self._proc_mesh
        if pm is None or pm._root is not pm or procs._root is not pm:
            raise ValueError(f"{procs!r} is not a view of the proc mesh actor mesh "
                             f"{self.name!r} was spawned on")
        return self._new_with_shape(procs._shape)

    @property
    def _owner_actor(self) -> Optional[str]:
        return self._rec.owner_actor

    @property
    def _stopped_flag(self) -> bool:
        return self._rec.stopped

    def _new_with_shape(self, shape: Shape) -> "ActorMesh":
        return ActorMesh(self._rt, self._rec, shape, self._proc_mesh, self._class)

    def _ranks(self) -> list[int]:
        r = self.__dict__.get("_ranks_cache")
        if r is None:
            r = self.__dict__["_ranks_cache"] = self._shape.global_ranks()
        return r

    def __getattr__(self, name: str) -> EndpointRef:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        rec = self.__dict__.get("_rec")
        if rec is None:
            raise AttributeError(name)
        if name not in rec.sigs:
            have = ", ".join(sorted(rec.sigs)) or "none"
            raise AttributeError(
                f"{rec.cls_name} has no endpoint {name!r} (its endpoints: {have})")
        return EndpointRef(self, name, rec.sigs[name])

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._rec.sigs))

    @property
    def initialized(self) -> Future:
        """Resolves when every actor ran `__init__`; raises if one failed there."""
        rec = self._rec
        if rec.initialized is None:
            from .future import resolved

            return resolved(None)
        return rec.initialized

    def stop(self) -> Future:
        """Stop these actors (running `__cleanup__`); their procs keep running."""
        rt = self._rt
        rec = self._rec
        fut: Future = Future(f"{rec.name}.stop")
        ranks = list(range(len(rec.proc_ids)))
        rec.stopped = True
        remaining = {r for r in ranks if rec.proc_ids[r] not in rt.dead_procs}
        if not remaining:
            fut.set_result(None)
            return fut

        def on_stopped(h: Header, body: Any, buffers: list) -> None:
            remaining.discard(h.rank)
            if not remaining:
                rt.close_port(port)
                fut.set_result(None)

        def on_fail(exc: BaseException, actor: Any = None) -> None:
            rt.close_port(port)
            fut.set_result(None)

        port = rt.open_port(on_stopped, on_fail)

        def go() -> None:
            rt.watch(port, {rec.proc_ids[r] for r in remaining})
            for r in list(remaining):
                addr, route = rec.target(r)
                reply = rt.reply_address_for(addr or (route or ("",))[0])
                rt.send_to_proc(addr, route, Header(Kind.STOP_ACTOR, actor=rec.actor_id, rank=r,
                                                    reply=reply, port=port))
        rt.loop.call_soon(go)
        return fut

    def _stop_now(self, timeout: float = 5.0) -> None:
        self.stop().get(timeout)

    def __reduce__(self) -> Any:
        r = self._rec
        state = {
            "actor_id": r.actor_id, "name": r.name, "cls_name": r.cls_name,
            "proc_ids": r.proc_ids, "addresses": r.addresses, "hosts": r.hosts,
            "routes": r.routes,
            "sizes": r.sizes, "sigs": r.sigs, "shape": self._shape,
        }
        return (_rebuild_actor_mesh, (state,))

    def __repr__(self) -> str:
        return f"<ActorMesh {self._rec.name!r} {self._rec.cls_name} {self.sizes}>"

    def _repr_html_(self) -> str:
        from .hooks import mesh_html  # the views' display hook, else <pre>repr</pre>

        return mesh_html(self, "actor_mesh")


def _rebuild_actor_mesh(state: dict) -> ActorMesh:
    rt = get_runtime()
    rec = rt.actor_meshes.get(state["actor_id"])
    if rec is None:
        n = len(state["proc_ids"])
        rec = ActorMeshRecord(
            actor_id=state["actor_id"], name=state["name"], cls_name=state["cls_name"],
            proc_ids=state["proc_ids"], addresses=state["addresses"], hosts=state["hosts"],
            sizes=state["sizes"], owned=False, ready=[True] * n, inflight=[0] * n,
            health_name="", sigs=state["sigs"], routes=state.get("routes") or [],
        )
        rt.actor_meshes[rec.actor_id] = rec
    return ActorMesh(rt, rec, state["shape"], None)
