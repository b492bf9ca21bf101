"""Stacks of a proc taken from outside it with py-spy (an optional dependency: `pip install
'monarch-notebook[stacks]'`), so a proc whose GIL is held by C code (NCCL, CUDA, a stuck
extension), which cannot run the in-process dump (`rt.dump_stack`), still shows every
thread, which one holds the GIL and, on request, native frames.

The host agent runs `py-spy dump --pid P --json [--native]` against its proc
(runtime/host/queries.py, op "stacks"), bounded in time: the py-spy process is killed at
the deadline and the target gets SIGCONT, so it continues either way. Layer 1 (basics).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from .config import config

__all__ = [
    "PYSPY_ENV", "YAMA_SCOPE", "CAP_SYS_PTRACE", "StacksError", "find_py_spy", "ptrace_diagnosis",
    "run_py_spy", "ThreadStack", "ProcStacks", "threads_from", "c_call_at", "CCallWatch",
]

PYSPY_ENV = "PYSPY_BIN"
YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
CAP_SYS_PTRACE = 19


class StacksError(RuntimeError):
    """py-spy could not take the stacks: not found (`searched` lists where it looked), not
    allowed to trace the proc (the message names the setting), timed out or failed."""

    def __init__(self, message: str, searched: Optional[list[str]] = None) -> None:
        super().__init__(message)
        self.searched = list(searched or [])


def find_py_spy(explicit: Optional[str] = None) -> tuple[Optional[str], list[str]]:
    """(the py-spy executable, every place looked at): `explicit` alone when given (the
    controller's `py_spy` setting), else this process's `py_spy` setting, `PYSPY_BIN`,
    this Python environment's bin/, then each directory of PATH."""
    searched: list[str] = []
    candidates: list[str] = []
    if explicit:
        candidates.append(str(explicit))
    else:
        if config.py_spy:
            candidates.append(str(config.py_spy))
        if os.environ.get(PYSPY_ENV):
            candidates.append(os.environ[PYSPY_ENV])
        candidates.append(os.path.join(os.path.dirname(sys.executable), "py-spy"))
        candidates += [os.path.join(d or ".", "py-spy")
                       for d in os.environ.get("PATH", "").split(os.pathsep)]
    for c in candidates:
        if c in searched:
            continue
        searched.append(c)
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c, searched
    return None, searched


def _has_cap_sys_ptrace(status_path: str = "/proc/self/status") -> Optional[bool]:
    try:
        with open(status_path) as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    except (OSError, ValueError):
        return None
    return None


def ptrace_diagnosis(pid: int, scope_path: str = YAMA_SCOPE,
                     status_path: str = "/proc/self/status") -> str:
    """Why this process may not be allowed to trace `pid`, naming the setting and what to
    change (Yama's ptrace_scope at `scope_path`, CAP_SYS_PTRACE as `status_path` shows it,
    the proc's owner)."""
    parts: list[str] = []
    try:
        with open(f"/proc/{pid}/status") as f:
            tracer = next((int(ln.split()[1]) for ln in f if ln.startswith("TracerPid:")), 0)
        if tracer:
            return (f"proc {pid} is already traced by pid {tracer} (a debugger, strace or "
                    "another py-spy; a process has one tracer at a time): detach it first")
    except (OSError, ValueError, IndexError):
        pass
    cap = _has_cap_sys_ptrace(status_path)
    try:
        with open(scope_path) as f:
            scope: Optional[int] = int(f.read().strip())
    except (OSError, ValueError):
        scope = None
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
        if owner != os.getuid() and not cap:
            parts.append(f"proc {pid} belongs to uid {owner}, the host agent runs as uid "
                         f"{os.getuid()}: run them as one user")
    except OSError:
        pass
    if scope is not None:
        if scope == 1:
            parts.append(f"{scope_path} is 1 (restricted: only ancestors and declared tracers "
                         "may attach; procs declare their host agent with PR_SET_PTRACER, so "
                         "this should work unless the proc cleared it): set it to 0 with "
                         "`sysctl kernel.yama.ptrace_scope=0`, or give the agent CAP_SYS_PTRACE")
        elif scope == 2:
            parts.append(f"{scope_path} is 2 (admin only): give the host agent "
                         "CAP_SYS_PTRACE (run it as root, or `setcap cap_sys_ptrace+ep` on "
                         "py-spy), or `sysctl kernel.yama.ptrace_scope=0`")
        elif scope == 3:
            parts.append(f"{scope_path} is 3 (no attach at all, fixed until reboot): "
                         "boot with kernel.yama.ptrace_scope below 3")
    if not cap:
        parts.append("the host agent lacks CAP_SYS_PTRACE; in a container run it with "
                     "`--cap-add SYS_PTRACE` (docker) or securityContext.capabilities.add "
                     "[SYS_PTRACE] (Kubernetes)")
    if not parts:
        parts.append("ptrace was refused although ptrace_scope and CAP_SYS_PTRACE allow it; "
                     "a seccomp profile may block ptrace/process_vm_readv (docker: "
                     "--security-opt seccomp=unconfined or a profile allowing them)")
    return "; ".join(parts)


def run_py_spy(pid: int, native: bool = False, timeout: float = 10.0,
               exe: Optional[str] = None) -> dict[str, Any]:
    """`py-spy dump --pid pid --json [--native]`, bounded by `timeout` seconds: its threads
    as py-spy's JSON (a list of {thread_name, owns_gil, active, frames, ...}); raises
    StacksError (not found, not permitted, timed out, failed). The target continues after
    (SIGCONT if py-spy had to be killed while it held the target stopped)."""
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    found, searched = find_py_spy(exe)
    if found is None:
        raise StacksError("py-spy not found; looked at " + ", ".join(searched) +
                          " (pip install 'monarch-notebook[stacks]' or py-spy where the host "
                          f"agent runs, or set {PYSPY_ENV} or MONARCH_PY_SPY)", searched)
    exe = found
    cmd = [exe, "dump", "--pid", str(int(pid)), "--json"] + (["--native"] if native else [])
    deadline = time.monotonic() + timeout
    with _locks_lock:  # a process has one tracer at a time: dumps of one pid take turns
        entry = _locks.setdefault(int(pid), [threading.Lock(), 0])
        entry[1] += 1
    try:
        if not entry[0].acquire(timeout=timeout):
            raise StacksError(f"another stack dump of pid {pid} took the whole {timeout:g} s")
        try:
            return _run(cmd, int(pid), native, exe, max(0.1, deadline - time.monotonic()),
                        timeout)
        finally:
            entry[0].release()
    finally:
        with _locks_lock:
            entry[1] -= 1
            if entry[1] == 0:
                _locks.pop(int(pid), None)


_locks: dict[int, list] = {}  # pid -> [lock, users]
_locks_lock = threading.Lock()


def _run(cmd: list[str], pid: int, native: bool, exe: str, timeout: float,
         bound: float) -> dict[str, Any]:
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        _resume(pid)
        raise StacksError(f"py-spy gave no stacks of pid {pid} within {bound:g} s "
                          f"(killed; the proc was resumed)") from None
    text = err.decode("utf-8", "replace").strip()
    if p.returncode != 0:
        _resume(pid)
        first = text.splitlines()[0] if text else f"exit status {p.returncode}"
        low = text.lower()
        if "permission" in low or "operation not permitted" in low or "eperm" in low:
            raise StacksError(f"py-spy may not trace pid {pid} ({first}): "
                              + ptrace_diagnosis(pid))
        if "no such process" in low or not os.path.exists(f"/proc/{pid}"):
            raise StacksError(f"pid {pid} is gone ({first})")
        raise StacksError(f"py-spy failed on pid {pid}: {first}")
    try:
        threads = json.loads(out)
    except ValueError as e:
        raise StacksError(f"py-spy printed no JSON for pid {pid}: {e}") from None
    return {"pid": int(pid), "native": bool(native), "py_spy": exe, "threads": threads}


def _resume(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except OSError:
        pass


@dataclass
class ThreadStack:
    """One thread of a proc as py-spy saw it; frames innermost first."""

    name: str
    thread_id: int
    os_thread_id: int
    owns_gil: bool
    active: bool
    frames: list[dict[str, Any]] = field(default_factory=list)

    def format(self) -> list[str]:
        tags = ["holds the GIL" if self.owns_gil else "", "active" if self.active else "idle"]
        lines = [f"Thread {self.os_thread_id or self.thread_id} {self.name!r} "
                 f"({', '.join(t for t in tags if t)})"]
        for fr in self.frames:
            if fr.get("module"):  # a native frame (py-spy names its shared object)
                where = fr.get("short_filename") or ""
                if fr.get("line"):
                    where += f":{fr.get('line')}"
                lines.append(f"    {fr.get('name')} [native, {where}]")
            else:
                lines.append(f"    {fr.get('name')} ({fr.get('short_filename') or fr.get('filename')}"
                             f":{fr.get('line')})")
        return lines


@dataclass
class ProcStacks:
    """Every thread of one proc (`runtime.proc_stacks`), or why they could not be taken."""

    mesh: str
    rank: int
    host: str
    pid: int
    proc_id: str = ""
    native: bool = False
    threads: list[ThreadStack] = field(default_factory=list)
    error: str = ""

    @property
    def gil_holder(self) -> Optional[ThreadStack]:
        """The thread holding the GIL (None: no thread holds it, or no stacks)."""
        return next((t for t in self.threads if t.owns_gil), None)

    def __str__(self) -> str:
        head = f"== {self.mesh} rank {self.rank} (pid {self.pid}, {self.host}), py-spy" \
               + (", native frames" if self.native else "")
        if self.error:
            return f"{head}\n!! {self.error}"
        holder = self.gil_holder
        lines = [head, f"GIL held by thread {holder.name!r}" if holder
                 else "no thread holds the GIL"]
        for t in self.threads:
            lines += t.format()
        return "\n".join(lines)


def threads_from(data: dict[str, Any]) -> list[ThreadStack]:
    """py-spy's JSON threads as ThreadStack objects: the program's threads (actors, main,
    its own) first, then the runtime's and front-ends' helpers (named `monarch-*`: I/O,
    fault hook, the jedi warm-up of %%mesh completion), each in py-spy's order."""
    threads = [ThreadStack(str(t.get("thread_name") or ""), int(t.get("thread_id") or 0),
                           int(t.get("os_thread_id") or 0), bool(t.get("owns_gil")),
                           bool(t.get("active")), list(t.get("frames") or []))
               for t in data.get("threads", [])]
    return sorted(threads, key=lambda t: t.name.startswith("monarch-"))


# -- a thread blocked inside a C call (the diagnosis, from inside the proc) ------------------
#: what a C function's name says the thread waits on
_C_KINDS = (
    ("a sleep", ("sleep", "usleep", "nanosleep")),
    ("a lock", ("acquire", "wait", "join", "lock", "wait_for", "barrier")),
    ("I/O", ("recv", "recv_into", "recvfrom", "recvmsg", "read", "readinto", "readline",
             "readlines", "accept", "connect", "send", "sendall", "sendto", "select", "poll",
             "epoll", "write", "input", "getaddrinfo", "urlopen", "communicate")),
)
#: a thread counts as blocked when its CPU time grew by less than this share of the wall time
_IDLE_CPU_SHARE = 0.2


def _calls_of(code: Any, cache: dict = {}) -> dict:  # noqa: B006 - a cache by code object
    """{offset of each call instruction in `code`: its source position (line, end line,
    column, end column; Nones where unknown)}."""
    got = cache.get(code)
    if got is None:
        import dis

        positions = list(code.co_positions()) if hasattr(code, "co_positions") else []
        got = {}
        for ins in dis.get_instructions(code):
            if ins.opname.startswith("CALL"):
                i = ins.offset // 2
                got[ins.offset] = positions[i] if i < len(positions) else (None,) * 4
        if len(cache) > 512:
            cache.clear()
        cache[code] = got
    return got


def _callee(text: str) -> str:
    """The name a call expression calls: `sock.recv(10)` -> `recv`; "" if not one call."""
    import ast

    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return ""
    if not isinstance(node, ast.Call):
        return ""
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def c_call_at(frame: Any) -> Optional[dict]:
    """If `frame`, a thread's innermost Python frame, stands at a call instruction, the
    thread runs a C function called there (a Python callee would have a frame of its own):
    {"call": the call's source, "fn": the name called, "kind": "a sleep" / "a lock" / "I/O" /
    "C code", "where": "FILE:LINE in FUNC()"}; None when it runs Python code."""
    import linecache

    code = frame.f_code
    pos = _calls_of(code).get(frame.f_lasti)
    if pos is None:
        return None
    lineno = frame.f_lineno
    line = linecache.getline(code.co_filename, lineno)
    call = line.strip()
    first, last, col, end = pos
    if first is not None and first == last == lineno and col is not None and end is not None:
        call = line[col:end]  # just the call expression (ASCII columns: near enough)
    fn = _callee(call)
    kind = next((k for k, names in _C_KINDS if fn in names), "C code")
    out = {"call": call or "a C function", "fn": fn, "kind": kind,
           "where": f"{code.co_filename}:{lineno} in {code.co_name}()"}
    if _library(code.co_filename):  # name the user's line that led there, too
        f = frame.f_back
        while f is not None and _library(f.f_code.co_filename):
            f = f.f_back
        if f is not None:
            src = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
            out["from"] = (f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}()"
                           + (f": {src}" if src else ""))
    return out


_LIB_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (os, json) if m.__file__)
_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _library(filename: str) -> bool:
    """Whether `filename` is the standard library's, an installed package's or runtime's
    (not the user's code)."""
    return (filename.startswith(_LIB_DIRS) or filename.startswith(_RUNTIME_DIR)
            or "site-packages" in filename or filename.startswith("<frozen"))


