"""Clients of a job beside its owner: what a terminal (`python -m runtime.cli`) asks of the
controller that owns a job, through that controller's loopback admin endpoint.

A job has one owner (the controller its agents serve: a notebook kernel, a script). Every
job a controller attaches (`Job.state()`) is registered here, and its admin endpoint
answers `job.list`, `job.status`, `job.exec`, `job.kill` and `job.shell_open/run/close`
for it; the terminal holds
the endpoint's token (its 0600 connection file), so only this user's tools ask. The same
operations run in the terminal's own process when no live controller owns the job (it
then attaches for the command, and on exit leaves the kept procs to their lease).
`exec` runs code on procs in a small internal actor (`ExecActor`) spawned for the call
and stopped after it; what the code prints is captured per rank and sent back. `shell` keeps
a `ShellActor` on one proc for the session (its namespace), one statement per call.
"""
from __future__ import annotations

import ast
import io
import os
import socket
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Protocol

from ..actor import Actor, context, endpoint
from .trait import JobError


class OwnedJob(Protocol):
    """What the clients' operations use of a job (a `base.Job`, which registers itself
    here when it attaches): its directory, kind and meshes, whether it runs, its live proc
    meshes, and killing it."""

    kind: str
    meshes: dict[str, int]
    workdir: Path | None

    @property
    def active(self) -> bool: ...

    def proc_mesh(self, name: str, timeout: float = 30.0) -> Any: ...

    def proc_mesh_names(self, timeout: float = 30.0) -> list[str]: ...

    def kill(self) -> None: ...


_lock = threading.Lock()
_owned: dict[str, OwnedJob] = {}  # job directory -> the job this controller attached
_served: set[int] = set()  # ids of the admin servers the handlers are registered on


# -- on the procs -----------------------------------------------------------------------------

class _ThreadStreams:
    """sys.stdout / sys.stderr of a proc while `exec` runs: the exec's own thread writes to
    its buffer, every other thread to the stream as before."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._local = threading.local()

    def _target(self) -> Any:
        return getattr(self._local, "buf", None) or self._stream

    def write(self, s: str) -> int:
        return self._target().write(s)

    def flush(self) -> None:
        self._target().flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


_streams_lock = threading.Lock()


def _capture(which: str) -> _ThreadStreams:
    with _streams_lock:
        cur = getattr(sys, which)
        if not isinstance(cur, _ThreadStreams):
            cur = _ThreadStreams(cur)
            setattr(sys, which, cur)
        return cur


def _run_captured(fn: Any) -> tuple[str, str, str]:
    """Run `fn()` on this thread with what it prints captured: (stdout, stderr, traceback
    of what it raised, the user's frames only; '' when it did not)."""
    out, err = _capture("stdout"), _capture("stderr")
    obuf, ebuf = io.StringIO(), io.StringIO()
    out._local.buf, err._local.buf = obuf, ebuf
    error = ""
    try:
        fn()
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: reported, not raised
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next  # the user's frames only
        error = "".join(traceback.format_exception(type(e), e, tb))
    finally:
        out._local.buf, err._local.buf = None, None
    return obuf.getvalue(), ebuf.getvalue(), error


def _result(stdout: str, stderr: str, error: str) -> dict:
    rank = context().actor_instance.rank.rank  # its Point's flat rank in the mesh
    return {"rank": rank, "host": socket.gethostname(),
            "pid": os.getpid(), "stdout": stdout, "stderr": stderr, "error": error}


class ExecActor(Actor):
    """Runs Python code on its proc for `exec`: a fresh namespace per call; a last
    expression's value is printed (as at a prompt); output and traceback come back."""

    @endpoint
    def run(self, code: str) -> dict:
        def run() -> None:
            tree = ast.parse(code, "<exec>", "exec")
            last = tree.body[-1] if tree.body else None
            if isinstance(last, ast.Expr):
                tree.body.pop()
            else:
                last = None
            ns: dict[str, Any] = {"__name__": "__main__"}
            exec(compile(tree, "<exec>", "exec"), ns)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), "<exec>", "eval"), ns)
                if value is not None:
                    print(repr(value))

        return _result(*_run_captured(run))


class ShellActor(Actor):
    """One terminal's interactive shell on a proc (`shell --mesh M --rank R`): its
    namespace lives as long as the shell; each complete statement runs as at a Python
    prompt (compiled in 'single' mode: an expression's value is printed)."""

    def __init__(self) -> None:
        self.ns: dict[str, Any] = {"__name__": "__main__"}

    @endpoint
    def run(self, source: str) -> dict:
        return _result(*_run_captured(
            lambda: exec(compile(source, "<shell>", "single"), self.ns)))


# -- the operations (in the owner, or in a terminal that attached) ---------------------------

def _proc_meshes(job: OwnedJob) -> dict[str, Any]:
    """name -> ProcMesh of the job's live proc meshes (kept ones adopted first)."""
    return {name: job.proc_mesh(name) for name in job.proc_mesh_names()}


def find_proc_mesh(job: OwnedJob, mesh: str) -> Any:
    """The job's live proc mesh `mesh`; KeyError naming those there are."""
    meshes = _proc_meshes(job)
    if mesh not in meshes:
        raise KeyError(f"unknown mesh {mesh!r}: the job's live proc meshes are "
                       f"{sorted(meshes) or 'none'}")
    return meshes[mesh]


