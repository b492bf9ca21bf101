"""HostMesh: a mesh of hosts, each served by a host agent; `this_host()` and
`attach_to_workers()` make one."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Optional

from .._base import features as _features
from .._base.process import hostname, start_time
from .._core import AgentRecord, ProcRecord, Runtime, get_runtime
from .._core.liveness import gateway_lost
from ..config import TOKEN_ENV, config
from ..errors import MeshStoppedError
from ..future import Future, resolved
from ..shapes import MeshTrait, Shape
from ..transport.framing import Header, Kind
from ..transport.payloads import SpawnExtra, SpawnSpec

if TYPE_CHECKING:
    from .proc_mesh import ProcMesh

__all__ = [
    "BOOTSTRAP_ENV", "bootstrap_env", "child_env", "HostMesh", "host_runtime", "view_agents",
    "this_host", "local_ip_for", "attach_to_workers",
]


#: the environment variable that carries a proc's bootstrap callable (read by runtime.proc)
BOOTSTRAP_ENV = "MONARCH_PROC_BOOTSTRAP"


def bootstrap_env(bootstrap: Optional[Callable[[], Any]]) -> dict[str, str]:
    """The proc environment that makes each proc run `bootstrap()` before its first actor."""
    if bootstrap is None:
        return {}
    if not callable(bootstrap):
        raise TypeError(f"bootstrap must be a callable taking no arguments, got {bootstrap!r}")
    import base64

    import cloudpickle

    try:
        data = cloudpickle.dumps(bootstrap)
    except Exception as e:
        raise TypeError(f"bootstrap {bootstrap!r} cannot be pickled: {e}") from None
    return {BOOTSTRAP_ENV: base64.b64encode(data).decode()}


def child_env() -> dict:
    """Environment for agents and procs: the controller's, with its import path."""
    env = dict(os.environ)
    paths = []
    for p in sys.path:
        p = p or os.getcwd()
        if os.path.isdir(p) and p not in paths:
            paths.append(p)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop(TOKEN_ENV, None)
    env.update(config.to_env())  # settings made with configure() reach the children
    _with_malloc_tunables(env)
    return env


# glibc malloc settings for agents and procs, through GLIBC_TUNABLES (a tunable already set
# there is kept), each group with its own setting to turn it off:
# - hugepages: transparent huge pages for malloc (MONARCH_HUGEPAGES=0 turns it off).
# - keep_message_memory: arena_max=1, mmap_max=0, trim_threshold=256 MiB. The memory of a
#   large message stays in the process after the message is freed, and the next large
#   message reuses those mapped pages. zmq allocates each incoming message on its I/O
#   thread, and glibc serves any allocation over 32 MiB (always, from a thread's arena)
#   with a new mmap that it unmaps on free: each 64 MiB argument faulted in 64 MiB of fresh
#   pages, and on a VM that hands free memory back to the host, fresh pages cost 4-25x more
#   (64 MiB arguments: 0.44-3.4 GB/s depending on what ran before; 2.6-5.7 GB/s kept). The
#   price: a proc keeps the memory of its largest recent message (up to 256 MiB) as RSS.
_MALLOC_TUNABLES = (
    ("hugepages", ("glibc.malloc.hugetlb=1",)),
    ("keep_message_memory", ("glibc.malloc.arena_max=1", "glibc.malloc.mmap_max=0",
                             f"glibc.malloc.trim_threshold={256 << 20}")),
)


def _with_malloc_tunables(env: dict) -> None:
    """Add the malloc tunables whose setting is on to env's GLIBC_TUNABLES."""
    tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t]
    names = {t.split("=", 1)[0] for t in tunables}
    for setting, group in _MALLOC_TUNABLES:
        if getattr(config, setting):
            tunables += [t for t in group if t.split("=", 1)[0] not in names]
    if tunables:
        env["GLIBC_TUNABLES"] = ":".join(tunables)


