"""The host agent: starts, watches and reaps the procs of one host.

`python -m runtime.host --owner ADDR --token HEX --rundir DIR` is started by a controller
for its local host; `python -m runtime.host --listen tcp://ADDR:PORT --key-file F` serves a
host for controllers that attach over the network (CurveZMQ).

At start the agent forks a single-threaded *zygote* with the runtime already imported; procs
are forked from it, which makes spawning fast. The agent holds the read ends of every proc's
stdout/stderr pipes: it forwards output to the proc's owner and keeps the last lines of
stderr for failure reports, and it reports every exit with its code or signal.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import select
import signal
import socket
import sys
import time
from typing import Any, Optional

from . import _process, logs
from .transport.framing import Header, Kind

log = logging.getLogger("runtime.host")

# --------------------------------------------------------------------------------------------
# zygote (runs in a forked child; single-threaded; never touches zmq)
# --------------------------------------------------------------------------------------------


def _zygote_main(sock: socket.socket) -> None:
    _process.set_process_name("monarch-zygote")
    rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wfd)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    children: set[int] = set()

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            children.discard(pid)
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            try:
                sock.send(json.dumps({"op": "exit", "pid": pid, "code": code,
                                      "signal": sig}).encode())
            except OSError:
                pass

    while True:
        try:
            r, _, _ = select.select([sock, rfd], [], [], 1.0)
        except InterruptedError:
            continue
        if rfd in r:
            try:
                while os.read(rfd, 512):
                    pass
            except BlockingIOError:
                pass
        reap()
        if sock not in r:
            continue
        try:
            data = sock.recv(1 << 20)
        except OSError:
            data = b""
        if not data:  # the agent is gone
            for pid in list(children):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os._exit(0)
        msg = json.loads(data)
        if msg["op"] == "spawn":
            pid, out_r, err_r = _fork_proc(sock, rfd, wfd, msg)
            children.add(pid)
            socket.send_fds(sock, [json.dumps({"op": "spawned", "proc_id": msg["cfg"]["proc_id"],
                                               "pid": pid}).encode()], [out_r, err_r])
            os.close(out_r)
            os.close(err_r)
        elif msg["op"] == "quit":
            os._exit(0)


def _fork_proc(sock: socket.socket, rfd: int, wfd: int, msg: dict) -> tuple[int, int, int]:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    zygote_pid = os.getpid()
    pid = os.fork()
    if pid == 0:  # the proc
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            sock.close()
            os.close(rfd)
            os.close(wfd)
            os.close(out_r)
            os.close(err_r)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.close(out_w)
            os.close(err_w)
            _process.die_with_parent(zygote_pid)
            _process.set_process_name("monarch-proc")
            os.environ.update(msg.get("env") or {})
            cwd = msg.get("cwd")
            if cwd:
                try:
                    os.chdir(cwd)
                except OSError:
                    pass
            from . import proc

            proc.main(msg["cfg"])
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
        finally:
            os._exit(1)
    os.close(out_w)
    os.close(err_w)
    return pid, out_r, err_r


# --------------------------------------------------------------------------------------------
# agent
# --------------------------------------------------------------------------------------------


class _ProcPipes:
    def __init__(self, proc_id: str, pid: int, mesh: str, owner: str, out_fd: int,
                 err_fd: int, tail_lines: int) -> None:
        self.proc_id = proc_id
        self.pid = pid
        self.owner = owner
        self.fds = {out_fd: "stdout", err_fd: "stderr"}
        self.splitters = {"stdout": logs.LineSplitter(mesh), "stderr": logs.LineSplitter(mesh)}
        self.stderr_tail: collections.deque = collections.deque(maxlen=tail_lines)
        self.flush_scheduled = False


class Agent:
    """Serves one host: spawns procs through the zygote, forwards output, reports exits."""

    def __init__(self, args: argparse.Namespace) -> None:
        # Import what every proc needs now, so the zygote (and each fork) inherits it.
        from . import proc  # noqa: F401
        from .core import Runtime  # noqa: F401
        from .transport import serialization  # noqa: F401

        for optional in ("psutil", "runtime.debugging.proc_side"):
            try:
                __import__(optional)
            except ImportError:
                pass
        from .transport import auth
        from .transport.loop import IOLoop

        self.args = args
        self.agent_id = args.agent_id or f"agent-{os.getpid()}"
        self.rundir = args.rundir or auth.private_dir("monarch-agent-")
        self.keys = auth.read_key_file(args.key_file) if args.key_file else auth.keys_from_env()
        if args.listen and self.keys is None:
            raise SystemExit("--listen needs a CurveZMQ key file (--key-file or MONARCH_KEY_FILE);"
                             " make one with: python -m runtime.transport.auth keygen PATH")
        self.key_file = args.key_file or os.environ.get("MONARCH_KEY_FILE", "")
        if args.listen:
            self.token = auth.cluster_token(self.keys)
        else:
            self.token = bytes.fromhex(args.token) if args.token else auth.new_token()
        self.owner = args.owner or ""
        self.owner_last_seen = time.monotonic()
        self.procs: dict[str, _ProcPipes] = {}
        self.by_pid: dict[int, str] = {}
        self.pending_spawn: dict[str, dict] = {}
        self.stopping = False
        # fork the zygote while this process is still single-threaded
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            a.close()
            _process.die_with_parent(os.getppid())
            try:
                _zygote_main(b)
            finally:
                os._exit(0)
        b.close()
        self.zygote_pid = pid
        self.zsock = a
        self.loop = IOLoop(self.agent_id, self.token, self._on_message, keys=self.keys)
        self.address = self.loop.bind(f"ipc://{self.rundir}/{self.agent_id}")
        self.tcp_address = ""
        self.listen_ip = ""
        if args.listen:
            self.tcp_address = self.loop.bind_extra(args.listen)
            from urllib.parse import urlparse

            self.listen_ip = urlparse(self.tcp_address).hostname or ""
        if args.address_file:
            tmp = args.address_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"address": self.tcp_address or self.address, "ipc": self.address,
                           "host": socket.gethostname(), "pid": os.getpid()}, f)
            os.replace(tmp, args.address_file)

    def run(self) -> None:
        self.loop.start()
        self.loop.call_soon(self._setup)
        while not self.stopping:
            time.sleep(0.2)
            if self.args.parent_pid and os.getppid() != self.args.parent_pid:
                self._shutdown("owner process died")
        self.loop.stop()

    def _setup(self) -> None:
        self.zsock.setblocking(False)
        self.loop.add_reader(self.zsock.fileno(), self._on_zygote)
        self.loop.call_every(0.25, self._tick)
        if self.owner:
            self.loop.send(self.owner, self._frames(Header(
                Kind.HELLO, extra={"pid": os.getpid(), "host": socket.gethostname(),
                                   "address": self.address, "agent": True})))

    def _frames(self, h: Header, body: bytes = b"") -> list:
        from .transport import framing

        h.src = self.agent_id
        return framing.build(self.token, h, body)

    def _send(self, addr: str, h: Header, body: bytes = b"") -> None:
        if addr:
            self.loop.send(addr, self._frames(h, body))

    # -- control messages -----------------------------------------------------------------------
    def _on_message(self, h: Header, body: Any, buffers: list) -> None:
        k = h.kind
        if k == Kind.HEARTBEAT:
            self.owner_last_seen = time.monotonic()
        elif k == Kind.SPAWN_PROCS:
            self._spawn(h)
        elif k == Kind.KILL_PROCS:
            e = h.extra or {}
            sig = int(e.get("signal", signal.SIGKILL))
            for proc_id in e.get("procs", []):
                p = self.procs.get(proc_id)
                if p is not None:
                    try:
                        os.kill(p.pid, sig)
                    except ProcessLookupError:
                        pass
        elif k == Kind.AGENT_ATTACH:
            self._attach(h)
        elif k == Kind.AGENT_STOP:
            if self.args.listen:
                self._kill_procs("the controller detached")
                self.owner = ""
            else:
                self._shutdown("asked to stop")
        elif k == Kind.FANOUT:
            e = h.extra or {}
            from .transport import framing

            inner = framing.decode_header(bytes(e["header"]) if not isinstance(e["header"], bytes)
                                          else e["header"])
            data = framing.encode_header(inner)
            for proc_id in e.get("procs", []):
                self.loop.send(f"ipc://{self.rundir}/{proc_id}", [self.token, data, body, *buffers])
        else:
            log.warning("agent: unexpected message kind %s; dropped", h.kind)

    def _attach(self, h: Header) -> None:
        """A controller adopts this (listening) agent; a previous owner's procs are ended."""
        e = h.extra or {}
        new_owner = e.get("owner", "")
        if self.owner and self.owner != new_owner:
            self._kill_procs("a new controller attached")
        self.owner = new_owner
        self.owner_last_seen = time.monotonic()
        self._send(self.owner, Header(Kind.HELLO, extra={
            "pid": os.getpid(), "host": socket.gethostname(), "address": self.tcp_address,
            "agent": True, "attach_id": e.get("attach_id", "")}))

    def _kill_procs(self, why: str) -> None:
        for pp in list(self.procs.values()):
            try:
                os.kill(pp.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _spawn(self, h: Header) -> None:
        e = h.extra or {}
        owner = e.get("owner") or h.reply or self.owner
        for p in e.get("procs", []):
            cfg = {
                "proc_id": p["proc_id"], "rank": p["rank"], "mesh": p["mesh"],
                "token": self.token.hex(), "rundir": self.rundir, "owner": owner,
                "agent": self.address, "host_id": self.agent_id,
                "key_file": self.key_file, "listen_ip": self.listen_ip,
            }
            self.pending_spawn[p["proc_id"]] = {"mesh": p["mesh"], "owner": owner}
            msg = {"op": "spawn", "cfg": cfg, "env": p.get("env") or {}, "cwd": e.get("cwd")}
            self.zsock.setblocking(True)
            try:
                self.zsock.send(json.dumps(msg).encode())
            finally:
                self.zsock.setblocking(False)

    def _on_zygote(self) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.zsock, 1 << 16, 4)
            except BlockingIOError:
                return
            except OSError:
                data, fds = b"", []
            if not data:
                self._shutdown("zygote died")
                return
            msg = json.loads(data)
            if msg["op"] == "spawned":
                info = self.pending_spawn.pop(msg["proc_id"], {"mesh": "", "owner": self.owner})
                out_fd, err_fd = fds
                os.set_blocking(out_fd, False)
                os.set_blocking(err_fd, False)
                pp = _ProcPipes(msg["proc_id"], msg["pid"], info["mesh"], info["owner"],
                                out_fd, err_fd, 200)
                self.procs[pp.proc_id] = pp
                self.by_pid[pp.pid] = pp.proc_id
                for fd in (out_fd, err_fd):
                    self.loop.add_reader(fd, lambda fd=fd, pp=pp: self._read(pp, fd))
            elif msg["op"] == "exit":
                proc_id = self.by_pid.pop(msg["pid"], None)
                pp = self.procs.pop(proc_id, None) if proc_id else None
                if pp is None:
                    continue
                for fd in list(pp.fds):
                    self._read(pp, fd, final=True)
                self._flush(pp)
                self._send(pp.owner, Header(Kind.PROC_EXIT, extra={
                    "proc": pp.proc_id, "pid": pp.pid, "code": msg["code"],
                    "signal": msg["signal"], "stderr": list(pp.stderr_tail)}))

    def _read(self, pp: _ProcPipes, fd: int, final: bool = False) -> None:
        stream = pp.fds.get(fd)
        if stream is None:
            return
        chunks = []
        eof = False
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError:
                eof = True
                break
            if not data:
                eof = True
                break
            chunks.append(data)
            if not final and len(chunks) > 16:
                break
        if chunks:
            self._forward(pp, stream, pp.splitters[stream].feed(b"".join(chunks)))
            if pp.splitters[stream].pending() and not pp.flush_scheduled:
                pp.flush_scheduled = True
                self.loop.call_later(0.1, self._flush, pp)
        if eof or final:
            if eof:
                self.loop.remove_reader(fd)
                pp.fds.pop(fd, None)
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _flush(self, pp: _ProcPipes) -> None:
        pp.flush_scheduled = False
        for stream, sp in pp.splitters.items():
            self._forward(pp, stream, sp.flush())
        if not pp.fds or pp.proc_id not in self.procs:
            for fd in list(pp.fds):
                self.loop.remove_reader(fd)
                try:
                    os.close(fd)
                except OSError:
                    pass
            pp.fds.clear()

    def _forward(self, pp: _ProcPipes, stream: str, parts: list) -> None:
        for label, text in parts:
            if stream == "stderr":
                pp.stderr_tail.extend(ln for ln in text.splitlines()
                                      if not ln.startswith(logs.CONTROL_MARK))
            self._send(pp.owner, Header(Kind.LOG, extra={"proc": pp.proc_id, "stream": stream,
                                                         "label": label}), text.encode())

    def _tick(self) -> None:
        from .config import config

        if self.owner:
            self._send(self.owner, Header(Kind.HEARTBEAT))
            silent = time.monotonic() - self.owner_last_seen
            if self.args.listen:
                if silent > max(config.heartbeat_timeout, 5.0) * 2:
                    log.warning("controller %s silent for %.0f s: ending its procs", self.owner,
                                silent)
                    self._kill_procs("owner silent")
                    self.owner = ""
            elif silent > max(config.heartbeat_timeout, 5.0) * 2:
                self._shutdown("owner silent")

    def _shutdown(self, why: str) -> None:
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


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m runtime.host",
                                description="Serve one host: spawn and watch procs.")
    p.add_argument("--owner", help="address of the controller that owns this agent")
    p.add_argument("--token", help="session token (hex); default MONARCH_TOKEN or random")
    p.add_argument("--rundir", help="private directory for ipc sockets")
    p.add_argument("--agent-id")
    p.add_argument("--listen", help="also listen on tcp://ADDR:PORT (CurveZMQ required "
                                    "unless loopback)")
    p.add_argument("--key-file", help="CurveZMQ key file (mode 600); default MONARCH_KEY_FILE")
    p.add_argument("--address-file", help="write the bound address here (JSON)")
    p.add_argument("--parent-pid", type=int, default=0,
                   help="exit when this parent process dies")
    args = p.parse_args(argv)
    if not args.token:
        args.token = os.environ.get("MONARCH_TOKEN", "")
    if args.parent_pid:
        _process.die_with_parent(args.parent_pid)
    _process.set_process_name("monarch-agent")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s agent: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    agent = Agent(args)
    signal.signal(signal.SIGTERM, lambda *_: agent.loop.call_soon(agent._shutdown, "SIGTERM"))
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
