"""Chaos under load: two caller threads pipeline calls to random actors of a proc mesh while
a killer SIGKILLs a random proc of it at an interval (a new mesh replaces one with fewer
than two live ranks). Shared by tests/test_cross_host_seams.py (short) and
benchmarks/bench_chaos.py (long, with a table).

What is checked, per call: the answer is the right one (caller, sequence number, pid of
the rank called), or the call fails with a SupervisionError; no call waits past its bound.
Per killed proc: every call whose answer it sent counts. Each actor appends "caller seq"
to a file of its proc's before it answers; an actor answers a message before it takes the
next, so every line but the last of a proc's file is a call whose answer had been sent
when the proc died. And every kill is detected: a call to the killed rank fails naming
SIGKILL.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime import Actor, SupervisionError, endpoint


class Logged(Actor):
    """Answers (caller, seq, pid), after appending "caller seq" to its proc's file."""

    def __init__(self, log_dir: str) -> None:
        self.f = open(os.path.join(log_dir, str(os.getpid())), "a")

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def step(self, caller: int, seq: int) -> tuple:
        self.f.write(f"{caller} {seq}\n")
        self.f.flush()  # in the kernel's page cache: it outlives a SIGKILL of this process
        return caller, seq, os.getpid()


@dataclass
class Outcome:
    calls: int = 0
    answered: int = 0
    failed: int = 0
    wrong: list = field(default_factory=list)
    hung: list = field(default_factory=list)
    other_errors: list = field(default_factory=list)
    kills: list = field(default_factory=list)  # pids killed
    undetected: list = field(default_factory=list)
    lost: list = field(default_factory=list)  # (pid, caller, seq) answered-but-not-counted
    answers: dict = field(default_factory=dict)  # (caller, seq) -> pid that answered


class _Mesh:
    def __init__(self, hosts: Any, log_dir: str, n: int) -> None:
        self.pm = hosts.spawn_procs(per_host={"procs": 2}, name=f"chaos{n}")
        self.actors = self.pm.spawn("logged", Logged, log_dir)
        self.pids = list(self.actors.pid.call().get(timeout=120).values())
        self.live = list(range(len(self.pids)))


def run(hosts: Any, log_dir: str, seconds: float, every: float, depth: int = 10,
        bound: float = 30.0, seed: int = 0) -> Outcome:
    """Run the chaos for `seconds`, a kill each `every` seconds; returns what happened."""
    rng = random.Random(seed)
    out = Outcome()
    lock = threading.Lock()
    meshes = [_Mesh(hosts, log_dir, 0)]
    stop = threading.Event()

    def caller(who: int) -> None:
        seq = 0
        r = random.Random(seed * 100 + who)
        while not stop.is_set():
            m = meshes[-1]
            with lock:
                live = list(m.live)
            if not live:
                time.sleep(0.01)
                continue
            rank = r.choice(live)
            one = m.actors.slice(**_point(m, rank))
            futs = []
            for _ in range(depth):
                seq += 1
                try:
                    futs.append((seq, one.step.call_one(who, seq)))
                except SupervisionError as e:  # its death was known: it fails here
                    futs.append((seq, e))
            for s, f in futs:
                with lock:
                    out.calls += 1
                try:
                    if isinstance(f, BaseException):
                        raise f
                    got = f.get(timeout=bound)
                except TimeoutError:
                    with lock:
                        out.hung.append((who, s))
                    continue
                except SupervisionError:
                    with lock:
                        out.failed += 1
                    continue
                except Exception as e:  # noqa: BLE001 - counted, and the test fails on it
                    with lock:
                        out.other_errors.append(f"{type(e).__name__}: {e}"[:300])
                    continue
                with lock:
                    out.answered += 1
                    out.answers[(who, s)] = got[2]
                    if tuple(got) != (who, s, m.pids[rank]):
                        out.wrong.append((who, s, got))

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    killed_at: list = []
    try:
        deadline = time.monotonic() + seconds
        n = 0
        while time.monotonic() < deadline:
            time.sleep(every)
            m = meshes[-1]
            with lock:
                rank = rng.choice(m.live)
                m.live.remove(rank)
            os.kill(m.pids[rank], signal.SIGKILL)
            out.kills.append(m.pids[rank])
            killed_at.append((m, rank))
            if len(m.live) < 2:
                n += 1
                meshes.append(_Mesh(hosts, log_dir, n))
    finally:
        stop.set()
        for t in threads:
            t.join(bound * 2 + 10)
    for m, rank in killed_at:  # every kill is detected, naming the signal
        try:
            m.actors.slice(**_point(m, rank)).pid.call_one().get(timeout=bound)
            out.undetected.append(m.pids[rank])
        except SupervisionError as e:
            if "SIGKILL" not in str(e):
                out.undetected.append((m.pids[rank], str(e)[:200]))
        except TimeoutError:
            out.undetected.append((m.pids[rank], "no answer"))
    for pid in out.kills:  # every answer a killed proc sent counts
        path = os.path.join(log_dir, str(pid))
        lines = Path(path).read_text().split("\n")[:-1] if os.path.exists(path) else []
        for line in lines[:-1]:
            who, s = map(int, line.split())
            if out.answers.get((who, s)) != pid:
                out.lost.append((pid, who, s))
    for m in meshes:
        try:
            m.pm.stop().get(timeout=60)
        except Exception:  # noqa: BLE001 - a mesh whose procs all died stops as it can
            pass
    return out


def _point(m: _Mesh, rank: int) -> dict:
    """The slice coordinates of `rank` in a hosts x procs mesh."""
    sizes = m.actors.sizes
    procs = sizes.get("procs", 1)
    point = {"procs": rank % procs}
    if "hosts" in sizes:
        point["hosts"] = rank // procs
    return point