def _start_local_agent(rt: Runtime) -> AgentRecord:
    agent_id = rt.new_id("agent")
    env = child_env()
    env[TOKEN_ENV] = rt.token.hex()
    cmd = [sys.executable, "-m", "runtime.host", "--owner", rt.address, "--rundir", rt.rundir,
           "--agent-id", agent_id, "--parent-pid", str(os.getpid())]

    def start() -> AgentRecord:  # on the I/O thread, which outlives user threads (PDEATHSIG)
        p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, close_fds=True)
        rec = AgentRecord(agent_id, f"ipc://{rt.rundir}/{agent_id}", rt.host, popen=p)
        rt.state.add_agent(rec)
        rt.liveness.watch_exit(p.pid)
        return rec

    return rt.state.change(start)



def _send_spawns(rt: Any, base: list[str], common: SpawnExtra, specs: dict[str, SpawnSpec],
                 procs: list[ProcRecord]) -> None:
    """One SPAWN_PROCS per agent of `base` (`common` and its own `specs` entry), down the
    cast tree of the hosts when there are more than `cast_fanout`: each relay passes on its
    subtree's specs. A relay that dies before its subtree's procs have started is gone
    around: the agents below it are sent their specs directly (an agent spawns a proc id
    once, so one that got it both ways starts it once)."""
    tree = rt.messenger.agent_tree(base, {a: [p["proc_id"] for p in s["procs"]]
                                          for a, s in specs.items()})
    if tree is None:
        for address, spec in specs.items():
            rt.send(address, Header(Kind.SPAWN_PROCS, extra={**common, **spec}))
        rt.messenger.cast_messages += len(specs)
        return

    def relay_died(dead: str) -> bool:
        starting = {p.proc_id for p in procs if p.state == "starting"}
        if not starting:
            return True
        for address in tree.agents_below(dead):
            spec = specs.get(address)
            if spec and address not in rt.messenger.dead_agents and \
                    any(p["proc_id"] in starting for p in spec["procs"]):
                rt.send(address, Header(Kind.SPAWN_PROCS, extra={**common, **spec}))
        return False

    rt.messenger.cast_to_agents(tree, Kind.SPAWN_PROCS, common, specs, relay_died)

