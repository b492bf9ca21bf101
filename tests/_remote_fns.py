"""Functions the remote-function tests name by path ('_remote_fns.scaled_add'); the procs
import this module by name."""

from __future__ import annotations

import torch

from runtime import current_rank


def scaled_add(x: torch.Tensor, y: torch.Tensor, k: float = 1.0) -> torch.Tensor:
    return x + k * y


def split_stats(x: torch.Tensor) -> dict:
    return {"mean": x.mean(dim=0), "max": x.max(dim=0).values, "n": x.shape[0]}


def fail_on_rank(x: torch.Tensor, rank: int) -> torch.Tensor:
    if current_rank().rank == rank:
        raise ValueError(f"rank {rank} refuses")
    return x * 2


def my_rank() -> int:
    return current_rank().rank
