"""Actors used by the multi-host tests (pickled by value, so remote procs need not import us)."""
from __future__ import annotations

import socket
import sys

import cloudpickle

from runtime import Actor, current_rank, endpoint


class Where(Actor):
    """Says where it runs; can call another mesh (actor-to-actor across hosts)."""

    @endpoint
    def where(self) -> tuple[str, dict]:
        return socket.gethostname(), dict(current_rank())

    @endpoint
    def shout(self, text: str) -> None:
        print(f"{text} from {socket.gethostname()}", flush=True)

    @endpoint
    def ask(self, other, rank: int, timeout: float = 10.0) -> str:
        """Call `other` (an ActorMesh) at `rank` from inside this actor; its host name."""
        return other.slice(**{k: v for k, v in _point(other, rank).items()}).where.call_one().get(
            timeout=timeout)[0]

    @endpoint
    def add(self, a: int, b: int) -> int:
        return a + b

    @endpoint
    def report(self, port) -> None:
        """Send this actor's host and rank to `port` (a Port from the controller)."""
        port.send((socket.gethostname(), dict(current_rank())))


def _point(mesh, rank: int) -> dict:
    sizes = dict(mesh.sizes)
    out = {}
    for name in reversed(list(sizes)):
        out[name] = rank % sizes[name]
        rank //= sizes[name]
    return out


cloudpickle.register_pickle_by_value(sys.modules[__name__])