class HostMesh(MeshTrait):
    """A mesh of hosts; each runs a host agent that spawns procs."""

    def __init__(self, rt: Runtime, agents: list[AgentRecord], shape: Shape) -> None:
        self._rt = rt
        self._agents = agents  # by global rank of `shape`'s base
        self._shape = shape
        self._shut_down_flag = False
        self._reference = False  # received in a message: only its owner shuts it down
        self._spawned: weakref.WeakSet = weakref.WeakSet()  # proc meshes spawned through it
        self._keep: Optional[float] = None  # a kept job's lease: its procs' default keep

    def _new_with_shape(self, shape: Shape) -> "HostMesh":
        hm = HostMesh(self._rt, self._agents, shape)
        hm._keep = self._keep
        return hm

    @property
    def is_fake_in_process(self) -> bool:
        """Monarch's flag for its in-process fake host; hosts here are always real."""
        return False

    def _check_not_shut_down(self) -> None:
        if self._shut_down_flag:
            raise RuntimeError("HostMesh has already been shut down")

    def __enter__(self) -> "HostMesh":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._shut_down_flag:
            self.shutdown()

    async def __aenter__(self) -> "HostMesh":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.__exit__(*exc)

    @property
    def hosts(self) -> list[str]:
        return [self._agents[r].host for r in self._shape.global_ranks()]

    @property
    def initialized(self) -> Future:
        """Monarch's `HostMesh.initialized`: resolved to True once the hosts answer (they have
        by the time a HostMesh is returned here)."""
        return resolved(True)

    def stop(self) -> Future:
        """Stop the procs spawned through this HostMesh object; its hosts (agents) keep
        running, so procs can be spawned again (Monarch's `HostMesh.stop()`)."""
        self._check_not_shut_down()
        for pm in list(self._spawned):
            if not pm.stopped:
                pm.stop().get(timeout=config.stop_timeout * 2 + 5)
        self._spawned.clear()
        return resolved(None)

    def spawn_procs(self, per_host: Optional[dict[str, int]] = None, name: Optional[str] = None,
                    env: Optional[dict[str, str]] = None,
                    proc_bind: Optional[list[dict[str, str]]] = None,
                    bootstrap: Optional[Callable[[], Any]] = None,
                    keep: Optional[float] = None) -> "ProcMesh":
        """Start procs on every host: the mesh's dims are the host dims plus `per_host`'s.
        `keep` (seconds; default the `keep` setting, else the job's): on a job's hosts,
        their agents keep these procs and their actors that long after this controller
        goes away, for another controller to reattach (`Job.proc_mesh(name)`); 0 ends them
        with it. this_host() procs always end with their controller.
        `proc_bind` (one dict per proc of a host) pins procs to CPUs: `{"cpus": "0-3"}` or
        `{"cpunodebind": "0"}` (the CPUs of a NUMA node). `bootstrap` (Monarch's keyword)
        runs in each proc before any actor is spawned there (awaited if it returns a
        coroutine); if it raises, that proc fails to start."""
        from ..host.zygote import PROCS_PER_HOST
        from .proc_mesh import ProcMesh

        per_host = dict(per_host or {})
        for k, v in per_host.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"per_host[{k!r}] = {v!r}: sizes must be positive ints")
            if k in self._shape.labels:
                raise ValueError(f"per_host dimension {k!r} clashes with a host dimension")
        if env is not None and not all(isinstance(k, str) and isinstance(v, str)
                                       for k, v in env.items()):
            raise TypeError("env must map str to str")
        env = {**(env or {}), **bootstrap_env(bootstrap)}
        rt = self._rt
        keep = _check_keep(self._keep if keep is None else keep, self._agents, self._shape)
        self._check_not_shut_down()
        binds = _check_proc_bind(proc_bind, math.prod(per_host.values()) if per_host else 1)
        if rt.closed:
            raise MeshStoppedError("the runtime was shut down")
        name = name or rt.new_id("procs")
        inner = Shape(tuple(per_host), tuple(per_host.values()))
        full = Shape(self._shape.labels + inner.labels, self._shape.sizes_ + inner.sizes_)
        procs: list[ProcRecord] = []
        by_agent: dict[str, tuple[AgentRecord, list]] = {}
        n_inner = len(inner)
        any_local = any(not self._agents[hr].remote for hr in self._shape.global_ranks())
        gpu_env = _gpu_env_for(per_host, inner, env or {}, any_local)
        debug_env = _features.call("debugging.spawn_env")  # breakpoints armed from the start
        for hi, hr in enumerate(self._shape.global_ranks()):
            agent = self._agents[hr]
            if agent.remote and not agent.alive:
                raise MeshStoppedError(f"host {agent.host} ({agent.address}) is unreachable")
            for j in range(n_inner):
                rank = hi * n_inner + j
                proc_id = f"{name}-{rank}-{os.urandom(3).hex()}"
                addr = f"ipc://{rt.rundir}/{proc_id}" if not agent.remote else ""
                procs.append(ProcRecord(proc_id, rank, name, agent, addr, host=agent.host,
                                        keep=keep or 0.0))
                proc_env = {**config.spawn_env(), **debug_env, **(env or {}), **binds[j]}
                spec: dict[str, Any] = {"proc_id": proc_id, "rank": rank, "mesh": name,
                                        "env": proc_env}
                if n_inner > 1:  # the proc's host picks its intra-op threads from this
                    proc_env[PROCS_PER_HOST] = str(n_inner)
                if gpu_env is not None:  # one GPU per proc: decided here for this host
                    proc_env.update(gpu_env(j) if not agent.remote else {})
                    if agent.remote:  # ... and by the remote host's agent for its GPUs
                        spec["gpu"] = {"per_host": per_host, "coords": inner.coords_of(j)}
                by_agent.setdefault(agent.agent_id, (agent, []))[1].append(spec)
        rt.state.change(rt.state.add_procs, procs)
        from .local import root_controller_env

        common: SpawnExtra = {"cwd": os.getcwd(), "labels": list(full.labels),
                              "sizes": list(full.sizes_)}
        if keep is not None:  # else the agent's own (a kept job's --keep)
            common["keep"] = keep
        specs: dict[str, SpawnSpec] = {}
        for agent, plist in by_agent.values():
            root = root_controller_env(rt, agent.address)
            for p in plist:
                p["env"].update(root)
            specs[agent.address] = {"procs": plist,
                                    "owner": rt.reply_address_for(agent.address)}
        _send_spawns(rt, [self._agents[hr].address for hr in self._shape.global_ranks()],
                     common, specs, procs)
        pm = ProcMesh(rt, name, procs, full, self)
        rt.register_mesh(pm)
        self._spawned.add(pm)
        return pm

    def kept_meshes(self, timeout: float = 30.0) -> dict[str, "ProcMesh"]:
        """The proc meshes that these hosts' agents kept for this controller after the one
        before it went away (`spawn_procs(keep=...)`), rebuilt here with their actors
        (`ProcMesh.actor_mesh(name)`): name -> ProcMesh. Empty when nothing was kept."""
        from .reattach import adopt_kept

        self._check_not_shut_down()
        agents = [self._agents[r] for r in self._shape.global_ranks()]
        return adopt_kept(self._rt, self, agents, self._spawned.add, timeout)

    @property
    def keep(self) -> Optional[float]:
        """The default `keep` of procs spawned on these hosts (a kept job's lease; None:
        the `keep` setting)."""
        return self._keep

    @keep.setter
    def keep(self, seconds: Optional[float]) -> None:
        self._keep = seconds

    def proc_mesh_names(self) -> list[str]:
        """The names of the live proc meshes on these hosts: spawned by this controller
        through this HostMesh, or kept for it (`kept_meshes`)."""
        names = {pm.name for pm in list(self._spawned) if not pm.stopped}
        agents = [self._agents[r] for r in self._shape.global_ranks()]
        names |= {n for a in agents for n, pm in a.adopted.items() if not pm.stopped}
        return sorted(names)

    def proc_mesh(self, name: str, timeout: float = 30.0) -> "ProcMesh":
        """The live proc mesh `name` on these hosts: one spawned by this controller, or one
        kept for it by the agents (see `kept_meshes`). KeyError naming the ones there are."""
        kept = self.kept_meshes(timeout)
        if name in kept and not kept[name].stopped:
            return kept[name]
        for pm in list(self._spawned):
            if pm.name == name and not pm.stopped:
                return pm
        raise KeyError(f"no live proc mesh {name!r} on hosts {self.hosts}; there are: "
                       f"{self.proc_mesh_names() or 'none'}")

    def sync_workspace(self, workspace: Any, conda: bool = False, auto_reload: bool = False,
                       *, progress: Optional[Callable[[str, int, int, int, int], None]] = None,
                       timeout: Optional[float] = None) -> Any:
        """Monarch's `HostMesh.sync_workspace`: copy the directories of `workspace` (a
        `Workspace(dirs=[...])`) to every host of this mesh, into the host's private
        workspace directory that procs import from (new ones, and live ones after a
        reload); only contents the host lacks travel. With `auto_reload`, live procs on
        these hosts reload the changed modules between messages (docs/runtime.md).
        `progress(host, files, of_files, bytes, of_bytes)` is called as contents arrive.
        Returns a SyncResult; raises WorkspaceSyncError naming each host, proc and module
        that failed (the rest is done), WorkspaceTooLarge over `workspace_max_bytes`."""
        from .workspace_sync import sync_workspace

        self._check_not_shut_down()
        if conda:
            raise NotImplementedError("sync_workspace(conda=True): syncing a conda "
                                      "environment is not supported; only code directories")
        if self._reference:
            raise RuntimeError("sync_workspace on a HostMesh received by reference: only "
                               "its owner syncs")
        agents = [self._agents[r] for r in self._shape.global_ranks()]
        return sync_workspace(self._rt, agents, workspace, auto_reload, progress, timeout)

    def with_python_executable(self, python_executable: str) -> "HostMesh":
        """Monarch's per-mesh interpreter: not supported here (deliberately), says why."""
        raise NotImplementedError(
            f"HostMesh.with_python_executable({python_executable!r}) is not supported: procs "
            "are forked from a zygote that the host agent has pre-imported, not exec'd, so "
            "they run the agent's interpreter. Start the agents under the interpreter you "
            "want instead: LocalJob(hosts=N, python=PATH) (SlurmJob and KubernetesJob take "
            "python= too), or `PATH -m runtime.host --listen tcp://HOST:PORT --key-file KEY` "
            "and attach_to_workers(); this_host() runs the controller's own interpreter")

    def _spawn_admin(self, query_engine: Any = None) -> Future:
        """Monarch's (private) `HostMesh._spawn_admin()`, called by its examples: a Future of
        this controller's admin endpoint address (`monarch-admin` attaches there), started
        if it is not running."""
        from ..admin import serve

        if query_engine is not None:
            raise ValueError("_spawn_admin(query_engine=...): there is no telemetry query "
                             "engine here; the admin endpoint serves runtime.admin requests")
        address = serve(self._rt).address
        return resolved(address.split("://", 1)[-1])

    def shutdown(self) -> Future:
        """Stop the agents of this host mesh and every proc they run. Done when it returns;
        the Future[None] it returns (as Monarch's) is resolved, for `.get()` or `await`.
        RuntimeError (Monarch's words) for a mesh already shut down or received by reference."""
        self._check_not_shut_down()
        if self._reference:
            raise RuntimeError("cannot shut down `HostMesh` that is a reference instead of "
                               "owned")
        self._shut_down_flag = True
        rt = self._rt
        agents = [self._agents[r] for r in self._shape.global_ranks()]

        def stop() -> list[ProcRecord]:
            """The procs to end."""
            ending: list[ProcRecord] = []
            for a in agents:
                if a.lost:  # unreachable now: stop it if the message gets through
                    a.lost = False
                    rt.send(a.address, Header(Kind.AGENT_STOP))
                if a.alive:
                    for p in list(a.procs):
                        rec = rt.state.proc(p)
                        if rec is not None and rec.state in ("starting", "running"):
                            rec.stopping = True
                            ending.append(rec)
                    rt.send(a.address, Header(Kind.AGENT_STOP))
                    a.alive = False
            return ending

        ending = rt.state.change(stop)
        for a in agents:
            if a.popen is not None:
                try:
                    a.popen.wait(5)
                except subprocess.TimeoutExpired:
                    a.popen.kill()
                rt.state.change(rt.state.drop_agent, a)  # stopped means gone
        # done when it returns: the procs count as stopped now (an agent that exits reports
        # none of them; a report that still comes changes nothing)
        if ending:
            def report() -> None:
                for rec in ending:
                    rt.failures.stopped_unreported(rec.proc_id)

            rt.state.change(report)
        if rt.this_host_mesh is self:
            rt.this_host_mesh = None
        return resolved(None)

    def __reduce__(self) -> Any:
        """A reference another actor can spawn procs on (its own procs, owned by it)."""
        agents = [(a.agent_id, a.address, a.host, a.remote) for a in self._agents]
        return (_rebuild_host_mesh, (agents, self._shape))

    def __repr__(self) -> str:
        return f"<HostMesh {self.sizes or ''} hosts={self.hosts}>"


