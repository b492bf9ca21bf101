"""Actors for the GPU-path tests (tests/test_gpus.py, tests/test_spmd.py)."""

from __future__ import annotations

import os

from runtime import Actor, endpoint


class EnvProbe(Actor):
    """Reports the environment variables a proc was started with."""

    @endpoint
    def env(self, names: list) -> dict:
        return {n: os.environ.get(n) for n in names}


class FakeCUDATensor:
    """Pickles exactly as a staged CUDA tensor does (runtime/transport/cuda_tensors.py), so
    a machine without GPUs can test what a proc without CUDA does with one."""

    def __init__(self, n: int) -> None:
        import numpy as np

        self.arr = np.arange(n, dtype=np.float32).view(np.uint8)
        self.n = n

    def __reduce__(self):
        from runtime.transport import cuda_tensors

        return (cuda_tensors._rebuild_staged,
                (self.arr, "float32", (self.n,), False, False, f"shape ({self.n},), float32, cuda:0"))


class Taker(Actor):
    """Receives tensors and says where they arrived."""

    @endpoint
    def take(self, weights, scale: float = 1.0) -> str:
        return f"{weights.device} {float(weights.sum()) * scale}"

    @endpoint
    def make(self, n: int, cuda: bool = True):
        import torch

        t = torch.arange(n, dtype=torch.float32)
        return t.cuda() if cuda else t


class CudaProbe(Actor):
    """Counts calls of torch.cuda.is_available() in this proc (which would start the CUDA
    driver and fix CUDA_VISIBLE_DEVICES)."""

    @endpoint
    def count_is_available(self, seconds: float) -> int:
        import time

        import torch

        calls = [0]
        real = torch.cuda.is_available

        def counting() -> bool:
            calls[0] += 1
            return real()

        torch.cuda.is_available = counting
        try:
            time.sleep(seconds)
        finally:
            torch.cuda.is_available = real
        return calls[0]
