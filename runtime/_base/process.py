"""Process plumbing: die with the parent (PR_SET_PDEATHSIG) and small helpers."""

from __future__ import annotations

import ctypes
import os
import signal
import socket

__all__ = [
    "PR_SET_PDEATHSIG", "PR_SET_NAME", "PR_SET_PTRACER", "die_with_parent", "allow_tracer",
    "set_process_name", "hostname", "describe_status", "start_time", "runs",
]

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_SET_PTRACER = 0x59616D61  # Yama: 'Yama'


def die_with_parent(expected_ppid: int | None = None, sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` when the parent thread dies; exit if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if expected_ppid is not None and os.getppid() != expected_ppid:
        os._exit(1)


def allow_tracer(pid: int) -> bool:
    """Declare `pid` (and its descendants) this process's tracer for Yama's
    ptrace_scope=1, so the host agent's py-spy may read a proc's stacks (True if the
    kernel took it; False without Yama, where same-user tracing needs no declaration)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PTRACER, int(pid), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def set_process_name(name: str) -> None:
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def hostname() -> str:
    return socket.gethostname()


def describe_status(code: int | None, sig: int | None) -> str:
    if sig:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name}"
    return f"exited with code {code}"


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), None when it is gone or a zombie; with
    the pid it names one process, even after the pid is reused."""
    fields = _stat(pid)
    return None if fields is None or fields[0] == "Z" else int(fields[19])


#: /proc states of a process that cannot run: stopped by a signal (SIGSTOP, Ctrl-Z), a
#: zombie, dead. A tracing stop (`t`: py-spy reading stacks, a debugger) is not among them.
_NOT_RUNNING = frozenset("TZXx")


def runs(pid: int, start: int | None = None) -> bool:
    """Whether `pid` (started at `start`, from `start_time`, when given) exists and can run:
    not stopped, not a zombie. Such a process may still send nothing for a while (C code
    holding its GIL); one that is stopped or gone will not."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in _NOT_RUNNING and \
        (start is None or int(fields[19]) == start)
