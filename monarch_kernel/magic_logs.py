"""%mesh logs: what a mesh's procs wrote, read from their hosts' log files
(`runtime.read_logs`, `Job.logs`)."""

from __future__ import annotations

import os
from typing import Any, Optional

from IPython.core.error import UsageError

from monarch_kernel import args as margs

__all__ = ["DEFAULT_TAIL", "LogsCommands"]


#: Lines of each proc `%mesh logs` shows without --tail or --all: a page to read, not the
#: megabytes a chatty proc writes (the notebook keeps every output).
DEFAULT_TAIL = 200


class LogsCommands:
    """`%mesh logs MESH [--rank R] [--tail N | --all] [--grep PAT] [--job VAR | --hosts VAR]`."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def _where(self, a: margs.LogsArgs) -> tuple[Any, str]:
        """(what to ask: a ProcMesh, a HostMesh or a Job, the proc mesh's name)."""
        from runtime import ActorMesh, HostMesh, ProcMesh, get_runtime
        from runtime.job import Job

        if a.job is not None:
            job = self.ctx.lookup(a.job, "a Job")
            if not isinstance(job, Job):
                raise UsageError(f"%mesh logs: {a.job!r} is a {type(job).__name__}, not a Job")
            return job, a.mesh
        if a.hosts is not None:
            hosts = self.ctx.lookup(a.hosts, "a HostMesh")
            if not isinstance(hosts, HostMesh):
                raise UsageError(f"%mesh logs: {a.hosts!r} is a {type(hosts).__name__}, "
                                 "not a HostMesh")
            return hosts, a.mesh
        obj = self.ctx.ns.get(a.mesh)
        if isinstance(obj, ActorMesh) and obj.proc_mesh is not None:
            obj = obj.proc_mesh
        if isinstance(obj, ProcMesh):
            return obj.root, obj.name
        live = [m for m in get_runtime().meshes()
                if isinstance(m, ProcMesh) and m.name == a.mesh]
        if live:
            return live[0].root, a.mesh
        jobs = [v for k, v in self.ctx.ns.items()
                if isinstance(v, Job) and v.active and not k.startswith("_")]
        if len(jobs) == 1:
            return jobs[0], a.mesh
        raise UsageError(f"%mesh logs: no proc mesh {a.mesh!r} here; name the hosts that "
                         "ran it with --job VAR (a Job, e.g. after Job.load()) or --hosts VAR")

    def logs(self, a: margs.LogsArgs) -> None:
        import warnings

        from runtime import ProcMesh

        where, name = self._where(a)
        if isinstance(where, ProcMesh) and where.stopped:
            ended = self.ctx.session.ended_jobs.get(id(where))
            if ended is not None and ended[0] is where:
                print(_ended_job(name, ended[1]))
                return
        tail = None if a.all else DEFAULT_TAIL if a.tail is None else a.tail
        try:
            with warnings.catch_warnings():  # hosts that did not answer: printed below
                warnings.simplefilter("ignore")
                got = _read(where, name, a.rank, tail, a.grep)
        except ValueError as e:
            raise UsageError(f"%mesh logs: {e}") from None
        if not got and not got.errors:
            print(f"no log files of {name!r} on those hosts (file capture is on by default "
                  "for jobs; for this_host(): runtime.configure(file_capture=True))")
            return
        print(str(got))
        if got.left_out and a.tail is None:  # the default tail, not one the user asked for
            print(f"({got.left_out} earlier lines left out: the last {tail} lines of each proc "
                  "are shown; --tail N for more, --all for every line)")


def _read(where: Any, name: str, rank: Optional[int], tail: Optional[int],
          grep: Optional[str]) -> Any:
    """The ProcLogs of proc mesh `name` from `where` (a Job, ProcMesh or HostMesh)."""
    from runtime import read_logs
    from runtime.job import Job

    if isinstance(where, Job):
        return where.logs(name, rank=rank, tail=tail, grep=grep)
    return read_logs(where, name, rank=rank, tail=tail, grep=grep)


def _ended_job(name: str, job: Any) -> str:
    """Why a mesh stopped with its job has no logs to read, and where its files went."""
    logs = os.path.join(str(job.workdir), "logs") if job.workdir is not None else ""
    where = (f"its log files are still in {logs} on this machine, until the job's directory "
             "is removed" if logs and os.path.isdir(logs)
             else "its log files went with the job's directory")
    return (f"{name} was stopped with its {job.kind} job (%mesh stop), and the job's host "
            f"agents, which read the log files, ended with it: {where}. Run %mesh logs "
            "before %mesh stop to read them here.")
