"""The Runtime: one per process (the controller's, or a proc's), composing the state table,
the messenger, ports, liveness, failures and a role, with a message-kind -> handler table."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
import uuid
from typing import Any, Callable, Optional

from .._base import features as _features
from .._base.process import hostname
from ..config import config
from ..future import Future, when_all
from ..supervision.health import HealthModel
from ..transport import auth
from ..transport.framing import Header, Kind, extra_get
from ..transport.loop import IOLoop
from .failures import Failures
from .liveness import Liveness
from .messenger import Messenger
from .output import ProcOutput
from .ports import Ports
from .records import ProcState
from .roles import ControllerRole
from .state import State

__all__ = ["Handler", "Runtime", "start_admin_endpoint"]

log = logging.getLogger("runtime")

Handler = Callable[[Header, Any, list], None]


class Runtime:
    """Everything one process needs to own meshes and talk to actors."""

    def __init__(self, proc_id: Optional[str] = None, token: Optional[bytes] = None,
                 rundir: Optional[str] = None, owner_address: str = "",
                 keys: Optional[auth.CurveKeys] = None, role: Any = None,
                 start: bool = True) -> None:
        self.proc_id = proc_id or f"ctl-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.token = token or auth.new_token()
        keys = keys if keys is not None else auth.keys_from_env()  # refused: nothing made
        if rundir is None:  # a controller: first remove what crashed controllers left
            from .. import rundir as rundirs

            try:
                rundirs.sweep()
            except Exception:
                log.exception("sweeping the runtime root failed")
        self.rundir = rundir or auth.private_dir("run")
        self._own_rundir = rundir is None
        self.owner_address = owner_address
        self.host = hostname()
        self.health = HealthModel()
        self.role = role or ControllerRole()
        self.loop = IOLoop(self.proc_id, self.token, self._dispatch, keys=keys,
                           max_message_bytes=config.max_message_bytes)
        self.messenger = Messenger(self.loop, self.proc_id, self.token, keys)
        self.messenger.address = self.loop.bind(f"ipc://{self.rundir}/{self.proc_id}")
        self.state = State(self.loop)
        self.messenger.watched_agents = lambda: {a.address for a in
                                                 list(self.state.agents.values())}
        self.ports = Ports()
        self.failures = Failures(self)
        self.liveness = Liveness(self)
        self.loop.peers.on_send_failed = self.failures.send_failed
        self.output_sink: Optional[Callable[[str, str, str], None]] = None
        self.output = ProcOutput(self)
        self.this_host_mesh: Any = None  # the HostMesh of this_host(), once made
        self._closed = False
        self._admin_started = False
        self._handlers: dict[int, Handler] = {
            Kind.REPLY: self.ports.deliver, Kind.REPLY_BATCH: self.ports.deliver_batch,
            Kind.PORT_SEND: self.ports.deliver,
            Kind.HEARTBEAT: self.liveness.on_heartbeat,
            Kind.LOG: self.output.on_log,
            Kind.HELLO: self._on_hello,
            Kind.PROC_EXIT: self.failures.on_proc_exit,
            Kind.ACTOR_READY: self.failures.on_actor_ready,
            Kind.ACTOR_FAILED: self.failures.on_actor_failed,
            Kind.ACTOR_STOPPED: self.failures.on_actor_stopped,
            Kind.PROC_DEAD: self.failures.on_proc_dead,
            Kind.TAKEN: self._on_taken,
        }
        self._handlers.update(self.role.handlers())
        if start:
            self.start()

    def start(self) -> None:
        """Start the I/O thread and the liveness timers."""
        self.loop.start()
        self.loop.call_soon(self.liveness.start)

    # -- facade over the parts ---------------------------------------------------------------
    is_proc = property(lambda self: self.role.is_proc)
    address = property(lambda self: self.messenger.address)
    tcp_address = property(lambda self: self.messenger.tcp_address)
    keys = property(lambda self: self.messenger.keys)
    cluster_token = property(lambda self: self.messenger.cluster_token)
    stats = property(lambda self: self.loop.stats)
    agents = property(lambda self: self.state.agents)
    procs = property(lambda self: self.state.procs)
    actor_meshes = property(lambda self: self.state.actor_meshes)
    dead_procs = property(lambda self: self.state.dead_procs)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:8]}"

    def send(self, addr: str, header: Header, body: bytes = b"", buffers: tuple = ()) -> None:
        """Send one message from the calling thread."""
        self.messenger.send(addr, header, body, buffers)

    def send_to_proc(self, address: str, route: Optional[tuple], header: Header,
                     body: bytes = b"", buffers: tuple = (), base: Any = None) -> None:
        self.messenger.send_to_proc(address, route, header, body, buffers, base)

    def reply_address_for(self, target_addr: str) -> str:
        return self.messenger.reply_address_for(target_addr)

    def use_keys(self, keys: auth.CurveKeys) -> None:
        self.messenger.use_keys(keys)

    def enable_tcp(self, ip: str, keys: Optional[auth.CurveKeys] = None) -> str:
        return self.messenger.enable_tcp(ip, keys)

    def add_peer(self, addr: str, keys: auth.CurveKeys) -> None:
        self.messenger.add_peer(addr, keys)

    def open_port(self, handler: Any, on_fail: Optional[Callable[..., None]] = None,
                  procs: Any = ()) -> int:
        """A port for replies; `on_fail(exc, proc=, actor=)` if one of `procs` dies first
        (or `handler` is a `ports.Waiter`). A proc already dead fails the port at once."""
        pid, w = self.ports.open(handler, on_fail, procs)
        dead = self.state.dead_procs.first_of(w.procs)
        if dead is not None and w.on_fail is not None:
            from ..errors import SupervisionError

            exc = SupervisionError(self.failures.dead_message(dead))
            self.loop.call_soon(self.ports.fail, pid, exc, dead)
        return pid

    def close_port(self, pid: int) -> None:
        self.ports.close(pid)

    # -- message dispatch (I/O thread) ----------------------------------------------------------
    def register_handler(self, kind: int, fn: Handler) -> None:
        """Route messages of `kind` to `fn(header, body, buffers)` on the I/O thread
        (extension point: the debugger uses Kind.DEBUG)."""
        self._handlers[int(kind)] = fn

    def _on_taken(self, h: Header, body: Any, buffers: list) -> None:
        """An actor took messages of ours that have no answer: they leave the call window."""
        rec = self.state.actor_meshes.get(h.actor)
        n = extra_get(h, "n")
        if rec is not None and type(n) is int and n > 0:
            rec.confirmed(h.rank, n)

    def _dispatch(self, h: Header, body: Any, buffers: list) -> None:
        rec = dict.get(self.state.procs, h.src)
        if rec is not None:  # any message is a sign of life, not only a heartbeat
            rec.last_seen = time.monotonic()
        fn = self._handlers.get(h.kind)
        if fn is None:
            log.warning("%s: unexpected message kind %s from %s; dropped", self.proc_id,
                        h.kind, h.src)
            return
        fn(h, body, buffers)

    def _on_hello(self, h: Header, body: Any, buffers: list) -> None:
        e = h.extra or {}
        state = self.state
        if e.get("agent"):
            for a in state.agents.values():
                if a.agent_id == e.get("attach_id") or a.agent_id == h.src:
                    if e.get("refused"):  # another controller owns it (attach_to_workers)
                        a.refused = str(e["refused"])
                        continue
                    a.kept = list(e.get("kept") or [])
                    a.prev_owner = str(e.get("prev_owner") or "")
                    a.prev_silent_for = float(e.get("prev_silent_for") or 0.0)
                    a.prev_alive = bool(e.get("prev_alive"))
                    a.host = e.get("host", a.host)
                    if a.remote and a.host != self.host:
                        self.messenger.far_agents.add(a.address)
                    a.last_seen = time.monotonic()
                    a.hello = True
                    state.alias_agent(h.src, a)
            return
        rec = state.proc(h.src)
        if rec is None:
            return
        rec.pid = e.get("pid", rec.pid)
        rec.host = e.get("host", rec.host)
        if e.get("address") and not (rec.agent is not None and rec.agent.remote):
            rec.address = e["address"]
        rec.tcp_address = e.get("tcp", "")
        if rec.tcp_address and rec.agent is not None:
            self.messenger.same_cluster_as(rec.tcp_address, rec.agent.address)
        if rec.state == "starting":
            rec.state = "running"
        rec.last_seen = time.monotonic()
        for m, r in state.meshes_on(rec.proc_id):
            self.health.update(m.health_name, r, None, pid=rec.pid, host=rec.place)

    # -- output and operations ------------------------------------------------------------------
    def set_output_sink(self, fn: Optional[Callable[[str, str, str], None]]) -> None:
        """Where forwarded remote output goes: fn(label, stream, text); None prints it."""
        self.output_sink = fn

    def flush_output(self, timeout: float = 1.0) -> None:
        """Deliver the proc output held for aggregation now (`ProcMesh.logging_option`) and
        wait (up to `timeout`) until the output sink has taken everything received so far;
        the notebook kernel calls it when a cell ends."""
        if self._closed:
            return
        deadline = time.monotonic() + timeout
        try:
            self.loop.run_sync(self.output.flush, timeout=timeout)
        except TimeoutError:
            pass
        self.output.writer.drain(max(0.0, deadline - time.monotonic()))

    def output_tail(self, proc_id: str, n: int = 100) -> list[str]:
        rec = self.state.proc(proc_id)
        return list(rec.output)[-n:] if rec is not None else []

    def dump_stack(self, proc_id: str, timeout: float = 5.0) -> Future:
        """Future[str]: the current stack of every thread of a proc."""
        fut: Future = Future(f"dump_stack({proc_id})")
        rec = self.state.proc(proc_id)
        if rec is None:
            fut.set_exception(KeyError(f"unknown proc {proc_id}"))
            return fut

        def on_reply(h: Header, body: Any, buffers: list) -> None:
            self.close_port(port)
            fut.set_result(bytes(body).decode("utf-8", "replace"))

        def on_fail(exc: BaseException, **_: Any) -> None:
            self.close_port(port)
            fut.set_exception(exc)

        port = self.open_port(on_reply, on_fail, {proc_id})
        reply = self.reply_address_for(rec.address or (rec.agent.address if rec.agent else ""))
        self.send_to_proc(rec.address, rec.route, Header(Kind.DUMP_STACK, reply=reply,
                                                         port=port))
        return fut

    def kill_proc(self, proc_id: str, sig: int = signal.SIGKILL, reason: str = "",
                  injected: bool = False) -> None:
        """Send a signal to a proc through its host agent. `reason` (e.g. "killed by %mesh
        chaos") leads the cause of the failure its death makes; `injected` marks that
        failure `is_injected` (a failure caused on purpose)."""
        rec = self.state.proc(proc_id)
        if rec is None:
            raise KeyError(f"unknown proc {proc_id}")
        if reason or injected:
            def mark() -> None:  # the I/O thread, before the death can be reported
                rec.killed_by, rec.kill_injected = reason, injected
            self.state.change(mark)
        if rec.agent is not None:
            self.send(rec.agent.address, Header(Kind.KILL_PROCS, extra={
                "procs": [proc_id], "signal": int(sig)}))
        elif rec.pid:
            os.kill(rec.pid, sig)

    def kill_procs(self, proc_ids: list, reason: str, injected: bool = False) -> Future:
        """SIGKILL these procs through their host agents (`kill()` of a mesh): each one's
        failure has `reason` leading its cause. Returns a Future resolved once each death
        is known here. Refuses (ValueError) this process itself, and a proc it does not
        own."""
        recs = []
        for p in proc_ids:
            rec = self.state.proc(p)
            if rec is None and p != self.proc_id:
                raise ValueError(f"proc {p} is not one this process started: only its "
                                 "owner can kill it")
            if rec is None or rec.agent is None:
                raise ValueError(f"proc {p} runs in this process (this_proc()): killing it "
                                 "would end the controller")
            recs.append(rec)
        fut: Future = Future("kill")

        def mark() -> list:
            """The I/O thread: the procs still running, marked; each one's end awaited."""
            live = [r for r in recs if r.state in ("starting", "running")]
            for r in live:
                r.killed_by, r.kill_injected = reason, injected
                if r.exited is None:
                    r.exited = Future()
            return live

        live = self.state.change(mark)
        def all_dead() -> None:
            fut.set_result(None)

        when_all([r.exited for r in live], all_dead)
        for r in live:
            self.send(r.agent.address, Header(Kind.KILL_PROCS, extra={
                "procs": [r.proc_id], "signal": int(signal.SIGKILL)}))
        return fut

    def proc_state(self, proc_id: str) -> Optional[ProcState]:
        """State of a proc this runtime knows: "starting", "running", "failed" or "stopped";
        None for a proc it does not know."""
        rec = self.state.proc(proc_id)
        return rec.state if rec is not None else None

    def interrupt(self, proc_ids: Any, port: int = 0, cancel: bool = False) -> None:
        """Raise KeyboardInterrupt in the actors of these procs serving `port` (0: all);
        `cancel`: the call on `port` is cancelled (an async handler's task is cancelled,
        and the call is dropped if it still waits in a mailbox)."""
        extra = {"cancel": True} if cancel else None
        for p in proc_ids:
            rec = self.state.proc(p)
            if rec is not None:
                self.send_to_proc(rec.address, rec.route,
                                  Header(Kind.INTERRUPT, port=port, extra=extra))

    def table_sizes(self) -> dict[str, int]:
        """Entries in this runtime's tables (records, ports, health, sockets, actors in a
        proc): what must stay flat while meshes come and go (soak tests, bench_soak)."""
        out = self.state.sizes()
        out["ports"] = len(self.ports)
        out["health_meshes"] = len(self.health)
        out.update(self.loop.peers.sizes())
        server = getattr(self.role, "server", None)
        if server is not None:
            out.update(server.sizes())
        return out

    def meshes(self, internal: bool = False) -> list:
        """The live ProcMesh and ActorMesh objects created in this process (the runtime's
        and front-ends' own, `ProcMesh.spawn_internal`, only with `internal=True`)."""
        return self.state.live_meshes(internal)

    def register_mesh(self, obj: Any) -> None:
        """Remember a user-facing mesh object (weakly) and run the start-up hooks once."""
        self.state.register_mesh(obj)
        if not self.is_proc and not self._admin_started:
            self._admin_started = True
            try:
                start_admin_endpoint(self)
            except Exception:
                log.exception("admin endpoint did not start")

    # -- shutdown ---------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether shutdown() has begun (a closed runtime starts nothing new)."""
        return self._closed

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop every proc and agent this process started, then the I/O thread."""
        if self._closed:
            return
        self._closed = True
        local = getattr(self.role, "local_server", None)
        if local is not None:  # actors hosted in this process (this_proc()): __cleanup__ first
            local.stop()

        def stop_all() -> None:
            self.output.flush()  # aggregated output is printed before the procs go
            keeping: set = set()  # agents that keep procs of ours for a next controller
            for rec in self.state.procs.values():
                if rec.state in ("running", "starting"):
                    if rec.keep > 0 and rec.agent is not None and rec.agent.remote:
                        keeping.add(rec.agent.agent_id)  # kept: its lease starts now
                        continue
                    rec.stopping = True
                    self.send_to_proc(rec.address, rec.route, Header(Kind.STOP_PROC))
            for agent in self.state.agents.values():
                if agent.alive:
                    detach = {"detach": True} if agent.agent_id in keeping else None
                    self.send(agent.address, Header(Kind.AGENT_STOP, extra=detach))
                    agent.alive = False  # its exit (code 0) is no host failure

        try:
            self.loop.run_sync(stop_all, timeout=1.0)
        except TimeoutError:
            log.warning("shutdown: the I/O thread did not answer; stopping anyway")
        deadline = time.monotonic() + timeout
        for agent in list(self.state.agents.values()):
            p = agent.popen
            if p is None:
                continue
            try:
                p.wait(max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                try:
                    p.wait(1.0)
                except subprocess.TimeoutExpired:
                    pass
        self.loop.stop()
        self.output.writer.close(timeout=1.0)
        if self._own_rundir:
            from .. import rundir as rundirs

            rundirs.remove_dir(self.rundir)


def start_admin_endpoint(rt: "Runtime") -> None:
    """The controller's loopback admin endpoint and the debugger's requests (idempotent;
    the runtime calls it when the controller creates its first mesh)."""
    if not config.admin:
        return
    # the admin endpoint and the debugger's requests on it are above the core: via _features
    _features.call("admin.start", rt)
