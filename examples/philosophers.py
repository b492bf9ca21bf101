"""Dining philosophers, the pattern of Monarch's `python/examples/dining_philosophers.py` in
this runtime's API: actors on 5 procs share forks through a Table actor that holds a
reference to their mesh, grants a seat both forks at once, and wakes a waiting neighbour by
broadcasting to a one-actor slice. Runs for --seconds, prints the meals, then stops itself
(an actor per seat stops with `context().actor_instance.stop(reason)` when told to; the
table is closed first, so no meal starts while the dinner ends)."""

import argparse
import asyncio
import time

from runtime import Actor, context, current_rank, endpoint, this_host


class Table(Actor):
    """Owns the forks; seat i needs forks i and i+1 (mod n)."""

    def __init__(self, philosophers, seats: int) -> None:
        self.philosophers = philosophers
        self.seats = seats
        self.taken: set[int] = set()
        self.waiting: list[int] = []
        self.closed = False

    def _forks(self, seat: int) -> tuple[int, int]:
        return seat, (seat + 1) % self.seats

    def _try(self, seat: int) -> bool:
        forks = self._forks(seat)
        if self.closed:  # no more meals: the seat waits until its proc stops
            return True
        if self.taken.isdisjoint(forks):
            self.taken.update(forks)
            self.philosophers.slice(seat=seat).eat.broadcast()
            return True
        return False

    @endpoint
    def request(self, seat: int) -> None:
        if not self._try(seat):
            self.waiting.append(seat)

    @endpoint
    def close(self) -> None:
        """Grant no more forks; the meals under way still end with a release."""
        self.closed = True

    @endpoint
    def release(self, seat: int) -> None:
        self.taken.difference_update(self._forks(seat))
        for s in list(self.waiting):  # first come, first served among those who now can
            if self._try(s):
                self.waiting.remove(s)


class Philosopher(Actor):
    def __init__(self) -> None:
        self.seat = current_rank()["seat"]
        self.meals = 0
        self.table = None
        self.leaving = False

    @endpoint
    async def sit(self, table) -> None:
        self.table = table
        await table.request.call_one(self.seat)

    @endpoint
    async def eat(self) -> None:
        self.meals += 1
        await asyncio.sleep(0.05)  # eating
        await self.table.release.call_one(self.seat)
        if self.leaving:
            context().actor_instance.stop("finished dinner")
            return
        await asyncio.sleep(0.05)  # thinking
        await self.table.request.call_one(self.seat)

    @endpoint
    def count(self, leave: bool = False) -> int:
        self.leaving = leave
        return self.meals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    procs = this_host().spawn_procs(per_host={"seat": args.seats}, name="dinner")
    table_proc = this_host().spawn_procs(name="table")
    philosophers = procs.spawn("philosopher", Philosopher)
    table = table_proc.spawn("table", Table, philosophers, args.seats)
    philosophers.sit.call(table).get()
    time.sleep(args.seconds)
    table.close.call_one().get()
    meals = philosophers.count.call(leave=True).get()
    print("meals:", [meals.item(seat=i) for i in range(args.seats)])
    print("every philosopher ate:", all(m > 0 for m in meals.values()))
    # the philosophers first: one still eating releases its forks to a table that is there
    procs.stop("dinner over").get()
    table_proc.stop("dinner over").get()


if __name__ == "__main__":
    main()