def _gpu_env_for(per_host: dict[str, int], inner: Shape, env: dict[str, str],
                 local: bool):
    """None without a GPU dimension; else j -> the env giving inner proc j its own GPU on
    this host (checked now, so too many GPU procs fail at the spawn call)."""
    from .. import gpus

    if gpus.gpu_dim(per_host) is None:
        return None
    count, visible = gpus.device_count(), gpus.parent_visible()
    table = [gpus.proc_gpu_env(per_host, inner.coords_of(j), user_env=env,
                               parent_visible=visible, device_count=count)
             for j in range(len(inner))] if count > 0 and local else None
    return lambda j: table[j] if table is not None else {}


def _check_keep(keep: Optional[float], agents: list, shape: Shape) -> Optional[float]:
    """The lease to ask the agents for (None: theirs); a ValueError for a bad one, or for
    one asked of this_host() procs, which always end with their controller."""
    local = any(not agents[r].remote for r in shape.global_ranks())
    if keep is None:
        return None if local or not config.keep else float(config.keep)
    if isinstance(keep, bool) or not isinstance(keep, (int, float)) or keep < 0 \
            or keep != keep:
        raise ValueError(f"keep={keep!r}: expected seconds >= 0")
    if keep and local:
        raise ValueError(f"keep={keep!r}: this_host() procs end with their controller; keep "
                         "procs on a job's hosts (ProcessJob, SlurmJob, attach_to_workers)")
    return float(keep)


