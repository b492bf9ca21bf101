"""Procs sharing a host get a share of its CPUs as torch's intra-op threads (as torchrun
does), unless the user's environment sets OMP_NUM_THREADS."""

from __future__ import annotations

import os

import pytest

from runtime import Actor, endpoint, this_host
from runtime.host.zygote import threads_for

pytestmark = pytest.mark.timeout(120)


class Threads(Actor):
    @endpoint
    def report(self) -> tuple:
        import torch

        return os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()


def test_threads_for_shares_the_cpus():
    assert threads_for(16, 4) == 4
    assert threads_for(16, 3) == 5
    assert threads_for(2, 4) == 1
    assert threads_for(8, 0) == 8


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


@pytest.mark.skipif("OMP_NUM_THREADS" in os.environ, reason="the environment sets it")
def test_procs_sharing_a_host_split_its_cpus():
    pm = this_host().spawn_procs(per_host={"procs": 2}, name="threads")
    try:
        got = pm.spawn("t", Threads).report.call().get(timeout=60)
        want = threads_for(_cpus(), 2)
        assert set(got.values()) == {(str(want), want)}
    finally:
        pm.stop().get(timeout=30)
    one = this_host().spawn_procs(per_host={"procs": 1}, name="threads1")
    try:
        env, n = one.spawn("t", Threads).report.call_one().get(timeout=60)
        assert env is None and n >= 1  # a proc alone on its host keeps torch's default
    finally:
        one.stop().get(timeout=30)


def test_the_users_setting_wins():
    mine = 1 if threads_for(_cpus(), 2) != 1 else 2  # differs from the default share
    if mine > _cpus():
        pytest.skip("one CPU: no setting differs from the default")
    pm = this_host().spawn_procs(per_host={"procs": 2}, name="threads_env",
                                 env={"OMP_NUM_THREADS": str(mine)})
    try:
        got = pm.spawn("t", Threads).report.call().get(timeout=60)
        assert set(got.values()) == {(str(mine), mine)}
    finally:
        pm.stop().get(timeout=30)