def _thread_cpu(ident: int) -> Optional[float]:
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(ident))
    except (AttributeError, OSError, OverflowError):
        return None


class CCallWatch:
    """One thread's C calls seen across samples (a heartbeat each): a call is reported once
    two samples found the thread at the same call of the same frame and its CPU time did
    not grow meanwhile (blocked: a sleep, a lock, I/O; a thread busy in C, or Python calling
    one C function in a loop, is not reported)."""

    __slots__ = ("key", "wall", "cpu", "info")

    def __init__(self) -> None:
        self.key: Any = None
        self.wall = 0.0
        self.cpu: Optional[float] = None
        self.info: Optional[dict] = None

    def sample(self, ident: Optional[int], epoch: Any = None) -> Optional[dict]:
        """The C call thread `ident` has been blocked inside since the previous sample or
        before (`c_call_at`'s dict plus "since", the wall time first seen, and "thread",
        the ident), or None. `epoch` (the handler's start) tells two calls apart that
        block at the same place (a frame's id may be reused)."""
        frame = sys._current_frames().get(ident) if ident is not None else None
        info = c_call_at(frame) if frame is not None else None
        if info is None or frame is None or ident is None:  # (a frame only with an ident)
            self.key = self.info = None
            return None
        key = (id(frame), frame.f_code, frame.f_lasti, epoch)
        now, cpu = time.time(), _thread_cpu(ident)
        if key != self.key:
            self.key, self.wall, self.cpu, self.info = key, now, cpu, info
            return None
        if cpu is not None and self.cpu is not None and \
                cpu - self.cpu > _IDLE_CPU_SHARE * max(1e-3, now - self.wall):
            return None  # its CPU time grew: running (maybe Python calling it in a loop)
        return dict(self.info or info, since=self.wall, thread=ident)