def _check_proc_bind(proc_bind: Optional[list], n: int) -> list[dict[str, str]]:
    """Per proc of a host, the env entry that pins it (applied in `runtime.proc`)."""
    if proc_bind is None:
        return [{} for _ in range(n)]
    if not isinstance(proc_bind, (list, tuple)) or len(proc_bind) != n:
        got = len(proc_bind) if isinstance(proc_bind, (list, tuple)) else proc_bind
        raise ValueError(f"proc_bind length ({got}) must equal procs_per_host ({n})")
    out = []
    for b in proc_bind:
        if not isinstance(b, dict) or not set(b) <= {"cpus", "cpunodebind"}:
            raise ValueError(f"proc_bind entry {b!r}: supported keys are 'cpus' (a CPU list "
                             "such as '0-3,8') and 'cpunodebind' (NUMA nodes)")
        out.append({"MONARCH_PROC_BIND": json.dumps({k: str(v) for k, v in b.items()})}
                   if b else {})
    return out


def _rebuild_host_mesh(agents: list, shape: Shape) -> HostMesh:
    rt = get_runtime()
    recs = []
    for agent_id, address, host, remote in agents:
        rec = rt.state.agents.get(agent_id)
        if rec is None:
            rec = AgentRecord(agent_id, address, host, remote=remote, hello=True)
            rt.state.change(rt.state.add_agent, rec)
        recs.append(rec)
    hm = HostMesh(rt, recs, shape)
    hm._reference = True
    return hm


