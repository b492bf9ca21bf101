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
    def pid(self) -> int:
        import os

        return os.getpid()

    @endpoint
    def crash(self, code: int) -> None:
        """The proc exits at once (a supervision error for its callers)."""
        import os

        os._exit(code)

    @endpoint
    def add(self, a: int, b: int) -> int:
        return a + b

    @endpoint
    def report(self, port) -> None:
        """Send this actor's host and rank to `port` (a Port from the controller)."""
        port.send((socket.gethostname(), dict(current_rank())))


class Store(Actor):
    """A controller-side actor (this_proc() or get_or_spawn_controller()): records who
    called it, from which host."""

    def __init__(self) -> None:
        self.items: list = []

    @endpoint
    def put(self, item) -> int:
        self.items.append(item)
        return len(self.items)

    @endpoint
    def host(self) -> str:
        return socket.gethostname()


class CallsHome(Actor):
    """A proc-side actor that calls actors living in the controller."""

    @endpoint
    def via_ref(self, store) -> tuple:
        """Call `store` (a ref the controller passed); (this host, the address dialed, the
        store's host, its count)."""
        n = store.put.call_one(socket.gethostname()).get(timeout=20)
        return socket.gethostname(), store._rec.addresses[0], store.host.call_one().get(
            timeout=20), n

    @endpoint
    def via_singleton(self, name: str) -> tuple:
        """Ask the controller for its singleton `name` and call it."""
        from runtime import get_or_spawn_controller

        store = get_or_spawn_controller(name, Store).get(timeout=20)
        n = store.put.call_one(socket.gethostname()).get(timeout=20)
        return socket.gethostname(), store._rec.addresses[0], n

    @endpoint
    def read_buffer(self, buf) -> str:
        """Read an RDMABuffer (waiting at most 1 s); the error's text, or "read"."""
        try:
            buf.read_into(memoryview(bytearray(buf.size()))).get(timeout=1)
        except Exception as e:  # reported to the test
            return f"{type(e).__name__}: {e}"
        return "read"

    @endpoint
    def make_buffer(self):
        """An RDMABuffer of this proc's memory (kept alive by the actor)."""
        from runtime.rdma import RDMABuffer

        self._mem = bytearray(b"x" * 64)
        return RDMABuffer(memoryview(self._mem))

    @endpoint
    def via_port(self, port) -> str:
        """Send this host's name to `port`; the address the port dials."""
        port.send(socket.gethostname())
        return port.address


def _point(mesh, rank: int) -> dict:
    sizes = dict(mesh.sizes)
    out = {}
    for name in reversed(list(sizes)):
        out[name] = rank % sizes[name]
        rank //= sizes[name]
    return out


cloudpickle.register_pickle_by_value(sys.modules[__name__])


class DiesAt(Actor):
    """Answers `size` bytes per call; SIGKILLs its own proc inside call `die_at`."""

    @endpoint
    def step(self, i: int, size: int, die_at: int) -> bytes:
        if i == die_at:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        return bytes(size)
