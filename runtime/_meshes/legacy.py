"""Monarch names kept so older Monarch programs run: the deprecated `proc_mesh(gpus=...)`
and the admin address that Monarch's examples ask the host mesh for (`_spawn_admin`)."""

from typing import Any, Callable, Optional

from ..future import Future, resolved

__all__ = ["BOOTSTRAP_ENV", "bootstrap_env", "proc_mesh", "spawn_admin"]


def _local_device_count() -> int:
    """GPUs on this machine (1 when there are none, so a CPU machine gets one proc)."""
    try:
        import torch

        return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1
    except Exception:  # noqa: BLE001 - torch missing or CUDA unusable: one proc
        return 1


#: the environment variable that carries a proc's bootstrap callable (read by runtime.proc)
BOOTSTRAP_ENV = "MONARCH_PROC_BOOTSTRAP"


def bootstrap_env(bootstrap: Optional[Callable[[], Any]]) -> dict[str, str]:
    """The proc environment that makes each proc run `bootstrap()` before its first actor."""
    if bootstrap is None:
        return {}
    if not callable(bootstrap):
        raise TypeError(f"bootstrap must be a callable taking no arguments, got {bootstrap!r}")
    import base64

    import cloudpickle

    try:
        data = cloudpickle.dumps(bootstrap)
    except Exception as e:
        raise TypeError(f"bootstrap {bootstrap!r} cannot be pickled: {e}") from None
    return {BOOTSTRAP_ENV: base64.b64encode(data).decode()}


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


def spawn_admin(rt: Any, query_engine: Any = None) -> "Future[str]":
    """The address of this controller's admin endpoint (started if it is not running), as a
    resolved Future: Monarch's `HostMesh._spawn_admin()` that its examples print."""
    from ..admin import serve

    if query_engine is not None:
        raise ValueError("_spawn_admin(query_engine=...): there is no telemetry query engine "
                         "here; the admin endpoint serves runtime.admin requests")
    address = serve(rt).address
    return resolved(address.split("://", 1)[-1])