_this_host_lock = threading.Lock()


def host_runtime(hm: HostMesh) -> Runtime:
    """The runtime `hm` belongs to."""
    return hm._rt


def view_agents(hm: HostMesh) -> list[AgentRecord]:
    """The agents of `hm`'s view, in its rank order."""
    return [hm._agents[r] for r in hm._shape.global_ranks()]


def this_host() -> HostMesh:
    """The host this process runs on, as a mesh of one host."""
    rt = get_runtime()
    with _this_host_lock:
        hm = rt.this_host_mesh
        if hm is not None and all(a.alive for a in hm._agents):
            return hm
        role = rt.role
        if role.is_proc and role.agent_address:
            agent = rt.state.agents.get(role.host_id)
            if agent is None:
                agent = AgentRecord(role.host_id, role.agent_address, rt.host)
                rt.state.change(rt.state.add_agent, agent)
        else:
            agent = _start_local_agent(rt)
        hm = rt.this_host_mesh = HostMesh(rt, [agent], Shape((), ()))
        return hm


def _name_shared_hosts(agents: list[AgentRecord]) -> None:
    """Agents of one attach that share a host (a LocalJob, two agents on one machine) are
    named host:port in reports, so that each is told apart; the others by their host."""
    from urllib.parse import urlparse

    count: dict[str, int] = {}
    for a in agents:
        count[a.host] = count.get(a.host, 0) + 1
    for a in agents:
        port = urlparse(a.address).port if a.address.startswith("tcp://") else None
        if count[a.host] > 1 and port:
            a.name = f"{a.host}:{port}"


def local_ip_for(host: str, port: int) -> str:
    """The address of this machine on the route to `host` (what the agents can reach)."""
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((host, port or 9))
        return s.getsockname()[0]
    finally:
        s.close()


def _worker_address(a: Any) -> str:
    """A worker's address as dialled: a Future is resolved, an alias gives its dial_to."""
    from ..host.worker import split_address

    if not isinstance(a, str) and callable(getattr(a, "get", None)):
        a = a.get()
    if not isinstance(a, str):
        raise TypeError(f"worker address {a!r}: expected a str or a Future of one")
    listen, dial = split_address(a)
    return dial or listen