def exec_code(job: OwnedJob, mesh: str, code: str, rank: int | None = None,
              timeout: float = 60.0) -> list[dict]:
    """Run `code` on every proc of proc mesh `mesh` (or on flat rank `rank`): one dict per
    rank (rank, host, pid, stdout, stderr, error), by rank. KeyError for an unknown mesh,
    IndexError for a rank out of range."""
    pm = find_proc_mesh(job, mesh)
    if rank is not None:
        _check_rank(pm, mesh, rank)
    am = pm.spawn_internal("cli_exec", ExecActor)
    try:
        target = am if rank is None else am.flatten("rank").slice(rank=rank)
        values = target.run.call(code).get(timeout=timeout)
        return sorted((v for _, v in values.items()), key=lambda r: r["rank"])
    finally:
        _stop(am)  # the procs may have died under the call: reported by it


def _check_rank(pm: Any, mesh: str, rank: int) -> None:
    n = len(pm.procs)
    if not 0 <= rank < n:
        raise IndexError(f"rank {rank} is out of range: proc mesh {mesh!r} has {n} "
                         f"proc{'s' if n != 1 else ''} (ranks 0..{n - 1})")


_shells: dict[str, Any] = {}  # session id -> the ShellActor mesh (one actor) it talks to


def shell_open(job: OwnedJob, mesh: str, rank: int = 0, timeout: float = 60.0) -> dict:
    """Start a shell on flat rank `rank` of proc mesh `mesh`: a ShellActor spawned on that
    proc alone. Returns {"session", "rank", "host", "pid"}; KeyError / IndexError for an
    unknown mesh or rank."""
    import secrets

    pm = find_proc_mesh(job, mesh)
    _check_rank(pm, mesh, rank)
    sid = secrets.token_hex(8)
    am = pm.flatten("rank").slice(rank=rank).spawn_internal(f"cli_shell_{sid}", ShellActor)
    try:
        hello = am.run.call_one("None").get(timeout=timeout)
    except BaseException:
        _stop(am)
        raise
    with _lock:
        _shells[sid] = am
    return {"session": sid, "rank": rank, "host": hello["host"], "pid": hello["pid"]}


def shell_run(session: str, source: str, timeout: float = 600.0) -> dict:
    """Run one complete statement in shell `session`: {stdout, stderr, error, ...}."""
    with _lock:
        am = _shells.get(session)
    if am is None:
        raise KeyError(f"no shell session {session!r} (ended, or its owner restarted)")
    return am.run.call_one(source).get(timeout=timeout)


def shell_close(session: str) -> bool:
    """End shell `session`: its actor (and namespace) on the proc is stopped."""
    with _lock:
        am = _shells.pop(session, None)
    if am is not None:
        _stop(am)
    return am is not None


def _stop(am: Any) -> None:
    try:
        type(am).stop(am).get(timeout=30)
    except Exception:  # the proc may have died meanwhile
        pass


def status_of(job: OwnedJob) -> dict:
    """What `status` prints: the job, its proc meshes (procs, states, actors), lost calls."""
    meshes = []
    lost = []
    for name, pm in sorted(_proc_meshes(job).items()):
        procs = [{"rank": p.rank, "host": p.host, "pid": p.pid, "state": p.state}
                 for p in pm.procs]
        actors = [n for n in pm.actor_mesh_names() if not pm.actor_mesh(n).internal]
        meshes.append({"name": name, "sizes": dict(pm.sizes), "keep": pm.keep,
                       "procs": procs, "actors": actors})
        lost += [{"mesh": c.mesh, "rank": c.rank, "endpoint": c.endpoint, "state": c.state}
                 for c in pm.lost_calls]
    return {"kind": job.kind, "workdir": str(job.workdir), "hosts": dict(job.meshes),
            "keep": float(getattr(job, "keep", 0.0) or 0.0), "proc_meshes": meshes,
            "lost_calls": lost}


# -- the owner's side ------------------------------------------------------------------------

def register_owner(job: OwnedJob) -> None:
    """`job` is attached by this controller: its admin endpoint serves the job's clients."""
    from ..config import config

    if job.workdir is None:
        return
    with _lock:
        _owned[str(job.workdir)] = job
    if not config.admin:
        return
    from ..admin import serve

    try:
        srv = serve()
    except Exception:  # no endpoint: a terminal then finds no owner, and says so
        return
    with _lock:
        if id(srv) in _served:
            return
        _served.add(id(srv))
    srv.register("job.list", _list)
    srv.register("job.status", lambda workdir: status_of(_job(workdir)))
    srv.register("job.exec", _exec)
    srv.register("job.kill", _kill)
    srv.register("job.shell_open", lambda workdir, mesh, rank=0, timeout=60.0: shell_open(
        _job(workdir), mesh, int(rank), float(timeout)))
    srv.register("job.shell_run", lambda session, source, timeout=600.0: shell_run(
        session, source, float(timeout)))
    srv.register("job.shell_close", shell_close)


def _job(workdir: str) -> OwnedJob:
    with _lock:
        job = _owned.get(str(workdir))
    if job is None or not job.active:
        raise KeyError(f"this controller does not own job {workdir!r}")
    return job


def _list() -> list[dict]:
    with _lock:
        jobs = [j for j in _owned.values() if j.active]
    return [{"workdir": str(j.workdir), "kind": j.kind, "hosts": dict(j.meshes)}
            for j in jobs]


def _exec(workdir: str, mesh: str, code: str, rank: int | None = None,
          timeout: float = 60.0) -> list[dict]:
    return exec_code(_job(workdir), mesh, code, rank, float(timeout))


def _kill(workdir: str) -> bool:
    job = _job(workdir)
    job.kill()
    with _lock:
        _owned.pop(str(workdir), None)
    return True


def owned_jobs() -> list[OwnedJob]:
    """The jobs this controller attached and has not killed."""
    with _lock:
        return [j for j in _owned.values() if j.active]


__all__ = ["ExecActor", "JobError", "OwnedJob", "ShellActor", "exec_code", "find_proc_mesh",
           "owned_jobs", "register_owner", "shell_close", "shell_open", "shell_run",
           "status_of"]
