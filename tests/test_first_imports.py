"""Actors spawned at once on a fresh proc each unpickle their class and arguments on their
own thread; the first import of torch that this triggers must not happen on two threads at
once (torch's circular imports then fail: "partially initialized module"), as it did for
Monarch's grpo_actor.py example, whose four actors share one proc."""

from __future__ import annotations

import pytest
import torch
from torch.distributions import Categorical
from torch.nn.parameter import Parameter
from torch.optim import Adam

from runtime import Actor, endpoint, this_host

pytestmark = pytest.mark.timeout(120)


def _classes() -> list:
    """Classes made here travel by value: each makes the proc import another part of torch
    (by reference, the proc would import this test module once, with torch, first)."""

    class UsesCategorical(Actor):
        @endpoint
        def which(self) -> str:
            return Categorical.__name__

    class UsesParameter(Actor):
        @endpoint
        def which(self) -> str:
            return Parameter.__name__

    class UsesAdam(Actor):
        @endpoint
        def which(self) -> str:
            return Adam.__name__

    class HoldsTensor(Actor):
        def __init__(self, t: torch.Tensor) -> None:
            self.t = t

        @endpoint
        def which(self) -> str:
            return str(self.t.dtype)

    return [UsesCategorical, UsesParameter, UsesAdam, HoldsTensor]


@pytest.mark.parametrize("trial", range(3))
def test_actors_spawned_at_once_on_a_fresh_proc_import_torch_safely(trial):
    pm = this_host().spawn_procs(per_host={"procs": 1}, name=f"imports{trial}")
    try:
        a, b, c, d = _classes()
        meshes = [pm.spawn("a", a), pm.spawn("b", b), pm.spawn("c", c),
                  pm.spawn("d", d, torch.ones(2))]  # sent back to back, no wait between
        got = [m.which.call_one().get(timeout=60) for m in meshes]
        assert got == ["Categorical", "Parameter", "Adam", "torch.float32"]
    finally:
        pm.stop().get(timeout=30)
