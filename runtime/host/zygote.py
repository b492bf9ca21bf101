"""The zygote: a single-threaded process, forked from the host agent with the runtime
already imported, that forks procs on request and reports their exits.

It never touches zmq. Each proc's stdout and stderr are pipes whose read ends go back to
the agent (SCM_RIGHTS), so output written from C code is forwarded too.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket

from .._base import process as _process

__all__ = ["PROCS_PER_HOST", "threads_for", "zygote_main", "fork_proc"]


#: set by spawn_procs in the env of procs: how many procs of the mesh share this host
PROCS_PER_HOST = "RUNTIME_PROCS_PER_HOST"


def threads_for(cpus: int, procs_per_host: int) -> int:
    """Intra-op threads per proc when `procs_per_host` procs share `cpus` CPUs (as torchrun:
    no oversubscription, at least one)."""
    return max(1, cpus // max(1, procs_per_host))


def _default_threads() -> None:
    """OMP_NUM_THREADS for a proc that shares its host with other procs of its mesh, unless
    the user's environment sets it: torch's default (every core in every proc) makes small
    ops spin on each other's cores."""
    n = os.environ.get(PROCS_PER_HOST)
    if not n or "OMP_NUM_THREADS" in os.environ or "MONARCH_PROC_BIND" in os.environ:
        return  # set by the user, or the proc is pinned to CPUs of its own (proc_bind)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    os.environ["OMP_NUM_THREADS"] = str(threads_for(cpus, int(n)))


def zygote_main(sock: socket.socket) -> None:
    """Serve spawn requests from the agent on `sock` until it closes (then kill children)."""
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
            r, _, _ = select.select([sock.fileno(), rfd], [], [], 1.0)
        except InterruptedError:
            continue
        if rfd in r:
            try:
                while os.read(rfd, 512):
                    pass
            except BlockingIOError:
                pass
        reap()
        if sock.fileno() not in r:
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
            pid, out_r, err_r = fork_proc(sock, rfd, wfd, msg)
            children.add(pid)
            socket.send_fds(sock, [json.dumps({"op": "spawned", "proc_id": msg["cfg"]["proc_id"],
                                               "pid": pid}).encode()], [out_r, err_r])
            os.close(out_r)
            os.close(err_r)
        elif msg["op"] == "quit":
            os._exit(0)


def fork_proc(sock: socket.socket, rfd: int, wfd: int, msg: dict) -> tuple[int, int, int]:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    zygote_pid, agent_pid = os.getpid(), os.getppid()
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
            _process.allow_tracer(agent_pid)  # its py-spy under ptrace_scope=1 (stacks)
            _process.set_process_name("monarch-proc")
            if msg.get("error"):  # the agent could not prepare this proc: fail it loudly
                raise RuntimeError(msg["error"])
            os.environ.update(msg.get("env") or {})
            _default_threads()
            from ..config import config

            config.reload()  # settings the spawn request carries (configure() in the owner)
            from .. import timeline

            timeline.reset()  # a ring of the configured size (timeline_records)
            cwd = msg.get("cwd")
            if cwd:
                try:
                    os.chdir(cwd)
                except OSError:
                    pass
            from .. import proc

            proc.main(msg["cfg"])
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
        finally:
            os._exit(1)
    os.close(out_w)
    os.close(err_w)
    return pid, out_r, err_r
