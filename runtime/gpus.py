"""One GPU per proc: which CUDA device a proc of `spawn_procs(per_host={"gpus": N})` gets.

The decision (`proc_gpu_env`) is a pure function of the proc's coordinates, the parent's
CUDA_VISIBLE_DEVICES and the host's device count; `device_count()` asks NVML (through
torch, which does not initialise CUDA for it) or `nvidia-smi -L`, never a CUDA context."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from typing import Mapping, Optional

from .config import config

__all__ = [
    "GPU_DIMS", "VISIBLE", "PARENT_VISIBLE", "GPUSpawnError", "gpu_dim", "visible_list",
    "proc_gpu_env", "device_count", "parent_visible",
]

#: per_host dimension names that mean "one proc per GPU" (Monarch's examples use both).
GPU_DIMS = ("gpus", "gpu")
VISIBLE = "CUDA_VISIBLE_DEVICES"
#: set in a proc whose GPU the runtime chose: the parent's list the choice was made from.
PARENT_VISIBLE = "RUNTIME_HOST_CUDA_VISIBLE_DEVICES"


class GPUSpawnError(ValueError):
    """per_host asks for more GPU procs than the host has GPUs (raised by spawn_procs)."""


def gpu_dim(per_host: Mapping[str, int]) -> Optional[str]:
    """The per_host dimension that assigns GPUs ("gpus" before "gpu"), or None."""
    for d in GPU_DIMS:
        if d in per_host:
            return d
    return None


def visible_list(parent_visible: Optional[str], count: int) -> list[str]:
    """The devices a parent sees: its CUDA_VISIBLE_DEVICES entries (ordinals, GPU-/MIG-
    UUIDs) in order, or 0..count-1 when unset."""
    if parent_visible is None:
        return [str(i) for i in range(count)]
    return [v.strip() for v in parent_visible.split(",") if v.strip()]


def proc_gpu_env(per_host: Mapping[str, int], coords: Mapping[str, int], *,
                 user_env: Mapping[str, str], parent_visible: Optional[str],
                 device_count: int) -> dict[str, str]:
    """The env entries that give the proc at `coords` its own GPU ({} when none apply).

    Nothing when per_host has no GPU dimension, when the user's env for the procs sets
    CUDA_VISIBLE_DEVICES, or when the host has no CUDA devices (the dimension is only a
    name). Raises GPUSpawnError when the dimension is larger than the visible devices."""
    dim = gpu_dim(per_host)
    if dim is None or VISIBLE in user_env or device_count <= 0:
        return {}
    devices = visible_list(parent_visible, device_count)
    n = per_host[dim]
    if n > len(devices):
        seen = (f"CUDA_VISIBLE_DEVICES={parent_visible!r}" if parent_visible is not None
                else f"{device_count} CUDA device(s)")
        raise GPUSpawnError(
            f"per_host={{{dim!r}: {n}}} asks for one GPU per proc but this host has {seen}; "
            f"use {dim}<={len(devices)}, or set CUDA_VISIBLE_DEVICES in spawn_procs(env=...) "
            "to place procs yourself")
    return {VISIBLE: devices[coords[dim]], PARENT_VISIBLE: ",".join(devices)}


@functools.lru_cache(maxsize=1)
def _detected_count() -> int:
    try:
        import torch

        if torch.backends.cuda.is_built():
            # NVML-based when it can be (no CUDA context, fork stays safe), as torch documents
            return int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001 - a broken CUDA install means: no GPUs for us
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def device_count() -> int:
    """CUDA devices this host has, as visible to this process (MONARCH_GPU_COUNT overrides)."""
    forced = config.gpu_count
    if forced >= 0:
        return forced
    return _detected_count()


def parent_visible() -> Optional[str]:
    """This process's CUDA_VISIBLE_DEVICES (None when unset)."""
    return os.environ.get(VISIBLE)
