"""Failures on demand, with the API of Monarch's `monarch.actor.fault_injection`: actors of
the named classes fail at random while a context is open, so `__supervise__` and recovery
code can be tried on purpose. Their failures are real ones (the owner hears of them, waits
on them fail) that carry `MeshFailure.is_injected`.

`inject_raise` makes one actor of a live mesh raise at its next call, on demand (what
`%mesh chaos MESH --raise` does on a schedule).

Layer 8 (a feature that plugs in): imports `actor`, `supervision` and `_meshes`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Generator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from ._meshes.actor_mesh import ActorMesh, arm_raise
from .actor import Actor, qualified_class
from .future import Future
from .supervision import injection as _rules

__all__ = ["ActorFailurePolicy", "inject_actor_failures", "inject_raise"]


@dataclass(frozen=True)
class ActorFailurePolicy:
    """Every `interval_seconds`, an actor fails with `probability` (0 to 1), as in Monarch.
    `mode="raise"` (not in Monarch): a hit makes the actor's next endpoint call raise
    `InjectedFault` instead (the caller gets an ActorError, the actor lives on and keeps
    rolling), to try the code that handles failed calls rather than failed actors."""

    probability: float
    interval_seconds: float = 1.0
    mode: str = "fail"

    def __post_init__(self) -> None:
        p, s = self.probability, self.interval_seconds
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) \
                or not 0.0 <= p <= 1.0:
            raise ValueError(f"ActorFailurePolicy: probability must be a number from 0 to 1, "
                             f"got {p!r}")
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) \
                or s <= 0.0:
            raise ValueError(f"ActorFailurePolicy: interval_seconds must be a positive, finite "
                             f"number, got {s!r}")
        if self.mode not in ("fail", "raise"):
            raise ValueError(f"ActorFailurePolicy: mode must be 'fail' (the actor fails) or "
                             f"'raise' (its next call raises InjectedFault), got {self.mode!r}")


def _actor_class(cls: object, what: str) -> type:
    """`cls` if it is an Actor subclass; TypeError naming `what` otherwise."""
    if not (isinstance(cls, type) and issubclass(cls, Actor)) or cls is Actor:
        raise TypeError(f"inject_actor_failures: {what} must be Actor subclasses, got {cls!r}")
    return cls


@contextmanager
def inject_actor_failures(
    policies: Mapping[type, ActorFailurePolicy],
    *,
    supervisors: Collection[type] = (),
) -> Generator[None, None, None]:
    """Make actors of the named classes, spawned while the context is open, fail at random.

    Each such actor rolls every `interval_seconds` after its `__init__` and fails with
    `probability`: its owner hears of it as of any failure (`__supervise__`, with
    `failure.is_injected` true), and calls to it fail with `SupervisionError`; with
    `mode="raise"` its next endpoint call raises `InjectedFault` instead (an ActorError for
    the caller; the actor lives on). An actor
    spawned inside keeps its policy after the context closes, and passes the rules on to
    the actors it spawns. A class in `supervisors` (it must define `__supervise__`) has its
    `__supervise__` called for injected failures only: any other failure is left
    unhandled, so a real fault still fails the job. Classes not named are never touched.
    """
    if not isinstance(policies, Mapping):
        raise TypeError("inject_actor_failures: policies must be a mapping "
                        f"{{ActorClass: ActorFailurePolicy(...)}}, got {type(policies).__name__}")
    if isinstance(supervisors, (str, bytes)) or not isinstance(supervisors, Collection):
        raise TypeError("inject_actor_failures: supervisors must be a collection of Actor "
                        f"classes, got {supervisors!r}")
    rules: dict = {"policies": {}, "supervisors": []}
    for cls, policy in policies.items():
        _actor_class(cls, "the keys of policies")
        if not isinstance(policy, ActorFailurePolicy):
            raise TypeError(f"inject_actor_failures: the policy for {cls.__name__} must be an "
                            f"ActorFailurePolicy, got {policy!r}")
        rules["policies"][qualified_class(cls)] = [float(policy.probability),
                                                    float(policy.interval_seconds),
                                                    policy.mode]
    for cls in supervisors:
        _actor_class(cls, "supervisors")
        if getattr(cls, "__supervise__", None) is None:
            raise TypeError(f"inject_actor_failures: supervisor {cls.__name__} must define "
                            "__supervise__")
        rules["supervisors"].append(qualified_class(cls))
    _rules.push(rules)
    try:
        yield
    finally:
        _rules.pop(rules)


def inject_raise(mesh: ActorMesh, rank: int, reason: str = "injected by inject_raise") -> Future:
    """Make the actor at `rank` of `mesh` (a rank of this view) raise `InjectedFault` at the
    start of its next endpoint call, as `ActorFailurePolicy(mode="raise")` does but for an
    actor already running, of any class, now: the caller gets an `ActorError` whose message
    reads `injected failure: <reason> raised in actor Cls mesh (rank r); the actor lives
    on`, and the actor lives on (one raise per arming). A call without a caller (no reply
    wanted) fails the actor, as any such raise does.

    Returns a Future[bool]: True once the actor's proc has armed it, False when that actor
    is stopped, failed or gone; it fails with `SupervisionError` if the proc dies first.
    `%mesh chaos MESH --raise --every DUR` calls it on random ranks of MESH at an interval.
    Raises TypeError for a `mesh` that is not an ActorMesh, IndexError for a rank outside it.
    """
    if not isinstance(mesh, ActorMesh):
        raise TypeError(f"inject_raise: mesh must be an ActorMesh, got {type(mesh).__name__}")
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise TypeError(f"inject_raise: rank must be an int, got {rank!r}")
    if not isinstance(reason, str):
        raise TypeError(f"inject_raise: reason must be a str, got {reason!r}")
    return arm_raise(mesh, rank, reason)
