"""The per-process Runtime: message dispatch, ports, the procs and agents this process owns,
and supervision of what it owns. One exists in the controller and one in every proc."""

from __future__ import annotations

import atexit
import collections
import itertools
import logging
import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import logs
from ._process import describe_status, hostname
from .config import config
from .errors import ActorError, SupervisionError
from .future import Future
from .supervision import MeshFailure
from .supervision.health import ActorHealth, ActorState, HealthModel, ProcStats
from .transport import auth, framing
from .transport.framing import Header, Kind
from .transport.loop import IOLoop
from .transport.serialization import dumps, loads

log = logging.getLogger("runtime")


@dataclass
class AgentRecord:
    """A host agent this runtime uses."""

    agent_id: str
    address: str
    host: str
    popen: Any = None  # subprocess.Popen of a local agent
    procs: set = field(default_factory=set)
    last_seen: float = field(default_factory=time.monotonic)
    alive: bool = True
    remote: bool = False
    hello: bool = False
    lost: bool = False  # remote agent declared unreachable; it may come back


@dataclass
class ProcRecord:
    """A proc this runtime started (owns) or knows of."""

    proc_id: str
    rank: int
    mesh: str
    agent: Optional[AgentRecord]
    address: str
    host: str = ""
    pid: int = 0
    state: str = "starting"  # starting, running, failed, stopped
    last_seen: float = field(default_factory=time.monotonic)
    output: collections.deque = field(default_factory=lambda: collections.deque(maxlen=200))
    stderr_tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=200))
    failure: Optional[MeshFailure] = None
    stopping: bool = False
    exited: Optional[Future] = None
    tcp_address: str = ""

    @property
    def route(self) -> Optional[tuple]:
        """(agent address, proc id) for delivery through the host agent."""
        if self.agent is not None:
            return (self.agent.address, self.proc_id)
        return None


@dataclass
class ActorMeshRecord:
    """Owner-side (or caller-side) state shared by every view of one actor mesh."""

    actor_id: str
    name: str
    cls_name: str
    proc_ids: list  # by global rank
    addresses: list  # by global rank ("" where only the agent can reach the proc)
    hosts: list
    sizes: dict
    owned: bool
    owner_actor: Optional[str] = None
    ready: list = field(default_factory=list)  # per global rank: None, True, or error text
    failed: dict = field(default_factory=dict)  # global rank -> MeshFailure
    stopped: bool = False
    initialized: Optional[Future] = None
    inflight: list = field(default_factory=list)  # per rank outstanding calls (for choose)
    health_name: str = ""  # the mesh's key in the health model ("" when not owned here)
    sigs: dict = field(default_factory=dict)  # endpoint name -> inspect.Signature or None
    rr: int = 0  # round-robin start for choose()
    routes: list = field(default_factory=list)  # by global rank: (agent address, proc id)
    init_failed: set = field(default_factory=set)  # ranks whose __init__ raised

    def target(self, rank: int) -> tuple:
        return (self.addresses[rank], self.routes[rank] if self.routes else None)


