"""Failures on demand: workers fail at random (`inject_actor_failures`) while training
runs; their owner's __supervise__ sees `failure.is_injected` and respawns them.

    python examples/chaos.py
"""

import time

from runtime import (Actor, ActorFailurePolicy, SupervisionError, endpoint,
                     inject_actor_failures, this_host)


class Worker(Actor):
    @endpoint
    def step(self) -> int:
        time.sleep(0.01)
        return 1


class Trainer(Actor):
    """Owns the workers; an injected failure of one replaces the workers' actor mesh (the
    procs are fine: only the actor failed)."""

    def __init__(self, procs) -> None:
        self.procs, self.restarts, self.injected = procs, 0, 0
        self.workers = procs.spawn("workers", Worker)

    def __supervise__(self, failure) -> bool:
        self.injected += failure.is_injected  # always true here: see supervisors= below
        if self.workers is not None:  # one respawn for the ranks that failed together
            self.workers = None
        return True

    @endpoint
    def train(self, steps: int) -> dict:
        """Run up to `steps` steps; stop at the first that failed (workers respawned next)."""
        if self.workers is None:
            self.restarts += 1
            self.workers = self.procs.spawn(f"workers{self.restarts}", Worker)
        done = 0
        for _ in range(steps):
            try:
                self.workers.step.call().get(timeout=30)
                done += 1
            except SupervisionError:
                break
        return {"steps": done, "restarts": self.restarts, "injected": self.injected}


def main() -> None:
    with this_host().spawn_procs(per_host={"procs": 1}, name="trainer") as tprocs, \
            this_host().spawn_procs(per_host={"procs": 2}, name="workers") as wprocs:
        # each Worker fails with probability 0.5 every 0.25 s (over the run's few seconds
        # that is certain to happen: about 1 in 10^7 runs sees none); Trainer's __supervise__
        # is called for injected failures only (a real fault would still fail the program)
        with inject_actor_failures({Worker: ActorFailurePolicy(0.5, 0.25)},
                                   supervisors=[Trainer]):
            trainer = tprocs.spawn("trainer", Trainer, wprocs)
        total = 0
        while total < 300:
            r = trainer.train.call_one(20).get(timeout=60)
            total += r["steps"]
        print(f"trained {total} steps; injected failures handled: {r['injected']}, "
              f"respawns: {r['restarts']}")


if __name__ == "__main__":
    main()
