"""Actor classes for the tests of Monarch's endpoint kinds and semantics (imported by the
workers by reference)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading

from runtime import (Actor, Port, concurrent_endpoint, context, current_rank, endpoint,
                     get_or_spawn_controller, this_proc)


class Ported(Actor):
    def __init__(self) -> None:
        self.waiting: list = []

    @endpoint(explicit_response_port=True)
    def add(self, port: "Port[int]", b: int) -> None:
        port.send(3 + b)

    @endpoint(explicit_response_port=True)
    def park(self, port: "Port[str]") -> None:
        self.waiting.append(port)  # answered later, by release()

    @endpoint
    def release(self, value: str) -> int:
        n = len(self.waiting)
        for p in self.waiting:
            p.send(value)
        self.waiting.clear()
        return n

    @endpoint(explicit_response_port=True)
    def forward(self, port: "Port[str]", other: "object", value: str) -> None:
        other.answer.call_one(port, value).get(timeout=30)  # another actor answers

    @endpoint(explicit_response_port=True)
    def refuse(self, port: "Port[int]") -> None:
        port.exception(ValueError("refused"))

    @endpoint(explicit_response_port=True)
    def crash(self, port: "Port[int]") -> None:
        raise RuntimeError("no answer sent")

    @endpoint(propagate="inspect", instrument=False)
    def ping(self, x: int = 0) -> int:
        return x

    def plain(self, x: int) -> int:
        return x * 10

    def plain_port(self, port: "Port[int]", x: int) -> None:
        port.send(x + 100)


class Answerer(Actor):
    @endpoint
    def answer(self, port: "Port[str]", value: str) -> None:
        port.send(f"answered {value} from pid {os.getpid()}")


class Gate(Actor):
    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.unblock = asyncio.Event()
        self.order: list = []

    @concurrent_endpoint
    async def wait(self) -> str:
        self.ready.set()
        await self.unblock.wait()
        return "done"

    @endpoint
    async def release_when_ready(self) -> str:
        await self.ready.wait()
        self.unblock.set()
        return "released"

    @concurrent_endpoint(explicit_response_port=True)
    async def started(self, port: "Port[str]") -> None:
        port.send("started")
        await self.unblock.wait()

    @endpoint
    async def ping(self) -> str:
        return "pong"

    @concurrent_endpoint
    async def fail(self) -> None:
        await asyncio.sleep(0)
        raise ValueError("boom")

    @concurrent_endpoint(explicit_response_port=True)
    async def port_fail(self, port: "Port[str]", answer: bool) -> None:
        if answer:
            port.send("answered")
        raise ValueError("explicit boom")

    @concurrent_endpoint
    async def hang(self, path: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            with open(path, "a") as f:
                f.write("cancelled\n")

    async def __cleanup__(self, exc: object) -> None:
        path = os.environ.get("GATE_CLEANUP_FILE")
        if path:
            with open(path, "a") as f:
                f.write("cleanup\n")


class Sequential(Actor):
    @endpoint
    async def slow(self, t: float) -> str:
        await asyncio.sleep(t)
        return "slow"

    @endpoint
    async def ping(self) -> str:
        return "pong"


class Where(Actor):
    def __init__(self, tag: str = "") -> None:
        self.tag = tag
        self.n = 0

    @endpoint
    def where(self) -> dict:
        self.n += 1
        return {"pid": os.getpid(), "thread": threading.current_thread().name,
                "tag": self.tag, "n": self.n, "name": context().name}

    @endpoint
    def singleton(self, name: str) -> object:
        return get_or_spawn_controller(name, Where, "from-actor").get(timeout=30)

    @endpoint
    async def asingleton(self, name: str) -> object:
        mesh = await get_or_spawn_controller(name, Where, "async")
        info = await mesh.where.call_one()
        return info["pid"]

    @endpoint
    def spawn_here(self) -> int:
        m = this_proc().spawn("inner", Where, "inner")
        return m.where.call_one().get(timeout=30)["pid"]

    @endpoint
    def spawn_on(self, procs: object) -> list:
        m = procs.spawn("spawned_by_actor", Where, "remote")
        return sorted(v["pid"] for v in m.where.call().get(timeout=30).values())

    @endpoint
    def try_stop(self, procs: object) -> str:
        try:
            procs.stop()
        except RuntimeError as e:
            return str(e)
        return "stopped"

    @endpoint
    def procs_on(self, hosts: object) -> int:
        pm = hosts.spawn_procs(per_host={"gpus": 2}, name="nested")
        m = pm.spawn("nested_where", Where)
        pids = {v["pid"] for v in m.where.call().get(timeout=30).values()}
        pm.stop().get(timeout=20)
        return len(pids - {os.getpid()})

    @endpoint
    def exit(self) -> None:
        sys.exit(3)

    @endpoint
    def abort(self, reason: object = None) -> str:
        context().actor_instance.abort(reason)
        return "still answered"


class ForeverInInit(Actor):
    """Spawns a Where on `procs` and sends it through `port`, then never returns."""

    def __init__(self, procs: object, port: "Port[object]") -> None:
        port.send(procs.spawn("made_in_init", Where, "from init"))  # type: ignore[attr-defined]
        threading.Event().wait()

    @endpoint
    def unreachable(self) -> None:
        pass


class SlowInit(Actor):
    """An `__init__` that takes `seconds` (a slow import, say), in small sleeps; it makes
    the file `started` + its rank first, when given."""

    def __init__(self, seconds: float, started: str = "") -> None:
        import time

        if started:
            open(f"{started}{current_rank().rank}", "w").close()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.02)

    @endpoint
    def ping(self) -> int:
        return 1


class BadInit(Actor):
    def __init__(self) -> None:
        raise ValueError("init exploded at once")

    @endpoint
    def ping(self) -> int:
        return 1


class Parent(Actor):
    def __init__(self) -> None:
        self.failures: list = []

    @endpoint
    def spawn_bad(self) -> None:
        self.child = this_proc().spawn("bad_child", BadInit)

    def __supervise__(self, failure: object) -> bool:
        self.failures.append(str(failure))
        return True

    @endpoint
    def seen(self) -> list:
        return self.failures


class _NotesWhenCollected:
    """Appends a line to a file when collected (held by a module global below)."""

    def __init__(self, path: str, line: str) -> None:
        self.path, self.line = path, line

    def __del__(self) -> None:
        with open(self.path, "a") as f:
            f.write(self.line + "\n")


_held_by_a_global: object = None  # set in the proc by Graceful


class Graceful(Actor):
    def __init__(self, path: str) -> None:
        import atexit

        global _held_by_a_global
        self.path = path
        atexit.register(self._note, "atexit")
        _held_by_a_global = _NotesWhenCollected(path, "module-global")

    def _note(self, what: str) -> None:
        with open(self.path, "a") as f:
            f.write(what + "\n")

    def __del__(self) -> None:
        self._note("del")

    @endpoint
    def busy(self) -> None:
        import time

        open(self.path + ".busy", "w").close()  # the test knows it is inside busy() now
        try:
            while True:
                time.sleep(0.05)
        finally:
            self._note("finally")

    @endpoint
    def ping(self) -> int:
        return 1


class Background(Actor):
    """A task started by a plain async endpoint keeps running between messages."""

    def __init__(self) -> None:
        self.ticks = 0
        self.running = False

    @endpoint
    async def start(self, path: str = "") -> None:
        self.running = True
        self.task = asyncio.create_task(self._loop(path))

    async def _loop(self, path: str) -> None:
        import os

        while self.running:
            self.ticks += 1
            if path:  # the count, seen without a message to the actor
                with open(path + ".tmp", "w") as f:
                    f.write(str(self.ticks))
                os.replace(path + ".tmp", path)
            await asyncio.sleep(0.01)

    @endpoint
    def ticks_now(self) -> int:
        return self.ticks

    @endpoint
    async def finish(self) -> int:
        self.running = False
        await self.task
        return self.ticks


class ChildGate(Gate):
    """Concurrent endpoints are inherited; the child adds its own."""

    @concurrent_endpoint
    async def child_wait(self) -> str:
        await self.ready.wait()
        return "child"

    @endpoint
    def release(self) -> None:
        self.unblock.set()


class Mixed(Actor):
    """Sync and async endpoints in one actor (Monarch refuses this class at spawn)."""

    def __init__(self, cleanup_file: str = "") -> None:
        self.log: list = []
        self.cleanup_file = cleanup_file

    @endpoint
    def add_sync(self, x: int) -> list:
        self.log.append(("sync", x))
        return list(self.log)

    @endpoint
    async def add_async(self, x: int) -> list:
        await asyncio.sleep(0.02)  # the next message waits: one message at a time
        self.log.append(("async", x))
        return list(self.log)

    @endpoint
    def ask_sync(self, other: object) -> int:
        return other.ping.call_one(7).get(timeout=20)  # a sync endpoint may block on a call

    @endpoint
    async def ask_async(self, other: object) -> int:
        return await other.ping.call_one(8)

    async def __cleanup__(self, exc: object) -> None:  # Monarch: refused with sync endpoints
        if self.cleanup_file:
            await asyncio.sleep(0)
            with open(self.cleanup_file, "w") as f:
                f.write(f"cleaned after {len(self.log)}")


class StopEndpoint(Actor):
    """An endpoint named like a mesh method (Monarch's grpo_actor.py has `Scorer.stop`)."""

    @endpoint
    async def stop(self) -> str:
        return "the endpoint"
