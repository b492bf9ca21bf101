"""%mesh logs: what a mesh's procs wrote, read from their hosts' log files
(`runtime.read_logs`, `Job.logs`)."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError

from monarch_kernel import args as margs


class LogsCommands:
    """`%mesh logs MESH [--rank R] [--tail N] [--grep PAT] [--job VAR | --hosts VAR]`."""

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
        from runtime import read_logs
        from runtime.job import Job

        where, name = self._where(a)
        try:
            if isinstance(where, Job):
                got = where.logs(name, rank=a.rank, tail=a.tail, grep=a.grep)
            else:
                got = read_logs(where, name, rank=a.rank, tail=a.tail, grep=a.grep)
        except ValueError as e:
            raise UsageError(f"%mesh logs: {e}") from None
        if not got and not got.errors:
            print(f"no log files of {name!r} on those hosts (file capture is on by default "
                  "for jobs; for this_host(): runtime.configure(file_capture=True))")
            return
        print(str(got))
