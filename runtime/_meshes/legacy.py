"""Monarch names kept so older Monarch programs run: the deprecated `proc_mesh(gpus=...)`
(the admin address that Monarch's examples ask the host mesh for is `HostMesh._spawn_admin`)."""

from typing import Any, Callable, Optional

__all__ = ["proc_mesh"]


def _local_device_count() -> int:
    """GPUs on this machine (1 when there are none, so a CPU machine gets one proc)."""
    try:
        import torch

        return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1
    except Exception:  # noqa: BLE001 - torch missing or CUDA unusable: one proc
        return 1


def proc_mesh(*, gpus: Optional[int] = None, hosts: int = 1,
              env: Optional[dict[str, str]] = None,
              setup: Optional[Callable[[], None]] = None) -> Any:
    """Monarch's deprecated `proc_mesh(gpus=N)`: N procs on this machine, in a mesh with
    Monarch's dims `{'hosts': 1, 'gpus': N}`; `env` is set in every proc and `setup()` runs
    in each before its actors. Prefer `this_host().spawn_procs(per_host={'gpus': N})`."""
    from .host_mesh import this_host

    if hosts != 1:
        raise ValueError(f"proc_mesh(hosts={hosts!r}): only hosts=1 (this machine) is "
                         "provided; for several hosts use a job, e.g. "
                         "runtime.job.ProcessJob({'hosts': N}).state().hosts.spawn_procs(...)")
    if gpus is None:
        gpus = _local_device_count()
    return this_host().spawn_procs(per_host={"hosts": 1, "gpus": gpus}, env=env,
                                   bootstrap=setup)