def attach_to_workers(addresses: Optional[list[str]] = None, key_file: Optional[str] = None,
                      timeout: float = 30.0, name: Optional[str] = "hosts", *,
                      workers: Optional[list[str]] = None, ca: Any = None,
                      private_key: Any = None, gateway: Optional[str] = None,
                      takeover: bool = False) -> HostMesh:
    """Attach to host agents started with `python -m runtime.host --listen tcp://...` or
    `run_worker_loop_forever`; returns a HostMesh with dimension `hosts` (CurveZMQ on TCP;
    every message carries the key's token). `workers=` is Monarch's name for `addresses`
    (strings or Futures of strings; `dial_to@bind_to` dials `dial_to`); Monarch's
    `ca="trust_all_connections"` uses this user's key file (`auth.user_keys`).
    `gateway="tcp://H:P"`: reach the agents only through the gateway at that address (an
    `ssh -L` to a job's gateway port; docs/multihost.md), which this process dials once;
    nothing in the cluster dials it. An agent that serves another live controller refuses
    (`AttachRefusedError`) unless `takeover=True`; procs it kept for a reattaching
    controller are then this process's (`HostMesh.proc_mesh(name)`)."""
    from urllib.parse import urlparse

    from ..host.worker import worker_key_file
    from ..transport import auth

    if ca is not None or private_key is not None:
        key_file = worker_key_file(ca, private_key, key_file, "attach_to_workers")
    if workers is not None:
        if addresses is not None:
            raise TypeError("attach_to_workers: give addresses or workers=, not both")
        addresses = list(workers)
    name = name or "hosts"
    if not addresses:
        raise ValueError("attach_to_workers needs at least one agent address")
    addresses = [_worker_address(a) for a in addresses]
    for a in addresses:
        u = urlparse(a)
        if not (a.startswith("ipc://") or (u.scheme == "tcp" and u.hostname and u.port)):
            raise ValueError(f"agent address {a!r} is not of the form tcp://HOST:PORT "
                             "(or ipc://PATH)")
    keys = auth.read_key_file(key_file, "key file (key_file=)") if key_file else \
        auth.keys_from_env()
    if keys is None:
        raise PermissionError("attach_to_workers needs the cluster's key file (key_file= or "
                              f"MONARCH_KEY_FILE), or ca='{auth.TRUST_ALL}' for this user's")
    rt = get_runtime()
    tcp = [urlparse(a) for a in addresses if a.startswith("tcp://")]  # ipc: this host
    if gateway is not None:
        g = urlparse(gateway) if isinstance(gateway, str) else None
        if g is None or g.scheme != "tcp" or not g.hostname or not g.port or not tcp \
                or len(tcp) != len(addresses):
            raise ValueError(f"gateway={gateway!r}: expected tcp://HOST:PORT, with agents "
                             "at tcp:// addresses")
        my_addr = rt.messenger.use_gateway(keys, gateway, timeout,
                                           on_loss=lambda link, text: gateway_lost(rt, link, text))
    else:
        ip = local_ip_for(tcp[0].hostname or "", tcp[0].port or 0) if tcp else "127.0.0.1"
        my_addr = rt.enable_tcp(ip, keys)
    agents = []
    for a in addresses:
        rt.add_peer(a, keys)
        rec = AgentRecord(rt.new_id("host"), a, urlparse(a).hostname or a, remote=True)
        rt.state.change(rt.state.add_agent, rec)
        agents.append(rec)
        extra = {"owner": my_addr, "attach_id": rec.agent_id, "takeover": bool(takeover),
                 "pid": os.getpid(), "host": hostname(), "start": start_time(os.getpid())}
        if gateway is not None:  # the agent keeps our procs this long while we are cut off
            extra["lease"] = config.gateway_lease
        rt.send(a, Header(Kind.AGENT_ATTACH, extra=extra))
    deadline = time.monotonic() + timeout
    while not all(a.hello for a in agents):
        refused = [a.refused for a in agents if a.refused]
        if refused:
            from ..errors import AttachRefusedError

            def drop() -> None:
                for a in agents:
                    a.alive = False

            rt.state.change(drop)
            raise AttachRefusedError("; ".join(refused))
        if time.monotonic() > deadline:
            missing = [a.address for a in agents if not a.hello]

            def give_up() -> None:
                for a in agents:
                    a.alive = False

            rt.state.change(give_up)
            raise TimeoutError(
                f"no answer within {timeout:g} s from host agents {missing}: each must be "
                "running (run_worker_loop_forever, or python -m runtime.host --listen) with "
                f"the key of {key_file or config.key_file}; an agent holding another key "
                "refuses the connection")
        time.sleep(0.01)

    def seen() -> None:
        for a in agents:
            a.last_seen = time.monotonic()
        _name_shared_hosts(agents)

    rt.state.change(seen)
    return HostMesh(rt, agents, Shape((name,), (len(agents),)))
