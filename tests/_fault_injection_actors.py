"""Actors for tests/test_fault_injection.py (importable by procs)."""

from __future__ import annotations

from runtime import Actor, endpoint


class Flaky(Actor):
    """The class failures are injected into."""

    @endpoint
    def ping(self) -> int:
        return 1


class Steady(Actor):
    """A class nobody named: never failed on purpose."""

    @endpoint
    def ping(self) -> int:
        return 2


class Crashes(Actor):
    """Fails for real: SystemExit (a BaseException) fails the actor."""

    @endpoint
    def crash(self) -> None:
        raise SystemExit("a real fault")


class ChaosOwner(Actor):
    """Owns a mesh of `kind` on `procs`; records what its `__supervise__` sees and handles it."""

    def __init__(self, procs, kind: type) -> None:
        self.kids = procs.spawn("kids", kind)
        self.seen: list[tuple] = []

    def __supervise__(self, failure) -> bool:
        self.seen.append((failure.mesh, list(failure.ranks), failure.is_injected,
                          failure.cause))
        return True

    @endpoint
    def failures(self) -> list:
        return self.seen

    @endpoint
    def crash_kids(self) -> None:
        self.kids.crash.broadcast()
