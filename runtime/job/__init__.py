"""Jobs start host agents through a launcher and hand back one HostMesh per mesh name.

`LocalJob` (agents on this machine), `SlurmJob` (one batch job, one srun per host),
`SSHJob` (one ssh session per host), `KubernetesJob` (an indexed Job + headless Service).
`AllocSpec` starts a job and spawns a proc mesh on it from plain values (`%mesh alloc
NAME --job KIND` parses its arguments in `monarch_kernel` and calls it).
"""
from .alloc import AllocSpec
from .base import Job, JobError, JobState
from .kubernetes import KubernetesJob
from .local import LocalJob
from .slurm import SlurmJob
from .ssh import SSHJob

__all__ = ["AllocSpec", "Job", "JobError", "JobState", "LocalJob", "SlurmJob", "SSHJob", "KubernetesJob"]
