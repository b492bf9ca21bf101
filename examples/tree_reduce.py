"""Reducing on the way up: 8 host agents (LocalJob) with a cast tree of fan-out 4, two procs
on each; every actor computes a partial loss and a histogram, and the host agents add them
up on the way back (`Accumulator(..., associative=True)`), so this process receives 4
partial values instead of 16 answers (docs/runtime.md, "Reducing on the way up").

    PYTHONPATH=. python examples/tree_reduce.py
"""

import collections
import operator

import runtime
from runtime import Accumulator, Actor, current_rank, endpoint
from runtime.job import LocalJob


class Shard(Actor):
    @endpoint
    def loss(self) -> float:
        return 0.5 * (current_rank().rank + 1)

    @endpoint
    def labels(self) -> collections.Counter:
        r = current_rank().rank
        return collections.Counter({"even" if r % 2 == 0 else "odd": 1, "all": 1})


def main() -> None:
    with runtime.configured(cast_fanout=4):
        job = LocalJob(hosts=8, progress=False)
        try:
            procs = job.state().hosts.spawn_procs(per_host={"procs": 2}, name="shards")
            shards = procs.spawn("shards", Shard)
            total = Accumulator(shards.loss, 0.0, operator.add, associative=True)
            print("summed loss:", total.accumulate().get(timeout=60))
            plain = Accumulator(shards.loss, 0.0, operator.add)  # folded here, as Monarch
            print("same as a plain fold:", plain.accumulate().get(timeout=60))
            counts = Accumulator(shards.labels, collections.Counter(), operator.add,
                                 associative=True).accumulate().get(timeout=60)
            print("label counts:", dict(sorted(counts.items())))
        finally:
            job.cleanup()  # the agents and their procs, and the job's directory


if __name__ == "__main__":
    main()