class Runtime:
    """Everything one process needs to own meshes and talk to actors."""

    def __init__(self, proc_id: Optional[str] = None, token: Optional[bytes] = None,
                 rundir: Optional[str] = None, owner_address: str = "",
                 is_proc: bool = False, keys: Optional[auth.CurveKeys] = None,
                 start: bool = True) -> None:
        self.proc_id = proc_id or f"ctl-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.token = token or auth.new_token()
        self.rundir = rundir or auth.private_dir()
        self._own_rundir = rundir is None
        self.owner_address = owner_address
        self.is_proc = is_proc
        self.keys = keys if keys is not None else auth.keys_from_env()
        self.host = hostname()
        self.health = HealthModel()
        self.loop = IOLoop(self.proc_id, self.token, self._on_message, keys=self.keys,
                           max_message_bytes=config.max_message_bytes)
        self.address = self.loop.bind(f"ipc://{self.rundir}/{self.proc_id}")
        self.tcp_address = ""
        self._tcp_by_key: dict[bytes, str] = {}
        self.cluster_token: Optional[bytes] = None
        if self.keys is not None:
            self.use_keys(self.keys)
        self._port_ids = itertools.count(1)
        self._ports: dict[int, Callable[[Header, Any, list], None]] = {}
        self._port_procs: dict[int, set] = {}  # port -> procs whose reply it waits for
        self._waiting: dict[str, set] = collections.defaultdict(set)  # proc -> ports
        self._port_fail: dict[int, Callable[[BaseException], None]] = {}
        self.agents: dict[str, AgentRecord] = {}
        self._agent_alias: dict[str, AgentRecord] = {}  # agents' own ids -> records
        self._peer_last: dict[str, float] = {}  # peers we wait on but do not own: last answer
        self._next_ping = 0.0
        self.procs: dict[str, ProcRecord] = {}
        self.actor_meshes: dict[str, ActorMeshRecord] = {}
        self._mesh_objects: list = []  # weak-ish registry of user-facing mesh objects
        self._ids = itertools.count()
        self.output_sink: Optional[Callable[[str, str, str], None]] = None
        self.host_handler: Optional[Callable[[Header, Any, list], bool]] = None
        self.dead_procs: set = set()
        self._handlers: dict[int, Callable[[Header, Any, list], None]] = {}
        self._closed = False
        self._lock = threading.RLock()
        self.stats = self.loop.stats
        if start:
            self.start()

    def start(self) -> None:
        """Start the I/O thread (procs first install their handlers, then start)."""
        self.loop.start()
        self.loop.call_soon(self._start_timers)

    # -- ids ---------------------------------------------------------------------------------
    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:8]}"

    def _start_timers(self) -> None:
        self.loop.call_every(0.1, self._check_liveness)
        self.loop.call_every(config.heartbeat_interval, self._send_heartbeats)

    # -- multi-host ------------------------------------------------------------------------------
    def use_keys(self, keys: auth.CurveKeys) -> None:
        """Join a cluster: accept its token, and use CurveZMQ for TCP peers."""
        if self.keys is None:
            self.keys = keys
            self.loop.keys = keys
        if self.cluster_token is None:
            self.cluster_token = auth.cluster_token(keys)
        tok = auth.cluster_token(keys)
        if tok not in self.loop.tokens:
            self.loop.tokens.append(tok)

    def enable_tcp(self, ip: str, keys: Optional[auth.CurveKeys] = None) -> str:
        """Listen on TCP (CurveZMQ) on `ip` for peers holding `keys`; returns the address."""
        keys = keys or self.keys
        if keys is None:
            raise PermissionError("TCP across hosts needs a CurveZMQ key file "
                                  "(python -m runtime.transport.auth keygen PATH)")
        self.use_keys(keys)
        addr = self._tcp_by_key.get(keys.public)
        if addr is None:
            addr = self._tcp_by_key[keys.public] = self.loop.bind_extra(f"tcp://{ip}:0", keys)
        if not self.tcp_address:
            self.tcp_address = addr
        return addr

    def add_peer(self, addr: str, keys: auth.CurveKeys) -> None:
        """Remember that the TCP peer at `addr` belongs to the cluster of `keys`."""
        self.loop.peer_keys[addr] = keys

    def token_for(self, addr: str) -> bytes:
        if addr.startswith("tcp://"):
            keys = self.loop.peer_keys.get(addr, self.keys)
            if keys is not None:
                return auth.cluster_token(keys)
        return self.token

    def reply_address_for(self, target_addr: str) -> str:
        """The address of this process that a peer at `target_addr` can reach."""
        if target_addr.startswith("tcp://"):
            keys = self.loop.peer_keys.get(target_addr, self.keys)
            if keys is not None and keys.public in self._tcp_by_key:
                return self._tcp_by_key[keys.public]
            if self.tcp_address:
                return self.tcp_address
        return self.address

    # -- sending ---------------------------------------------------------------------------------
    def send(self, addr: str, header: Header, body: bytes = b"", buffers: tuple = ()) -> None:
        if not header.src:
            header.src = self.proc_id
        self.loop.send(addr, framing.build(self.token_for(addr), header, body, buffers))

    def send_to_proc(self, address: str, route: Optional[tuple], header: Header,
                     body: bytes = b"", buffers: tuple = ()) -> None:
        """Send to one proc: directly when its address is known, else through its agent."""
        if address:
            self.send(address, header, body, buffers)
        elif route:
            self.cast([(address, route)], header, body, buffers)

    def cast(self, targets: list, header: Header, body: bytes = b"",
             buffers: tuple = ()) -> None:
        """Send one message to many procs: directly to those with an address, and one
        FANOUT per host agent for the rest (the agent delivers to its local procs)."""
        if not header.src:
            header.src = self.proc_id
        by_agent: dict[str, list] = {}
        frames = None
        for address, route in targets:
            if address:
                if frames is None or frames[0] != self.token_for(address):
                    frames = framing.build(self.token_for(address), header, body, buffers)
                self.loop.send(address, frames)
            elif route:
                by_agent.setdefault(route[0], []).append(route[1])
        if by_agent:
            inner = framing.encode_header(header)
            for agent_addr, procs in by_agent.items():
                h = Header(Kind.FANOUT, src=self.proc_id, extra={"header": inner, "procs": procs})
                self.loop.send(agent_addr, framing.build(self.token_for(agent_addr), h, body,
                                                         buffers))

    # -- ports -------------------------------------------------------------------------------------
    def open_port(self, handler: Callable[[Header, Any, list], None],
                  on_fail: Optional[Callable[[BaseException], None]] = None) -> int:
        pid = next(self._port_ids)
        self._ports[pid] = handler
        if on_fail is not None:
            self._port_fail[pid] = on_fail
        return pid

    def close_port(self, pid: int) -> None:
        self._ports.pop(pid, None)
        self._port_fail.pop(pid, None)
        for proc in self._port_procs.pop(pid, ()):
            s = self._waiting.get(proc)
            if s is not None:
                s.discard(pid)

    def watch(self, pid: int, proc_ids: set) -> None:
        """Fail port `pid` if any of `proc_ids` dies before it is closed (loop thread)."""
        dead = [p for p in proc_ids if p in self.dead_procs]
        if dead:
            fail = self._port_fail.get(pid)
            if fail:
                fail(SupervisionError(self._dead_message(dead[0])))
            return
        self._port_procs.setdefault(pid, set()).update(proc_ids)
        for p in proc_ids:
            self._waiting[p].add(pid)

    def unwatch(self, pid: int, proc_id: str) -> None:
        s = self._port_procs.get(pid)
        if s is not None:
            s.discard(proc_id)
        w = self._waiting.get(proc_id)
        if w is not None:
            w.discard(pid)

    def _dead_message(self, proc_id: str) -> str:
        rec = self.procs.get(proc_id)
        if rec is not None and rec.failure is not None:
            return f"actor failed: {rec.failure}"
        return f"proc {proc_id} is dead"

    # -- message dispatch (loop thread) -------------------------------------------------------------
    def register_handler(self, kind: int, fn: Callable[[Header, Any, list], None]) -> None:
        """Route messages of `kind` to `fn(header, body, buffers)` on the I/O thread
        (extension point: the debugger uses Kind.DEBUG)."""
        self._handlers[int(kind)] = fn

    def _on_message(self, h: Header, body: Any, buffers: list) -> None:
        k = h.kind
        extra_handler = self._handlers.get(k)
        if extra_handler is not None:
            extra_handler(h, body, buffers)
            return
        if k == Kind.REPLY or k == Kind.PORT_SEND:
            fn = self._ports.get(h.port)
            if fn is not None:
                fn(h, body, buffers)
            return
        if self.host_handler is not None and self.host_handler(h, body, buffers):
            return
        if k == Kind.HEARTBEAT:
            self._on_heartbeat(h)
        elif k == Kind.LOG:
            self._on_log(h, body)
        elif k == Kind.HELLO:
            self._on_hello(h)
        elif k == Kind.PROC_EXIT:
            self._on_proc_exit(h)
        elif k == Kind.ACTOR_READY:
            self._on_actor_ready(h)
        elif k == Kind.ACTOR_FAILED:
            self._on_actor_failed(h, body, buffers)
        elif k == Kind.ACTOR_STOPPED:
            self._on_actor_stopped(h)
        elif k == Kind.PROC_DEAD:
            for p in (h.extra or {}).get("procs", []):
                self._mark_dead(p, None)
        else:
            log.warning("%s: unexpected message kind %s from %s; dropped", self.proc_id,
                        h.kind, h.src)

    def _on_heartbeat(self, h: Header) -> None:
        now = time.monotonic()
        e = h.extra
        if isinstance(e, dict) and ("ping" in e or "pong" in e):
            if "ping" in e and h.reply:  # a peer waiting on us checks we are reachable
                self.send(h.reply, Header(Kind.HEARTBEAT, extra={"pong": e["ping"]}))
            else:
                self._peer_last[h.src] = now
            return
        agent = self.agents.get(h.src) or self._agent_alias.get(h.src)
        if agent is not None:
            agent.last_seen = now
            if agent.lost:  # the link came back: usable for new procs; old ones are failed
                agent.lost, agent.alive = False, True
                log.warning("host %s is reachable again", agent.host)
                stale = [p for p in agent.procs if p in self.dead_procs]
                if stale:
                    self.send(agent.address, Header(Kind.KILL_PROCS, extra={
                        "procs": stale, "signal": int(signal.SIGKILL)}))
            return
        rec = self.procs.get(h.src)
        if rec is None:
            return
        rec.last_seen = now
        e = h.extra or {}
        if "rss" in e:
            self.health.update_proc(ProcStats(rec.proc_id, rec.host, rec.pid,
                                              e.get("cpu", 0.0), e.get("rss", 0), e.get("gpu")))
        for actor_id, st in (e.get("actors") or {}).items():
            m = self.actor_meshes.get(actor_id)
            if m is None or m.stopped:
                continue
            state, endpoint, since, handled, errors = st
            try:
                rank = m.proc_ids.index(rec.proc_id)
            except ValueError:
                continue
            if rank in m.failed or m.ready[rank] is None:
                continue
            self.health.update(m.health_name, rank, ActorState(state),
                               endpoint=endpoint, since=since, handled=handled, errors=errors)

    def _on_log(self, h: Header, body: Any) -> None:
        e = h.extra or {}
        proc_id = e.get("proc", "")
        stream = e.get("stream", "stdout")
        label = e.get("label", "")
        text = bytes(body).decode("utf-8", "replace")
        rec = self.procs.get(proc_id)
        if rec is not None:
            rank = rec.rank
            if not label:
                label = rec.mesh
            lines = [ln for ln in text.splitlines() if not ln.startswith(logs.CONTROL_MARK)]
            rec.output.extend(f"[{stream}] {ln}" for ln in lines)
            if stream == "stderr":
                rec.stderr_tail.extend(lines)
            prefix = f"{label} {rank}"
            if rec.agent is not None and rec.agent.remote:
                prefix = f"{label} {rank}@{rec.host}"
        else:
            prefix = label or proc_id
        logs.emit(self.output_sink, prefix, stream, text)

    def _on_hello(self, h: Header) -> None:
        e = h.extra or {}
        if e.get("agent"):
            for a in self.agents.values():
                if a.agent_id == e.get("attach_id") or a.agent_id == h.src:
                    a.host = e.get("host", a.host)
                    a.last_seen = time.monotonic()
                    a.hello = True
                    self._agent_alias[h.src] = a
            return
        rec = self.procs.get(h.src)
        if rec is None:
            return
        rec.pid = e.get("pid", rec.pid)
        rec.host = e.get("host", rec.host)
        if e.get("address") and not (rec.agent is not None and rec.agent.remote):
            rec.address = e["address"]
        rec.tcp_address = e.get("tcp", "")
        if rec.state == "starting":
            rec.state = "running"
        rec.last_seen = time.monotonic()
        for m in self.actor_meshes.values():
            if rec.proc_id in m.proc_ids:
                r = m.proc_ids.index(rec.proc_id)
                self.health.update(m.health_name, r, None, pid=rec.pid, host=rec.host)

    # -- actors: readiness, failure, stop ------------------------------------------------------------
    def _on_actor_ready(self, h: Header) -> None:
        m = self.actor_meshes.get(h.actor)
        if m is None or h.rank < 0 or h.rank >= len(m.ready):
            return
        if m.ready[h.rank] is None:
            m.ready[h.rank] = True
        self.health.update(m.health_name, h.rank, ActorState.IDLE)
        self._check_initialized(m)

    def _check_initialized(self, m: ActorMeshRecord) -> None:
        if m.initialized is None or m.initialized.done():
            return
        if any(r is None for r in m.ready):
            return
        errors = [(i, r) for i, r in enumerate(m.ready) if r is not True]
        if errors:
            i, text = errors[0]
            m.initialized.set_exception(SupervisionError(
                f"actor mesh {m.name!r} rank {i} failed in __init__:\n{text}"))
        else:
            m.initialized.set_result(None)

    def _on_actor_failed(self, h: Header, body: Any, buffers: list) -> None:
        m = self.actor_meshes.get(h.actor)
        e = h.extra or {}
        if m is None:
            return
        rank = h.rank
        rec = self.procs.get(m.proc_ids[rank]) if 0 <= rank < len(m.proc_ids) else None
        caused_by = None
        if body is not None and len(memoryview(body)):
            try:
                caused_by = loads(body, buffers)
            except Exception:
                caused_by = None
        failure = MeshFailure(
            mesh=m.name, ranks=[rank], cause=e.get("cause", "actor failed"),
            host=rec.host if rec else "", pid=rec.pid if rec else 0,
            proc_id=rec.proc_id if rec else "", traceback=e.get("traceback", ""),
            caused_by=caused_by if isinstance(caused_by, MeshFailure) else None,
        )
        if e.get("init"):
            m.init_failed.add(rank)
            m.ready[rank] = f"{failure.cause}\n{failure.traceback}"
            m.failed[rank] = failure
            self.health.update(m.health_name, rank, ActorState.FAILED,
                               detail=failure.cause, last_error=failure.cause,
                               last_traceback=failure.traceback)
            self._check_initialized(m)
            return
        if rank in m.failed:
            return
        m.failed[rank] = failure
        self.health.update(m.health_name, rank, ActorState.FAILED,
                           detail=failure.cause, last_error=failure.cause,
                           last_traceback=failure.traceback)
        self._fail_ports_for_actor(m, rank, failure)
        self._deliver_failure(m, failure)

    def _fail_ports_for_actor(self, m: ActorMeshRecord, rank: int, failure: MeshFailure) -> None:
        proc = m.proc_ids[rank]
        for pid in list(self._waiting.get(proc, ())):
            fail = self._port_fail.get(pid)
            if fail is not None:
                failure.seen_by_waiter = True
                fail(SupervisionError(failure.report(), failure),
                     actor=m.actor_id)

    def _on_actor_stopped(self, h: Header) -> None:
        m = self.actor_meshes.get(h.actor)
        if m is not None and 0 <= h.rank < len(m.proc_ids):
            self.health.update(m.health_name, h.rank, ActorState.STOPPED)

    # -- supervision --------------------------------------------------------------------------------
    def _deliver_failure(self, m: Optional[ActorMeshRecord], failure: MeshFailure) -> None:
        """Hand a failure of something this process owns to its owner (loop thread)."""
        owner_actor = m.owner_actor if m is not None else None
        if owner_actor is not None and self.host_handler is not None:
            deliver = getattr(self, "deliver_to_actor", None)
            if deliver is not None and deliver(owner_actor, failure):
                return
        if self.is_proc:
            self._escalate(failure)
            return

        def run_hook() -> None:
            import runtime

            hook = getattr(runtime, "unhandled_fault_hook", None)
            try:
                if hook is not None:
                    hook(failure)
            except SystemExit:
                os._exit(1)
            except Exception:
                log.exception("unhandled_fault_hook raised")

        threading.Thread(target=run_hook, name="monarch-fault-hook", daemon=True).start()

    def _escalate(self, failure: MeshFailure) -> None:
        """In a proc with no supervising actor: report to the proc's owner."""
        log.error("unsupervised failure in proc %s: %s", self.proc_id, failure)

    def _check_liveness(self) -> None:
        now = time.monotonic()
        timeout = config.heartbeat_timeout
        if self._waiting:
            self._check_peers(now)
        for agent in list(self.agents.values()):
            if not agent.alive:
                continue
            dead = False
            cause = ""
            if agent.popen is not None and agent.popen.poll() is not None:
                dead = True
                cause = f"host agent {describe_status(*_split_status(agent.popen.returncode))}"
            elif agent.remote and now - agent.last_seen > timeout:
                dead = True
                cause = f"host {agent.host} unreachable (no heartbeat for {timeout:g} s)"
            if dead:
                agent.alive = False
                agent.lost = agent.remote and agent.popen is None and agent.hello
                for p in list(agent.procs):
                    self._proc_failed(p, cause)
        for rec in list(self.procs.values()):
            if rec.state in ("running",) and now - rec.last_seen > timeout and not rec.stopping:
                self._proc_failed(rec.proc_id, f"proc unresponsive (no heartbeat for {timeout:g} s)",
                                  kill=True)

    def _check_peers(self, now: float) -> None:
        """Ping procs we wait on but do not own (actor-to-actor calls); fail the waits on a
        peer that stops answering: a network partition, not a dead controller."""
        waiting = [p for p, ports in self._waiting.items()
                   if ports and p not in self.procs and p not in self.dead_procs]
        for p in list(self._peer_last):
            if p not in waiting:
                del self._peer_last[p]
        if not waiting:
            return
        timeout = config.heartbeat_timeout
        targets = {}
        for m in self.actor_meshes.values():
            if m.owned:
                continue
            for r, pid in enumerate(m.proc_ids):
                if pid in waiting and pid not in targets:
                    targets[pid] = (m.target(r), m.hosts[r] if r < len(m.hosts) else "")
        ping_now = now >= self._next_ping
        if ping_now:
            self._next_ping = now + config.heartbeat_interval
        for pid in waiting:
            last = self._peer_last.setdefault(pid, now)
            if pid not in targets:
                continue
            (addr, route), host = targets[pid]
            if now - last > timeout:
                del self._peer_last[pid]
                msg = (f"proc {pid} on host {host or '?'} is unreachable from {self.host} "
                       f"({self.proc_id}): no answer for {timeout:g} s (network partition?)")
                log.warning(msg)
                for port in list(self._waiting.pop(pid, ())):
                    fail = self._port_fail.get(port)
                    if fail is not None:
                        fail(SupervisionError(msg))
                continue
            if ping_now:
                reply = self.reply_address_for(addr or (route or ("",))[0])
                self.send_to_proc(addr, route, Header(Kind.HEARTBEAT, reply=reply,
                                                      extra={"ping": pid}))

    def _send_heartbeats(self) -> None:
        for agent in self.agents.values():
            if agent.alive or agent.lost:  # keep a lost host's agent from giving up on us
                self.send(agent.address, Header(Kind.HEARTBEAT))
        if self.owner_address:
            extra_fn = getattr(self, "heartbeat_extra", None)
            self.send(self.owner_address, Header(
                Kind.HEARTBEAT, extra=extra_fn() if extra_fn is not None else None))

    def _on_proc_exit(self, h: Header) -> None:
        e = h.extra or {}
        proc_id = e.get("proc", "")
        rec = self.procs.get(proc_id)
        if rec is None:
            return
        for ln in e.get("stderr", []):
            if not rec.stderr_tail or rec.stderr_tail[-1] != ln:
                rec.stderr_tail.append(ln)
        code, sig = e.get("code"), e.get("signal")
        if rec.stopping or rec.state == "stopped":
            rec.state = "stopped"
            self._mark_dead(proc_id, None)
            if rec.exited is not None:
                rec.exited.set_result(None)
            return
        self._proc_failed(proc_id, f"process {describe_status(code, sig)}", code=code, sig=sig)
        if rec.exited is not None:
            rec.exited.set_result(None)

    def _proc_failed(self, proc_id: str, cause: str, code: Optional[int] = None,
                     sig: Optional[int] = None, kill: bool = False) -> None:
        rec = self.procs.get(proc_id)
        if rec is None or rec.state in ("failed", "stopped"):
            return
        rec.state = "failed"
        if kill and rec.agent is not None and rec.agent.alive:
            self.send(rec.agent.address, Header(Kind.KILL_PROCS, extra={
                "procs": [proc_id], "signal": int(signal.SIGKILL)}))
        base = MeshFailure(mesh=rec.mesh, ranks=[rec.rank], cause=cause, host=rec.host,
                           pid=rec.pid, proc_id=proc_id, exit_code=code, signal=sig,
                           stderr_tail=_tail(list(rec.stderr_tail), config.stderr_tail_lines))
        rec.failure = base
        failures = []
        for m in list(self.actor_meshes.values()):
            if proc_id not in m.proc_ids or m.stopped:
                continue
            rank = m.proc_ids.index(proc_id)
            if rank in m.failed:
                continue
            f = MeshFailure(mesh=m.name, ranks=[rank], cause=cause, host=rec.host, pid=rec.pid,
                            proc_id=proc_id, exit_code=code, signal=sig,
                            stderr_tail=base.stderr_tail)
            m.failed[rank] = f
            if m.ready[rank] is None:
                m.ready[rank] = cause
                self._check_initialized(m)
            self.health.update(m.health_name, rank, ActorState.FAILED,
                               detail=cause, last_error=cause)
            self._fail_ports_for_actor(m, rank, f)
            if m.owned:
                failures.append((m, f))
        self._mark_dead(proc_id, base)
        # tell the other procs we own, so their waits on this proc fail too
        others = [(o.address, o.route) for o in self.procs.values()
                  if o.state == "running" and o.proc_id != proc_id]
        if others:
            self.cast(others, Header(Kind.PROC_DEAD, extra={"procs": [proc_id]}))
        if failures:
            for m, f in failures:
                self._deliver_failure(m, f)
        elif rec.agent is not None:
            self._deliver_failure(None, base)

    def _mark_dead(self, proc_id: str, failure: Optional[MeshFailure]) -> None:
        self.dead_procs.add(proc_id)
        msg = self._dead_message(proc_id)
        for pid in list(self._waiting.pop(proc_id, ())):
            fail = self._port_fail.get(pid)
            if fail is not None:
                fail(SupervisionError(
                    msg + ("\n" + failure.report() if failure is not None else ""), failure))
        rec = self.procs.get(proc_id)
        if rec is not None:
            self.loop.forget_peer(rec.address)

    # -- output ------------------------------------------------------------------------------------------
    def set_output_sink(self, fn: Optional[Callable[[str, str, str], None]]) -> None:
        """Where forwarded remote output goes: fn(label, stream, text); None prints it."""
        self.output_sink = fn

    def output_tail(self, proc_id: str, n: int = 100) -> list[str]:
        rec = self.procs.get(proc_id)
        return list(rec.output)[-n:] if rec is not None else []

    # -- admin operations ---------------------------------------------------------------------------
    def dump_stack(self, proc_id: str, timeout: float = 5.0) -> Future:
        """Future[str]: the current stack of every thread of a proc."""
        fut: Future = Future(f"dump_stack({proc_id})")
        rec = self.procs.get(proc_id)
        if rec is None:
            fut.set_exception(KeyError(f"unknown proc {proc_id}"))
            return fut

        def on_reply(h: Header, body: Any, buffers: list) -> None:
            self.close_port(port)
            fut.set_result(bytes(body).decode("utf-8", "replace"))

        def on_fail(exc: BaseException, actor: Any = None) -> None:
            self.close_port(port)
            fut.set_exception(exc)

        port = self.open_port(on_reply, on_fail)

        def go() -> None:
            self.watch(port, {proc_id})
            reply = self.reply_address_for(rec.address or (rec.agent.address if rec.agent else ""))
            self.send_to_proc(rec.address, rec.route, Header(Kind.DUMP_STACK, reply=reply,
                                                             port=port))
        self.loop.call_soon(go)
        return fut

    def kill_proc(self, proc_id: str, sig: int = signal.SIGKILL) -> None:
        """Send a signal to a proc through its host agent."""
        rec = self.procs.get(proc_id)
        if rec is None:
            raise KeyError(f"unknown proc {proc_id}")
        if rec.agent is not None:
            self.send(rec.agent.address, Header(Kind.KILL_PROCS, extra={
                "procs": [proc_id], "signal": int(sig)}))
        elif rec.pid:
            os.kill(rec.pid, sig)

    def proc_state(self, proc_id: str) -> Optional[str]:
        """State of a proc this runtime knows: "starting", "running", "failed" or "stopped";
        None for a proc it does not know."""
        rec = self.procs.get(proc_id)
        return rec.state if rec is not None else None

    def interrupt(self, proc_ids: list, port: int = 0) -> None:
        """Raise KeyboardInterrupt in the actors of these procs serving `port` (0: all)."""
        for p in proc_ids:
            rec = self.procs.get(p)
            if rec is not None:
                self.send_to_proc(rec.address, rec.route, Header(Kind.INTERRUPT, port=port))

    def meshes(self) -> list:
        """The live ProcMesh and ActorMesh objects created in this process."""
        out = []
        for ref in list(self._mesh_objects):
            obj = ref()
            if obj is not None and not getattr(obj, "_stopped_flag", False):
                out.append(obj)
        return out

    def register_mesh(self, obj: Any) -> None:
        import weakref

        with self._lock:
            self._mesh_objects = [r for r in self._mesh_objects if r() is not None]
            self._mesh_objects.append(weakref.ref(obj))
        if not self.is_proc and os.environ.get("MONARCH_ADMIN", "1") != "0":
            try:  # the controller's loopback admin endpoint (monarch-admin attaches to it)
                from runtime.admin import serve
                from runtime.debugging.admin import register as register_debug

                register_debug(serve(self))  # + the debugger's requests (monarch-debug)
            except Exception:
                log.exception("admin endpoint did not start")

    # -- shutdown ------------------------------------------------------------------------------------
    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop every proc and agent this process started, then the I/O thread."""
        if self._closed:
            return
        self._closed = True
        done = threading.Event()

        def stop_all() -> None:
            for rec in self.procs.values():
                if rec.state in ("running", "starting"):
                    rec.stopping = True
                    self.send_to_proc(rec.address, rec.route, Header(Kind.STOP_PROC))
            for agent in self.agents.values():
                if agent.alive:
                    self.send(agent.address, Header(Kind.AGENT_STOP))
            done.set()

        self.loop.call_soon(stop_all)
        done.wait(1.0)
        deadline = time.monotonic() + timeout
        for agent in self.agents.values():
            p = agent.popen
            if p is None:
                continue
            import subprocess

            try:
                p.wait(max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                try:
                    p.wait(1.0)
                except subprocess.TimeoutExpired:
                    pass
        self.loop.stop()
        if self._own_rundir:
            import shutil

            shutil.rmtree(self.rundir, ignore_errors=True)


def _tail(lines: list, n: int) -> list:
    """The last `n` lines, keeping an earlier 'Fatal Python error' line (segfaults)."""
    tail = lines[-n:]
    for i, ln in enumerate(lines[:-n] if len(lines) > n else []):
        if ln.startswith("Fatal Python error"):
            return [ln, "..."] + tail
    return tail


def _split_status(rc: Optional[int]) -> tuple[Optional[int], Optional[int]]:
    if rc is None:
        return None, None
    if rc < 0:
        return None, -rc
    return rc, None


_runtime: Optional[Runtime] = None
_runtime_lock = threading.Lock()


def get_runtime() -> Runtime:
    """This process's Runtime, created on first use (the controller's, or the proc's)."""
    global _runtime
    rt = _runtime
    if rt is not None and not rt._closed:
        return rt
    with _runtime_lock:
        if _runtime is None or _runtime._closed:
            _runtime = Runtime()
            atexit.register(_shutdown_at_exit)
            try:
                from .debugging import install_in_controller

                install_in_controller(_runtime)
            except Exception:
                log.exception("debugger not installed")
            from .hooks import run_startup_hooks

            run_startup_hooks(_runtime)  # front-ends registered with runtime.hooks
        return _runtime


def set_runtime(rt: Runtime) -> None:
    global _runtime
    _runtime = rt


def current_runtime() -> Optional[Runtime]:
    return _runtime


def shutdown(timeout: float = 5.0) -> None:
    """Stop every mesh this process started."""
    global _runtime
    rt = _runtime
    if rt is not None:
        rt.shutdown(timeout)
        if rt is _runtime and not rt.is_proc:
            _runtime = None


def _shutdown_at_exit() -> None:
    rt = _runtime
    if rt is not None and not rt.is_proc:
        try:
            rt.shutdown(timeout=2.0)
        except Exception:
            pass
