"""The host agent: starts procs through the zygote, forwards their output, reports exits.

One I/O thread (the runtime's IOLoop) owns the agent's sockets and the zygote's socket; the
main thread only watches the parent process.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from typing import Any, Callable, Optional

from .._base import process as _process
from ..transport import framing
from ..transport.framing import Header, Kind
from .casts import CastRelay
from .gather import ReplyGather
from .lease import Leases
from .logfiles import AgentLogs, capture_wanted
from .output import ProcPipes
from .workspace import WorkspaceStore
from .zygote import zygote_main

__all__ = ["Agent"]

_IN, _OUT = 1, 2  # zmq.POLLIN, zmq.POLLOUT (the loop polls with zmq.Poller)

log = logging.getLogger("runtime.host")


class Agent:
    """Serves one host: spawns procs through the zygote, forwards output, reports exits."""

    def __init__(self, args: argparse.Namespace) -> None:
        # Import what every proc needs now, so the zygote (and each fork) inherits it.
        from .. import _core, proc  # noqa: F401
        from ..transport import serialization  # noqa: F401

        for optional in ("psutil", "runtime.debugging.proc_side"):
            try:
                __import__(optional)
            except ImportError:
                pass
        from ..transport import auth
        from ..transport.loop import IOLoop

        self.args = args
        self.agent_id = args.agent_id or f"agent-{os.getpid()}"
        self.own_rundir = not args.rundir  # made here: removed when the agent ends
        if not args.rundir:
            from .. import rundir

            rundir.sweep()  # what crashed agents and controllers of this user left
        self.rundir = args.rundir or auth.private_dir("agent")
        self.keys = auth.read_key_file(args.key_file) if args.key_file else auth.keys_from_env()
        if args.listen and self.keys is None:
            raise SystemExit("--listen needs a CurveZMQ key file (--key-file or MONARCH_KEY_FILE);"
                             " make one with: python -m runtime.transport.auth keygen PATH")
        from ..config import config

        self.key_file = args.key_file or config.key_file or ""
        if args.listen and self.keys is not None:  # (--listen without keys exited above)
            self.token = auth.cluster_token(self.keys)
        else:
            self.token = bytes.fromhex(args.token) if args.token else auth.new_token()
        self.owner = args.owner or ""
        self.owner_id = ""  # the attached controller's id: only its heartbeats count
        self.owner_process: tuple = (None, None, None)  # its (host, pid, start time)
        self.owner_last_seen = time.monotonic()
        self.leases = Leases(self, float(getattr(args, "keep", 0) or 0))  # kept procs
        self.procs: dict[str, ProcPipes] = {}
        self.by_pid: dict[int, str] = {}
        self.pending_spawn: dict[str, dict] = {}
        self.undelivered = 0  # messages from other hosts for procs not running here
        self.stopping = False
        self.stopped = threading.Event()  # set once shutdown has ended the procs
        self.logs = AgentLogs(getattr(args, "log_dir", None), os.getpid(), time.time())
        # fork the zygote while this process is still single-threaded
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            a.close()
            _process.die_with_parent(os.getppid())
            try:
                zygote_main(b)
            finally:
                os._exit(0)
        b.close()
        self.zygote_pid = pid
        self.zsock = a
        self.zygote_out: collections.deque = collections.deque()  # requests not yet taken
        self.loop = IOLoop(self.agent_id, self.token, self._on_message, keys=self.keys)
        self.address = self.loop.bind(f"ipc://{self.rundir}/{self.agent_id}")
        self.tcp_address = ""
        self.listen_ip = ""
        if args.listen:
            from urllib.parse import urlparse

            bound = self.loop.bind_extra(args.listen)
            self.tcp_address = getattr(args, "advertise", None) or bound
            # procs listen where controllers reach this host (loopback for an ipc worker)
            host = urlparse(self.tcp_address).hostname or ""
            if self.tcp_address.startswith("ipc://"):
                host = "127.0.0.1"
            elif host and not host[0].isdigit() and ":" not in host:  # an advertised name
                host = socket.gethostbyname(host)
            self.listen_ip = host
        self.gateway = _start_gateway(args, self.keys, self.listen_ip, self.loop)
        if args.address_file:
            tmp = args.address_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"address": self.tcp_address or self.address, "ipc": self.address,
                           "host": socket.gethostname(), "pid": os.getpid(),
                           "gateway": self.gateway.address if self.gateway else ""}, f)
            os.replace(tmp, args.address_file)
        self.gather = ReplyGather(self.address, self.loop.send, self.token, self.loop.call_soon)
        self.casts = CastRelay(self.loop, self.token, self.agent_id, self.rundir, self.gather,
                               self.tcp_address)
        self.workspace = WorkspaceStore(self.rundir, self.agent_id, self.send)
        self._handlers: dict[int, Callable[[Header, Any, list], None]] = {
            Kind.HEARTBEAT: self._on_heartbeat, Kind.SPAWN_PROCS: self._spawn,
            Kind.KILL_PROCS: self._on_kill, Kind.AGENT_ATTACH: self._attach,
            Kind.AGENT_STOP: self._on_stop, Kind.FANOUT: self.casts.on_fanout,
            Kind.REPLY: self.gather.on_reply, Kind.WORKSPACE: self.workspace.on_message,
            Kind.AGENT_QUERY: self._on_query, Kind.RELAY: self.casts.on_relay,
            Kind.DELIVER: self._on_deliver, Kind.REPLY_BATCH: self.gather.on_batch,
            Kind.RELAY_LOST: self.casts.on_relay_lost,
        }

    def run(self) -> None:
        self.loop.start()
        self.loop.call_soon(self._setup)
        self.stopped.wait()
        self.loop.stop()
        if self.own_rundir:
            from .. import rundir

            rundir.remove_dir(self.rundir)

    def _setup(self) -> None:
        self.zsock.setblocking(False)
        self.loop.watch(self.zsock.fileno(), _IN, self._on_zygote_ready)
        if self.args.parent_pid:  # readable when the process that started this agent exits
            try:
                self.parent_fd = os.pidfd_open(self.args.parent_pid)
            except OSError:
                self.shutdown("owner process died")
                return
            self.loop.add_reader(self.parent_fd,
                                 lambda: self.shutdown("owner process died"))
        from ..config import config

        self.loop.call_every(config.heartbeat_interval, self._tick)
        if self.owner:
            _watch_link(self, self.owner)
            self.send(self.owner, Header(Kind.HELLO, extra={
                "pid": os.getpid(), "host": socket.gethostname(), "address": self.address,
                "agent": True}))

    def send(self, addr: str, h: Header, body: bytes = b"") -> None:
        """Send `h` (with this agent as its sender) and `body` to `addr`; nothing if empty."""
        if addr:
            h.src = self.agent_id
            self.loop.send(addr, framing.build(self.token, h, body))

    # -- control messages (I/O thread) -----------------------------------------------------------
    def _on_message(self, h: Header, body: Any, buffers: list) -> None:
        fn = self._handlers.get(h.kind)
        if fn is None:
            log.warning("agent: unexpected message kind %s; dropped", h.kind)
            return
        fn(h, body, buffers)

    def _on_heartbeat(self, h: Header, body: Any, buffers: list) -> None:
        # a caller waiting on one of its procs; a cast tree's relays checking each other
        if _answer_for_proc(self, h) or self.casts.on_heartbeat(h):
            return
        if not self.owner_id or h.src == self.owner_id:  # not a controller taken over
            self.owner_last_seen = time.monotonic()

    def _on_kill(self, h: Header, body: Any, buffers: list) -> None:
        e = h.extra or {}
        sig = int(e.get("signal", signal.SIGKILL))
        for proc_id in e.get("procs", []):
            p = self.procs.get(proc_id)
            if p is not None:
                try:
                    os.kill(p.pid, sig)
                except ProcessLookupError:
                    pass

    def _on_stop(self, h: Header, body: Any, buffers: list) -> None:
        if self.owner_id and h.src != self.owner_id:  # a controller another took over from
            log.warning("agent: a stop from %s ignored: controller %s owns this host now",
                        h.src, self.owner_id)
            return
        if self.args.listen and framing.extra_get(h, "detach"):  # it exits; kept procs stay
            self.owner_last_seen = time.monotonic()
            self.leases.orphan("the controller detached")
        elif self.args.listen and not getattr(self.args, "exit_on_shutdown", False):
            self.kill_procs("the controller detached")
            self.leases.orphan("the controller detached")
        else:
            self.shutdown("asked to stop")

    def _on_deliver(self, h: Header, body: Any, buffers: list) -> None:
        """A message from another host for one local proc (`peers.agent_routed_peer`): passed
        on its stream, after what the same sender sent it through this agent before."""
        proc_id = framing.extra_get(h, "proc")
        if proc_id not in self.procs or not buffers:  # gone (its death is being told)
            self.undelivered += 1
            if self.undelivered <= 10 or not self.undelivered & (self.undelivered - 1):
                log.warning("agent: a message from %s for proc %r dropped: not running "
                            "here [%d so far]", h.src, proc_id, self.undelivered)
            return
        self.loop.send(f"ipc://{self.rundir}/{proc_id}", buffers)

    def _attach(self, h: Header, body: Any = None, buffers: Any = None) -> None:
        """A controller adopts this (listening) agent. While another controller is alive
        (heard within the heartbeat timeout) it is refused, unless it asks to take over;
        the previous controller's procs are ended, except kept ones (spawned with keep > 0),
        which pass to the new controller: the answer lists them."""
        from ..config import config

        e = h.extra or {}
        new_owner = e.get("owner", "")
        _watch_link(self, new_owner)
        now = time.monotonic()
        hello = {"pid": os.getpid(), "host": socket.gethostname(),
                 "address": self.tcp_address, "agent": True,
                 "attach_id": e.get("attach_id", "")}
        prev_alive = False  # the controller before: alive (taken over), or gone
        if self.owner and self.owner != new_owner:
            silent = now - self.owner_last_seen
            prev_alive = silent <= config.heartbeat_timeout and not self._owner_exited()
            if not e.get("takeover") and prev_alive:
                hello["refused"] = (
                    f"host agent {socket.gethostname()} (pid {os.getpid()}, "
                    f"{self.tcp_address}) serves another controller ({self.owner}, heard "
                    f"{silent:.1f} s ago); it counts as gone after {config.heartbeat_timeout:g}"
                    " s of silence. Pass takeover=True to take its meshes over")
                self.send(new_owner, Header(Kind.HELLO, extra=hello))
                return
            self.leases.orphan("a new controller attached")
        self.owner, self.owner_lease = new_owner, float(e.get("lease") or 0)  # via a gateway
        self.owner_id = h.src
        # who it is, to see at once that it exited when it ran on this host
        self.owner_process = (e.get("host"), e.get("pid"), e.get("start"))
        self.owner_last_seen = now
        hello.update(self.leases.adopt(new_owner, now), prev_alive=prev_alive)
        self.send(self.owner, Header(Kind.HELLO, extra=hello))

    def _owner_exited(self) -> bool:
        """Whether the controller this agent serves ran on this host and has exited (a
        restarted kernel attaches at once, not after the heartbeat timeout)."""
        host, pid, start = self.owner_process
        if host != socket.gethostname() or not isinstance(pid, int) or start is None:
            return False
        return _process.start_time(pid) != start

    def kill_procs(self, why: str, kept_too: bool = True) -> None:
        for pp in list(self.procs.values()):
            if not kept_too and self.leases.kept(pp.proc_id):
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pp.pid, signal.SIGKILL)

    def _spawn(self, h: Header, body: Any = None, buffers: Any = None) -> None:
        e = h.extra or {}
        if e.get("sub") and not self.casts.relay_spawn(h):  # a tree: the children first
            return
        owner = e.get("owner") or h.reply or self.owner
        for p in e.get("procs", []):
            if not self.casts.first_spawn(p["proc_id"]):  # sent again around a dead relay
                continue
            cfg = {
                "proc_id": p["proc_id"], "rank": p["rank"], "mesh": p["mesh"],
                "token": self.token.hex(), "rundir": self.rundir, "owner": owner,
                "agent": self.address, "host_id": self.agent_id,
                "key_file": self.key_file, "listen_ip": self.listen_ip,
                "agent_tcp": self.tcp_address if self.tcp_address.startswith("tcp://") else "",
                "workspace": self.workspace.active,  # synced code: on the proc's sys.path
            }
            keep = p.get("keep", e.get("keep"))
            self.pending_spawn[p["proc_id"]] = {
                "mesh": p["mesh"], "owner": owner, "rank": p["rank"],
                "capture": capture_wanted(p.get("env"), bool(self.args.listen)),
                "labels": e.get("labels"), "sizes": e.get("sizes"),
                "keep": float(self.leases.keep_default if keep is None else keep)
                if self.args.listen else 0.0}
            env = dict(p.get("env") or {})
            msg = {"op": "spawn", "cfg": cfg, "env": env, "cwd": e.get("cwd")}
            if p.get("gpu"):  # one GPU per proc, chosen from this host's devices
                msg["env"], msg["error"] = _with_gpu(p["gpu"], env)
            self._to_zygote(json.dumps(msg).encode())

    # -- the zygote's socket: never a blocking send on the I/O thread --------------------
    def _to_zygote(self, data: bytes) -> None:
        """Send a request to the zygote, in order; what its socket does not take now waits
        for it to be writable, while its replies are read meanwhile (it replies with
        blocking sends: an agent that waited on a send could deadlock with it)."""
        if not self.zygote_out:
            try:
                self.zsock.send(data)
                return
            except BlockingIOError:
                pass
            except OSError:  # the zygote is gone (stopping): _on_zygote reports it
                return
        self.zygote_out.append(data)
        self.loop.watch(self.zsock.fileno(), _IN | _OUT, self._on_zygote_ready)

    def _on_zygote_ready(self, events: int) -> None:
        if events & _IN:
            self._on_zygote()
        if events & _OUT:
            while self.zygote_out:
                try:
                    self.zsock.send(self.zygote_out[0])
                except BlockingIOError:
                    return
                except OSError:  # gone: _on_zygote reports it
                    self.zygote_out.clear()
                    break
                self.zygote_out.popleft()
            self.loop.watch(self.zsock.fileno(), _IN, self._on_zygote_ready)

    # -- the zygote's reports ----------------------------------------------------------------
    def _on_zygote(self) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.zsock, 1 << 16, 4)
            except BlockingIOError:
                return
            except OSError:
                data, fds = b"", []
            if not data:
                self.shutdown("zygote died")
                return
            msg = json.loads(data)
            if msg["op"] == "spawned":
                info = self.pending_spawn.pop(msg["proc_id"], {"mesh": "", "owner": self.owner})
                out_fd, err_fd = fds
                pp = ProcPipes(msg["proc_id"], msg["pid"], info["mesh"], info["owner"],
                               out_fd, err_fd, 200, self.loop, self._forward,
                               self.logs.for_proc(info, msg["pid"], self._forward))
                self.procs[pp.proc_id] = pp
                self.by_pid[pp.pid] = pp.proc_id
                self.leases.spawned(pp.proc_id, pp.pid, info)
            elif msg["op"] == "exit":
                self._on_exit(msg)

    def _on_exit(self, msg: dict) -> None:
        proc_id = self.by_pid.pop(msg["pid"], None)
        pp = self.procs.pop(proc_id, None) if proc_id else None
        if pp is None:
            return
        self.leases.exited(pp.proc_id)
        pp.finish()
        self.loop.drain_from(pp.proc_id)  # its last replies first (docs/transport.md)
        self.gather.proc_exited(pp.proc_id)
        self.loop.forget_peer(f"ipc://{self.rundir}/{pp.proc_id}")  # a send there: no redial
        if os.path.basename(pp.proc_id) == pp.proc_id:
            try:  # the proc's inbox socket file: removed now, not when the run ends
                os.unlink(os.path.join(self.rundir, pp.proc_id))
            except OSError:
                pass
        self.send(pp.owner, Header(Kind.PROC_EXIT, extra={
            "proc": pp.proc_id, "pid": pp.pid, "code": msg["code"], "signal": msg["signal"],
            "stderr": list(pp.stderr_tail)}))

    def _on_query(self, h: Header, body: Any, buffers: list) -> None:
        from .queries import answer  # on a thread of its own: files are read there

        threading.Thread(target=answer, args=(self, h), daemon=True,
                         name="agent-query").start()

    def _forward(self, owner: str, proc_id: str, stream: str, label: str, text: str) -> None:
        self.send(owner, Header(Kind.LOG, extra={"proc": proc_id, "stream": stream,
                                                  "label": label}), text.encode())

    def _tick(self) -> None:
        from ..config import config

        self.casts.check_children(config.heartbeat_interval, config.heartbeat_timeout)
        if not self.owner:
            self.leases.check()
            return
        # the procs whose process runs (not stopped, not gone): one silent meanwhile is
        # holding its GIL in C code, not dead (docs/supervision.md, "Silence and the GIL")
        running = [pp.proc_id for pp in self.procs.values() if _process.runs(pp.pid)]
        self.send(self.owner, Header(Kind.HEARTBEAT, extra={"running": running}))
        silent = time.monotonic() - self.owner_last_seen
        if silent <= (getattr(self, "owner_lease", 0) or config.heartbeat_timeout * 2):
            return
        if _owner_alive(self):  # it runs, C code holding its GIL: not gone
            return
        if self.args.listen:
            log.warning("controller %s silent for %.0f s: ending its procs", self.owner, silent)
            self.leases.orphan("controller silent")
        else:
            self.shutdown("owner silent")

    def shutdown(self, why: str) -> None:
        """Stop serving (I/O thread): end the procs and the zygote, then the loop; `why` is
        logged (SIGTERM, asked to stop, owner gone, zygote died)."""
        if self.stopping:
            return
        self.stopping = True
        for pp in list(self.procs.values()):
            try:
                os.kill(pp.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(_alive(pp.pid) for pp in self.procs.values()):
            time.sleep(0.02)
        for pp in list(self.procs.values()):
            try:
                os.kill(pp.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.kill(self.zygote_pid, signal.SIGKILL)
            os.waitpid(self.zygote_pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        self.gather.stop()
        self.stopped.set()


def _answer_for_proc(agent: Agent, h: Header) -> bool:
    """A ping from a caller waiting on one of `agent`'s procs (`runs`: its proc id), which
    cannot answer itself while C code holds its GIL: answered for it while its process runs
    (docs/supervision.md, "Silence and the GIL"). False when `h` is no such ping."""
    e = h.extra
    if not isinstance(e, dict) or "runs" not in e:
        return False
    pp = agent.procs.get(e["runs"]) if isinstance(e["runs"], str) else None
    if pp is not None and h.reply and _process.runs(pp.pid):
        agent.send(h.reply, Header(Kind.HEARTBEAT, extra={"pong": e.get("ping")}))
    return True


def _watch_link(agent: Agent, owner: str) -> None:
    """zmq's heartbeats on `agent`'s link to a controller, before anything is sent there
    (answered by the controller's zmq thread, without its GIL: `_owner_alive`)."""
    from ..config import config

    agent.loop.peers.watch_link(owner, config.heartbeat_interval, config.heartbeat_timeout)


def _owner_alive(agent: Agent) -> bool:
    """Whether `agent`'s silent controller still runs (C code holding its GIL): on this
    host, as its process says; elsewhere, as zmq's heartbeats on the link to it say (not
    through a gateway, whose link says nothing of the controller behind it)."""
    if _owner_runs(agent.owner_process, None if agent.args.listen else agent.args.parent_pid):
        return True
    return not getattr(agent, "owner_lease", 0) and agent.loop.peers.link_up(agent.owner)


def _owner_runs(owner_process: tuple, started_by: Optional[int]) -> bool:
    """Whether an agent's controller runs on this host and can run (not stopped): its
    silence is then C code holding its GIL, not a death, which the agent sees at once
    (the pidfd of `started_by`, the process that started it and owns it; `_owner_exited`
    for `owner_process`, (host, pid, start time) from its attach)."""
    host, pid, start = owner_process
    if host == socket.gethostname() and isinstance(pid, int) and start is not None:
        return _process.runs(pid, start)
    return started_by is not None and started_by > 0 and _process.runs(started_by)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False


def _with_gpu(gpu: dict, env: dict) -> tuple[dict, Optional[str]]:
    """env plus this host's choice of GPU for the proc, or the reason it cannot have one."""
    from .. import gpus

    try:
        extra = gpus.proc_gpu_env(gpu["per_host"], gpu["coords"], user_env=env,
                                  parent_visible=gpus.parent_visible(),
                                  device_count=gpus.device_count())
    except gpus.GPUSpawnError as err:
        return env, f"on host {socket.gethostname()}: {err}"
    return {**env, **extra}, None


def _start_gateway(args: Any, keys: Any, inner_ip: str, loop: Any) -> Any:
    """The gateway of `--gateway` (runtime/transport/gateway.py), started (it stops with the
    agent's loop); or None."""
    if not getattr(args, "gateway", None):
        return None
    if keys is None or not inner_ip:
        raise SystemExit("--gateway needs --listen tcp://... and the cluster key")
    from ..transport.gateway import Gateway

    gw = Gateway(keys, args.gateway, inner_ip).start()
    loop.on_close.append(gw.stop)
    return gw
