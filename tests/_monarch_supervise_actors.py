"""Actors for tests/test_monarch_supervise.py (importable by procs)."""

from __future__ import annotations

import asyncio
import logging
import os

from runtime import Actor, SupervisionError, context, endpoint


class Dies(Actor):
    """Fails itself: SystemExit (a BaseException) fails the actor, as in Monarch."""

    @endpoint
    async def ok(self) -> int:
        return 1

    @endpoint
    async def die(self) -> None:
        raise SystemExit("child dies on purpose")

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def my_name(self) -> str:
        return str(context().actor_instance)

    @endpoint
    def log_line(self) -> str:
        return logging.getLogRecordFactory()(
            "x", logging.INFO, __file__, 1, "hello", None, None).getMessage()


class Owner(Actor):
    """Owns a mesh of `Dies` on `procs`; records the failures `__supervise__` sees."""

    def __init__(self, procs, handle: bool = True) -> None:
        self.kids = procs.spawn("kids", Dies)
        self.seen: list[str] = []
        self.handle = handle
        self.event = asyncio.Event()

    def __supervise__(self, failure) -> bool:
        self.seen.append(str(failure))
        self.event.set()
        return self.handle

    @endpoint
    async def fail_kids_and_return(self) -> str:
        """Call the kids so they all die; return right after the call fails."""
        try:
            await self.kids.die.call()
        except SupervisionError:
            return f"raised, seen {len(self.seen)}"
        return "no error"

    @endpoint
    async def broadcast_and_wait(self) -> int:
        """Break the kids without waiting for an answer; wait for __supervise__ here."""
        self.kids.die.broadcast()
        await asyncio.wait_for(self.event.wait(), timeout=30)
        return len(self.seen)

    @endpoint
    async def fail_kids_then_sleep(self, seconds: float) -> str:
        try:
            await self.kids.die.call()
        except SupervisionError:
            await asyncio.sleep(seconds)
        return "slept"

    @endpoint
    def failures(self) -> list[str]:
        return list(self.seen)

    @endpoint
    def kid_names(self) -> list[str]:
        return [v for _, v in self.kids.my_name.call().get(timeout=30).items()]
