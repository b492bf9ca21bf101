"""Jobs start host agents through a launcher and hand back one HostMesh per mesh name.

`LocalJob` (agents on this machine), `SlurmJob` (one batch job, one srun per host),
`SSHJob` (one ssh session per host), `KubernetesJob` (an indexed Job + headless Service).
"""
from .base import Job, JobError, JobState
from .kubernetes import KubernetesJob
from .local import LocalJob
from .slurm import SlurmJob
from .ssh import SSHJob

__all__ = ["Job", "JobError", "JobState", "LocalJob", "SlurmJob", "SSHJob", "KubernetesJob"]
