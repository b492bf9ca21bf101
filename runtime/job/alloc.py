"""The job half of `%mesh alloc NAME --job KIND --hosts N --per-host procs=2 [...]`.

`parse_alloc(argv)` turns the magic's arguments into an `AllocSpec`; `spec.make_job()`
builds the Job and `spec.run()` starts it, attaches, and spawns the procs. The kernel's
magic only splits the line and calls these.
"""
from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field
from typing import Any

from .base import Job, check_meshes

KINDS = ("local", "slurm", "ssh", "kubernetes")


@dataclass
class AllocSpec:
    """What `%mesh alloc` asked for."""

    name: str
    kind: str
    hosts: int
    per_host: dict[str, int]
    options: dict[str, Any] = field(default_factory=dict)

    def make_job(self) -> Job:
        """The Job this spec describes (not started)."""
        from . import KubernetesJob, LocalJob, SlurmJob, SSHJob

        meshes = {self.name: self.hosts}
        opts = dict(self.options)
        if self.kind == "local":
            return LocalJob(meshes=meshes, **opts)
        if self.kind == "slurm":
            return SlurmJob(meshes, **opts)
        if self.kind == "ssh":
            return SSHJob(opts.pop("ssh_hosts"), meshes=meshes, **opts)
        return KubernetesJob(meshes, **opts)

    def run(self, job: Job | None = None) -> tuple[Job, Any]:
        """Start the job, attach to its agents and spawn the procs: (job, ProcMesh)."""
        job = job or self.make_job()
        host_mesh = job.state()[self.name]
        try:
            return job, host_mesh.spawn_procs(per_host=self.per_host, name=self.name)
        except BaseException:
            job.kill()
            raise


def _per_host(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in (part for group in items for part in group.split(",") if part):
        key, eq, val = item.partition("=")
        if not eq or not key.isidentifier() or not val.isdigit() or int(val) < 1:
            raise ValueError(f"--per-host takes DIM=N with N >= 1 (e.g. procs=2), got {item!r}")
        out[key] = int(val)
    return out or {"procs": 1}


def parse_alloc(args: str | list[str]) -> AllocSpec:
    """Parse `NAME --job KIND --hosts N [--per-host procs=2] [job options]`; errors name the problem."""
    argv = shlex.split(args) if isinstance(args, str) else list(args)
    ap = argparse.ArgumentParser(prog="%mesh alloc", add_help=False, exit_on_error=False)
    ap.add_argument("name")
    ap.add_argument("--job", choices=KINDS, default="local")
    ap.add_argument("--hosts", type=int, default=None)
    ap.add_argument("--per-host", nargs="+", default=[])
    ap.add_argument("--partition")
    ap.add_argument("--time", dest="time_limit")
    ap.add_argument("--account")
    ap.add_argument("--qos")
    ap.add_argument("--ssh-hosts", nargs="+")
    ap.add_argument("--image")
    ap.add_argument("--namespace")
    ap.add_argument("--timeout", type=float)
    try:
        ns, extra = ap.parse_known_args(argv)
    except (argparse.ArgumentError, SystemExit) as e:
        raise ValueError(f"%mesh alloc: {e}") from None
    if extra:
        raise ValueError(f"%mesh alloc: unknown arguments {extra}")
    hosts = ns.hosts if ns.hosts is not None else (len(ns.ssh_hosts) if ns.ssh_hosts else None)
    if hosts is None:
        raise ValueError("%mesh alloc: --hosts N is required")
    check_meshes({ns.name: hosts})
    per_host = _per_host(ns.per_host)
    allowed = {"local": {"timeout"}, "slurm": {"partition", "time_limit", "account", "qos", "timeout"},
               "ssh": {"ssh_hosts", "timeout"}, "kubernetes": {"image", "namespace", "timeout"}}[ns.job]
    given = {k: v for k, v in vars(ns).items()
             if k not in ("name", "job", "hosts", "per_host") and v is not None}
    wrong = sorted(set(given) - allowed)
    if wrong:
        raise ValueError(f"%mesh alloc: --{wrong[0].replace('_', '-')} does not apply to --job {ns.job}")
    if ns.job == "ssh" and not ns.ssh_hosts:
        raise ValueError("%mesh alloc: --job ssh needs --ssh-hosts H1 H2 ...")
    if ns.job == "ssh" and len(ns.ssh_hosts) != hosts:
        raise ValueError(f"%mesh alloc: --hosts {hosts} but {len(ns.ssh_hosts)} --ssh-hosts")
    if ns.job == "kubernetes" and not ns.image:
        raise ValueError("%mesh alloc: --job kubernetes needs --image")
    return AllocSpec(ns.name, ns.job, hosts, per_host, given)
