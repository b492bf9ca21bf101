"""Actor classes for tests/test_monarch_examples_api.py (imported by the procs by reference)."""
from __future__ import annotations

import os

from runtime import Actor, context, current_rank, endpoint


class Finisher(Actor):
    """Stops itself when told to, as Monarch's sleep_actors example does."""

    def __init__(self) -> None:
        self.calls = 0

    @endpoint
    def ping(self) -> int:
        self.calls += 1
        return current_rank().rank

    @endpoint
    async def finish(self, reason: str) -> str:
        context().actor_instance.stop(reason)
        return f"finishing: {reason}"


class EnvReader(Actor):
    @endpoint
    def env(self, key: str) -> str | None:
        return os.environ.get(key)

    @endpoint
    def where(self) -> dict:
        return dict(context().actor_instance.rank)


def set_marker() -> None:
    """A proc bootstrap (spawn_procs(bootstrap=...)): runs before any actor of the proc."""
    os.environ["EXAMPLE_BOOTSTRAPPED"] = f"yes-{os.getpid()}"


async def set_marker_async() -> None:
    import asyncio

    await asyncio.sleep(0)
    os.environ["EXAMPLE_BOOTSTRAPPED"] = "async"


def failing_bootstrap() -> None:
    raise RuntimeError("bootstrap exploded")
