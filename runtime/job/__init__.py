"""Jobs start host agents through a launcher and hand back one HostMesh per mesh name.

`LocalJob` (agents on this machine), `SlurmJob` (one batch job, one srun per host),
`SSHJob` (one ssh session per host), `KubernetesJob` (an indexed Job + headless Service).
Monarch's `monarch.job` names are here too: `ProcessJob`, `LocalJob(hosts=("a", ...))`,
`JobTrait` (the base of `Job`, with Monarch's `_create`/`_state`/`_kill` hooks for jobs
of your own), `TelemetryConfig` (accepted, no effect), `job_load`, `job_loads`, and
Monarch's SlurmJob keywords, and `set_current_job` / `load_current_job` (the job a
terminal's `python -m runtime.cli` works on).
`AllocSpec` starts a job and spawns a proc mesh on it from plain values (`%mesh alloc
NAME --job KIND` parses its arguments in `monarch_kernel` and calls it).

Layer 8 (a feature): may import every layer below (`_meshes` included); nothing below imports it.
"""
from .alloc import AllocSpec
from .base import Job, JobError, JobState, TelemetryConfig
from .trait import DEFAULT_JOB_PATH, job_load, job_loads
from .context import load_current_job, set_current_job
from .kubernetes import KubernetesJob
from .local import LocalJob
from .process import ProcessJob
from .slurm import SlurmJob
from .ssh import SSHJob
from .trait import JobTrait

__all__ = ["AllocSpec", "DEFAULT_JOB_PATH", "Job", "JobError", "JobState", "JobTrait",
           "KubernetesJob", "LocalJob", "ProcessJob", "SlurmJob", "SSHJob", "TelemetryConfig",
           "job_load", "job_loads", "load_current_job", "set_current_job"]
