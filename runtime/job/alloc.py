"""Allocate a proc mesh on a new job from plain values: what `%mesh alloc NAME --job KIND`
does once its arguments are parsed (the parsing lives in `monarch_kernel.args`).

    spec = AllocSpec("trainers", "slurm", hosts=2, per_host={"procs": 8},
                     options={"partition": "gpu"})
    job, procs = spec.run()          # start the job, attach, spawn the procs

`spec.make_job()` builds the Job without starting it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import Job, check_meshes
from .kubernetes import KubernetesJob
from .local import LocalJob
from .process import ProcessJob
from .slurm import SlurmJob
from .ssh import SSHJob

__all__ = ["KINDS", "OPTIONS", "AllocSpec", "saved_job_path"]

KINDS = ("local", "process", "slurm", "ssh", "kubernetes")

#: The options (Job keyword arguments) each kind of job takes.
OPTIONS: dict[str, frozenset[str]] = {
    "local": frozenset({"timeout"}),
    "process": frozenset({"timeout", "keep"}),
    "slurm": frozenset({"partition", "time_limit", "account", "qos", "gpus_per_node",
                        "gateway", "timeout"}),
    "ssh": frozenset({"ssh_hosts", "gateway", "timeout"}),
    "kubernetes": frozenset({"image", "namespace", "timeout"}),
}


@dataclass
class AllocSpec:
    """A proc mesh `name` on a new job of `kind` with `hosts` hosts, `per_host` procs per
    host (named dimensions), and the job's `options` (keywords of its Job class, see
    `OPTIONS`). Checked when made: a bad value raises ValueError naming it."""

    name: str
    kind: str
    hosts: int
    per_host: dict[str, int] = field(default_factory=lambda: {"procs": 1})
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"job kind {self.kind!r} is not one of {', '.join(KINDS)}")
        check_meshes({self.name: self.hosts})
        if not isinstance(self.per_host, dict) or not self.per_host:
            raise ValueError(f"per_host must be a non-empty dict of DIM -> N, got "
                             f"{self.per_host!r}")
        for dim, n in self.per_host.items():
            if not isinstance(dim, str) or not dim.isidentifier():
                raise ValueError(f"per_host dimension {dim!r} must be a Python identifier")
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"per_host[{dim!r}] must be an int >= 1, got {n!r}")
        wrong = sorted(set(self.options) - OPTIONS[self.kind])
        if wrong:
            raise ValueError(f"option {wrong[0]!r} does not apply to a {self.kind} job "
                             f"(it takes: {', '.join(sorted(OPTIONS[self.kind]))})")
        if self.kind == "ssh":
            ssh_hosts = self.options.get("ssh_hosts")
            if not ssh_hosts:
                raise ValueError("an ssh job needs options['ssh_hosts'] (the host names)")
            if len(ssh_hosts) != self.hosts:
                raise ValueError(f"hosts={self.hosts} but {len(ssh_hosts)} ssh_hosts")

    def make_job(self) -> Job:
        """The Job this spec describes (not started)."""
        meshes = {self.name: self.hosts}
        opts = dict(self.options)
        if self.kind == "local":
            return LocalJob(meshes=meshes, **opts)
        if self.kind == "process":
            return ProcessJob(meshes, **opts)
        if self.kind == "slurm":
            return SlurmJob(meshes, **opts)
        if self.kind == "ssh":
            return SSHJob(opts.pop("ssh_hosts"), meshes=meshes, **opts)
        return KubernetesJob(meshes, **opts)

    def run(self, job: Job | None = None) -> tuple[Job, Any]:
        """Start the job, attach to its agents and spawn the procs: (job, ProcMesh)."""
        job = job or self.make_job()
        host_mesh = job.state(cached_path=None)[self.name]  # agents end with this process
        try:
            procs = host_mesh.spawn_procs(per_host=self.per_host, name=self.name)
        except BaseException:
            job.kill()
            raise
        if getattr(job, "keep", 0):  # kept: saved where the next controller finds it
            job.saved_path = str(job.dump(saved_job_path(self.name)).resolve())
            from .context import set_current_job

            set_current_job(job.saved_path)  # the terminal's `runtime.cli` finds it
        return job, procs


def saved_job_path(name: str) -> Path:
    """Where `%mesh alloc NAME --job process --keep ...` saves its kept job (for
    `%mesh attach-job`): `.monarch/jobs/NAME.pkl` under the working directory."""
    return Path(".monarch") / "jobs" / f"{name}.pkl"
