"""Actor classes used by the tests (imported by the workers by reference)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time

import numpy as np

from runtime import Actor, Channel, current_rank, current_size, context, endpoint, this_host


class Echo(Actor):
    def __init__(self, tag: str = "echo") -> None:
        self.tag = tag
        self.seen: list = []

    @endpoint
    def ping(self, x=None):
        return x

    @endpoint
    def whoami(self):
        ctx = context()
        # the spawn rank (current_rank() is the point in the slice called, as in Monarch)
        return {"rank": ctx.rank.rank, "coords": dict(ctx.rank),
                "size": dict(ctx.rank.extent), "pid": os.getpid(), "name": ctx.name}

    @endpoint
    async def aping(self, x):
        await asyncio.sleep(0.01)
        return ("async", x)

    @endpoint
    def boom(self, msg: str):
        raise ValueError(msg)

    @endpoint
    def record(self, i: int) -> None:
        self.seen.append(i)

    @endpoint
    def seen_list(self):
        return self.seen

    @endpoint
    def sleep(self, t: float):
        time.sleep(t)
        return t

    @endpoint
    def hold_gil(self, seconds: int) -> int:
        """C code that holds this proc's GIL for `seconds` (ctypes.PyDLL does not release
        it): no thread of the proc runs Python meanwhile, heartbeats included."""
        ctypes.PyDLL(None).sleep(seconds)
        return seconds

    @endpoint
    def call_hold_gil(self, other, seconds: int) -> int:
        """Actor-to-actor: `other` (one actor, not owned here) holds its GIL `seconds`."""
        return other.hold_gil.call_one(seconds).get(timeout=60)

    @endpoint
    def busy_loop(self, t: float):
        end = time.time() + t
        n = 0
        while time.time() < end:
            n += 1
            time.sleep(0.001)
        return n

    @endpoint
    def say(self, text: str):
        print(text)
        print(text + "-err", file=sys.stderr)
        os.write(1, (text + "-fd1\n").encode())
        libc = ctypes.CDLL(None)
        libc.printf((text + "-libc\n").encode())
        libc.fflush(None)

    @endpoint
    def array_sum(self, a):
        return float(np.asarray(a).sum()), bool(np.asarray(a).flags.writeable)

    @endpoint
    def make_array(self, n: int):
        return np.ones(n, dtype=np.float32)

    @endpoint
    def unpicklable(self):
        import threading

        return threading.Lock()

    @endpoint
    def send_to_port(self, port, value):
        port.send((context().rank.rank, value))

    @endpoint
    def call_other(self, other, x):
        """Actor-to-actor: call another mesh's endpoint and return its results."""
        return list(other.ping.call(x).get(timeout=10).values())

    @endpoint
    def exit_hard(self, code: int):
        os._exit(code)

    @endpoint
    def segfault(self):
        ctypes.string_at(0)

    @endpoint
    def open_channel_and_wait(self):
        port, recv = Channel.open()
        port.send("self-sent")
        return recv.recv().get(timeout=5)


class FailingInit(Actor):
    def __init__(self, bad: bool = True) -> None:
        if bad:
            raise RuntimeError("init exploded")

    @endpoint
    def ping(self):
        return "ok"


class Parent(Actor):
    """Owns a child mesh; supervises it by respawning on failure."""

    def __init__(self, respawn: bool = True) -> None:
        self.respawn = respawn
        self.failures: list = []
        self.procs = this_host().spawn_procs(per_host={"procs": 1}, name="child")
        self.child = self.procs.spawn("child", Echo)

    @endpoint
    def child_pid(self):
        return self.child.whoami.call_one().get(timeout=20)["pid"]

    @endpoint
    def child_ping(self, x):
        return self.child.ping.call_one(x).get(timeout=20)

    @endpoint
    def failures_seen(self):
        return [str(f) for f in self.failures]

    def __supervise__(self, failure):
        self.failures.append(failure)
        if not self.respawn:
            return False
        self.procs = this_host().spawn_procs(per_host={"procs": 1}, name="child2")
        self.child = self.procs.spawn("child", Echo)
        return True


class Cleaner(Actor):
    def __init__(self, path: str) -> None:
        self.path = path

    @endpoint
    def ping(self):
        return 1

    def __cleanup__(self, exc):
        with open(self.path, "a") as f:
            f.write(f"cleanup {current_rank().rank}\n")


class Probe(Actor):
    @endpoint
    def modules(self):
        return sorted(m for m in ("torch", "numpy") if m in sys.modules)


class ShardUser(Actor):
    """Receives mesh tensors (as this proc's shard) for the tensor-engine tests."""

    @endpoint
    def describe(self, t):
        import torch

        return {"type": type(t).__name__, "sum": float(t.sum()), "rank": current_rank().rank,
                "is_plain": type(t) is torch.Tensor}

    @endpoint
    def add_one_in_place(self, t) -> None:
        t.add_(1)

    @endpoint
    def env(self, name: str):
        return os.environ.get(name)


class Linear(Actor):
    """An actor with its own weights whose endpoint makes mesh tensors through `rref`."""

    def __init__(self) -> None:
        import torch

        self.w = torch.eye(3) * (current_rank().rank + 1)
        self.calls = 0

    @endpoint(propagate=lambda x: x)
    def forward(self, x):
        self.calls += 1
        return x @ self.w

    @endpoint
    def times_called(self) -> int:
        return self.calls

    @endpoint
    def plain(self, x):
        return x


class Ledger(Actor):
    """Records (sender, i) in arrival order (per-sender order checks); how many messages
    its proc's actor threads read themselves (transport.inbox.SharedInbox)."""

    def __init__(self) -> None:
        self.seen: list = []

    @endpoint
    def add(self, who: int, i: int) -> int:
        self.seen.append((who, i))
        return i

    @endpoint
    def seen_by(self, who: int) -> list:
        return [i for w, i in self.seen if w == who]

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def nap(self, s: float) -> float:
        time.sleep(s)
        return s

    @endpoint
    def hold(self, path: str, limit: float = 60.0) -> bool:
        """Busy until `path` exists (or `limit` seconds pass): whether it appeared."""
        deadline = time.monotonic() + limit
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

