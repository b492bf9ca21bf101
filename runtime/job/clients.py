"""Clients of a job beside its owner: what a terminal (`python -m runtime.cli`) asks of the
controller that owns a job, through that controller's loopback admin endpoint.

A job has one owner (the controller its agents serve: a notebook kernel, a script). Every
job a controller attaches (`Job.state()`) is registered here, and its admin endpoint
answers `job.list`, `job.status`, `job.exec` and `job.kill` for it; the terminal holds
the endpoint's token (its 0600 connection file), so only this user's tools ask. The same
operations run in the terminal's own process when no live controller owns the job (it
then attaches for the command, and on exit leaves the kept procs to their lease).
`exec` runs code on procs in a small internal actor (`ExecActor`) spawned for the call
and stopped after it; what the code prints is captured per rank and sent back.
"""
from __future__ import annotations

import ast
import io
import os
import socket
import sys
import threading
import traceback
from typing import TYPE_CHECKING, Any

from ..actor import Actor, context, endpoint
from .base import JobError

if TYPE_CHECKING:
    from .base import Job

_lock = threading.Lock()
_owned: dict[str, "Job"] = {}  # job directory -> the job this controller attached
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


class ExecActor(Actor):
    """Runs Python code on its proc for `exec`: a fresh namespace per call; a last
    expression's value is printed (as at a prompt); output and traceback come back."""

    @endpoint
    def run(self, code: str) -> dict:
        out, err = _capture("stdout"), _capture("stderr")
        obuf, ebuf = io.StringIO(), io.StringIO()
        out._local.buf, err._local.buf = obuf, ebuf
        error = ""
        try:
            tree = ast.parse(code, "<exec>", "exec")
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) \
                else None
            ns: dict[str, Any] = {"__name__": "__main__"}
            exec(compile(tree, "<exec>", "exec"), ns)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), "<exec>", "eval"), ns)
                if value is not None:
                    print(repr(value))
        except BaseException as e:  # SystemExit and KeyboardInterrupt too: reported, not raised
            tb = e.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
                tb = tb.tb_next  # the user's frames only
            error = "".join(traceback.format_exception(type(e), e, tb))
        finally:
            out._local.buf, err._local.buf = None, None
        rank = context().actor_instance.rank  # a Point: its flat rank in the mesh
        return {"rank": int(getattr(rank, "rank", rank)), "host": socket.gethostname(),
                "pid": os.getpid(), "stdout": obuf.getvalue(), "stderr": ebuf.getvalue(),
                "error": error}


# -- the operations (in the owner, or in a terminal that attached) ---------------------------

def _proc_meshes(job: "Job") -> dict[str, Any]:
    """name -> ProcMesh of the job's live proc meshes (kept ones adopted first)."""
    return {name: job.proc_mesh(name) for name in job.proc_mesh_names()}


def find_proc_mesh(job: "Job", mesh: str) -> Any:
    """The job's live proc mesh `mesh`; KeyError naming those there are."""
    meshes = _proc_meshes(job)
    if mesh not in meshes:
        raise KeyError(f"unknown mesh {mesh!r}: the job's live proc meshes are "
                       f"{sorted(meshes) or 'none'}")
    return meshes[mesh]


def exec_code(job: "Job", mesh: str, code: str, rank: int | None = None,
              timeout: float = 60.0) -> list[dict]:
    """Run `code` on every proc of proc mesh `mesh` (or on flat rank `rank`): one dict per
    rank (rank, host, pid, stdout, stderr, error), by rank. KeyError for an unknown mesh,
    IndexError for a rank out of range."""
    pm = find_proc_mesh(job, mesh)
    n = len(pm.procs)
    if rank is not None and not 0 <= rank < n:
        raise IndexError(f"rank {rank} is out of range: proc mesh {mesh!r} has {n} "
                         f"proc{'s' if n != 1 else ''} (ranks 0..{n - 1})")
    am = pm.spawn_internal("cli_exec", ExecActor)
    try:
        target = am if rank is None else am.flatten("rank").slice(rank=rank)
        values = target.run.call(code).get(timeout=timeout)
        return sorted((v for _, v in values.items()), key=lambda r: r["rank"])
    finally:
        try:
            type(am).stop(am).get(timeout=30)
        except Exception:  # the procs may have died under the call: reported by it
            pass


def status_of(job: "Job") -> dict:
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

def register_owner(job: "Job") -> None:
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


def _job(workdir: str) -> "Job":
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


def owned_jobs() -> list["Job"]:
    """The jobs this controller attached and has not killed."""
    with _lock:
        return [j for j in _owned.values() if j.active]


__all__ = ["ExecActor", "JobError", "exec_code", "find_proc_mesh", "owned_jobs",
           "register_owner", "status_of"]
