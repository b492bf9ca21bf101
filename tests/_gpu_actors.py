"""Actors for the GPU-path tests (tests/test_gpus.py, tests/test_spmd.py)."""

from __future__ import annotations

import os

from runtime import Actor, endpoint


class EnvProbe(Actor):
    """Reports the environment variables a proc was started with."""

    @endpoint
    def env(self, names: list) -> dict:
        return {n: os.environ.get(n) for n in names}
