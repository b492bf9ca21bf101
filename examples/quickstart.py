"""Quickstart as a plain script: a mesh of 4 procs, an actor on each, calls and slices."""

from runtime import ActorError, Actor, current_rank, endpoint, this_host


class Counter(Actor):
    def __init__(self, start: int) -> None:
        self.value = start

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.value += by
        return self.value

    @endpoint
    async def value_and_rank(self) -> tuple[int, int]:
        return self.value, current_rank().rank

    @endpoint
    def fail(self) -> None:
        raise RuntimeError("this endpoint always fails")


def main() -> None:
    with this_host().spawn_procs(per_host={"procs": 4}, name="workers") as procs:
        counters = procs.spawn("counters", Counter, 10)
        print("all :", counters.incr.call(5).get())
        print("one :", counters.slice(procs=2).incr.call_one().get())
        print("half:", list(counters.slice(procs=slice(0, 2)).value_and_rank.call().get().values()))
        for fut in counters.incr.stream(100):
            print("streamed:", fut.get())
        try:
            counters.slice(procs=0).fail.call_one().get()
        except ActorError as e:
            print("error:", e.message)
        print("still alive:", counters.slice(procs=0).incr.call_one(0).get())


if __name__ == "__main__":
    main()
