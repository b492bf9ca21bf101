"""A worker crashes mid-training; its owner's __supervise__ respawns it and training goes on.

    python examples/supervision.py
"""

import os
import random
import signal
import time

from runtime import Actor, SupervisionError, endpoint, this_host


class Worker(Actor):
    def __init__(self) -> None:
        self.steps = 0

    @endpoint
    def step(self, lr: float) -> float:
        self.steps += 1
        time.sleep(0.01)
        return random.random() * lr

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Trainer(Actor):
    """Owns the workers: a crash of one reaches __supervise__, which replaces the mesh."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        self.procs = this_host().spawn_procs(per_host={"procs": self.n}, name="workers")
        self.workers = self.procs.spawn("workers", Worker)

    def __supervise__(self, failure) -> bool:
        print(f"supervisor: {failure}; respawning the workers")
        self.restarts += 1
        self.procs.stop()  # the survivors of the old mesh; don't wait for them
        self._start()
        return True

    @endpoint
    def train(self, steps: int) -> dict:
        """Run a chunk of steps; a step whose worker died is skipped (and retried later)."""
        done = 0
        for _ in range(steps):
            try:
                self.workers.step.call(0.1).get(timeout=30)
                done += 1
            except SupervisionError as e:
                print(f"a step failed ({str(e).splitlines()[0]}); waiting for the respawn")
                return {"steps": done, "restarts": self.restarts, "interrupted": True}
        return {"steps": done, "restarts": self.restarts, "interrupted": False}

    @endpoint
    def worker_pids(self) -> list:
        return list(self.workers.pid.call().get(timeout=30).values())


def main() -> None:
    with this_host().spawn_procs(per_host={"procs": 1}, name="trainer") as procs:
        trainer = procs.spawn("trainer", Trainer, 2)
        pids = trainer.worker_pids.call_one().get(timeout=60)
        total, killed = 0, False
        while total < 300:  # the controller drives training in chunks, as a notebook would
            r = trainer.train.call_one(20).get(timeout=120)
            total += r["steps"]
            print(f"trained {total} steps, restarts {r['restarts']}")
            if total >= 100 and not killed:
                print(f"killing worker pid {pids[1]}")
                os.kill(pids[1], signal.SIGKILL)
                killed = True
        assert trainer.worker_pids.call_one().get(timeout=60)[1] != pids[1]
        print("training finished on the respawned workers")

if __name__ == "__main__":
    main()
