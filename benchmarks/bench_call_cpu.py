"""CPU per call: where a `call_one` round trip spends its time, thread by thread, against
raw pyzmq REQ/REP; with --gather, a call on 4 procs and its gather against raw PUSH to 4
echo peers and PULL of their 4 replies.

    python benchmarks/bench_call_cpu.py [--calls 3000] [--gather]

Prints wall time and CPU time per round trip on each side (the controller: this process;
the proc / the REP peer; with --gather the 4 procs or peers together), measured in the
same run, then the CPU per round trip of every thread of both sides (Linux per-thread
times through psutil). CPU time is steadier than
wall time on a loaded machine, and a round trip is a chain: its wall time is about the sum
of the CPU of the threads it passes through. Progress goes to stderr.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import psutil
import zmq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_PEER = r"""
import sys, zmq
s = zmq.Context().socket(zmq.REP); s.bind(sys.argv[1])
while True:
    m = s.recv(); s.send(m)
    if m == b"quit": break
"""

_ECHO = r"""
import sys, zmq
ctx = zmq.Context()
r = ctx.socket(zmq.PULL); r.bind(sys.argv[1])
w = ctx.socket(zmq.PUSH); w.connect(sys.argv[2])
while True:
    m = r.recv()
    if m == b"quit": break
    w.send(m)
w.close(linger=1000)
"""

Sample = dict  # thread label -> CPU seconds


def _threads(pid: int, names: dict) -> Sample:
    """CPU seconds of each thread of `pid`, labelled by `names` (native id -> name) or the
    kernel's thread name; threads of the same label are summed."""
    out: Sample = {}
    for t in psutil.Process(pid).threads():
        label = names.get(t.id)
        if label is None:
            try:
                with open(f"/proc/{pid}/task/{t.id}/comm") as f:
                    label = f.read().strip()
            except OSError:
                continue
            label = "zmq I/O thread" if label.startswith("ZMQbg/IO") else label
        out[label] = out.get(label, 0.0) + t.user_time + t.system_time
    return out


def _measure(fn, sides: list, n: int) -> tuple[float, list]:
    """Wall seconds per call and, for each (pid, names) side, CPU seconds per call by thread."""
    for _ in range(min(500, n)):
        fn()
    before = [_threads(pid, names()) for pid, names in sides]
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    wall = (time.perf_counter() - t0) / n
    after = [_threads(pid, names()) for pid, names in sides]
    per = [{k: (v - b.get(k, 0.0)) / n for k, v in a.items()} for a, b in zip(after, before)]
    return wall, per


def _own_names() -> dict:
    return {t.native_id: t.name for t in threading.enumerate()}


def raw(n: int) -> tuple[float, list]:
    d = tempfile.mkdtemp(prefix="bench-")
    addr = f"ipc://{d}/rep"
    p = subprocess.Popen([sys.executable, "-c", _PEER, addr])
    s = zmq.Context.instance().socket(zmq.REQ)
    s.connect(addr)

    def rt() -> None:
        s.send(b"x")
        s.recv()

    try:
        return _measure(rt, [(os.getpid(), _own_names), (p.pid, lambda: {p.pid: "REP loop"})],
                        n)
    finally:
        s.send(b"quit")
        s.recv()
        s.close()
        p.wait(10)
        shutil.rmtree(d, ignore_errors=True)


def raw_gather(n: int) -> tuple[float, list]:
    d = tempfile.mkdtemp(prefix="bench-")
    ctx = zmq.Context.instance()
    back = ctx.socket(zmq.PULL)
    back.bind(f"ipc://{d}/back")
    peers, socks = [], []
    for i in range(4):
        peers.append(subprocess.Popen([sys.executable, "-c", _ECHO, f"ipc://{d}/p{i}",
                                       f"ipc://{d}/back"]))
        w = ctx.socket(zmq.PUSH)
        w.connect(f"ipc://{d}/p{i}")
        socks.append(w)

    def gather() -> None:
        for w in socks:
            w.send(b"x")
        for _ in socks:
            back.recv()

    try:
        wall, per = _measure(gather, [(os.getpid(), _own_names)] +
                             [(p.pid, lambda p=p: {p.pid: "echo loop"}) for p in peers], n)
        return wall, [per[0], _summed(per[1:])]
    finally:
        for w in socks:
            w.send(b"quit")
            w.close(linger=1000)
        for p in peers:
            p.wait(10)
        back.close()
        shutil.rmtree(d, ignore_errors=True)


def _summed(samples: list) -> Sample:
    out: Sample = {}
    for s in samples:
        for k, v in s.items():
            out[k] = out.get(k, 0.0) + v
    return out


def ours(n: int, procs: int = 1) -> tuple[float, list]:
    import runtime
    from runtime import Actor, endpoint, this_host

    class Noop(Actor):
        @endpoint
        def noop(self) -> None:
            return None

        @endpoint
        def thread_names(self) -> tuple:
            return os.getpid(), {t.native_id: t.name for t in threading.enumerate()}

    pm = this_host().spawn_procs(per_host={"procs": procs})
    try:
        mesh = pm.spawn("noop", Noop)
        one = mesh.slice(procs=0)
        sides = []
        for rank in range(procs):
            pid, names = mesh.slice(procs=rank).thread_names.call_one().get(timeout=60)
            labels = {k: ("actor thread" if v.startswith("actor-") else
                          "I/O thread" if v.startswith("monarch-io") else v)
                      for k, v in names.items()}
            sides.append((pid, lambda labels=labels: labels))
        ctl_names = lambda: {k: ("caller (main) thread" if v == "MainThread" else
                                 "I/O thread" if v.startswith("monarch-io") else v)
                             for k, v in _own_names().items()}
        call = (lambda: one.noop.call_one().get()) if procs == 1 else \
            (lambda: mesh.noop.call().get())
        wall, per = _measure(call, [(os.getpid(), ctl_names)] + sides, n)
        return wall, [per[0], _summed(per[1:])]
    finally:
        pm.stop().get(timeout=30)
        runtime.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--gather", action="store_true", help="a call on 4 procs and its gather")
    a = ap.parse_args()
    names = ("raw PUSH/PULL x4", "call on 4 + gather") if a.gather else \
        ("raw pyzmq REQ/REP", "call_one")
    print(f"measuring {names[0]} ...", file=sys.stderr)
    r = raw_gather(a.calls) if a.gather else raw(a.calls)
    print(f"measuring {names[1]} ...", file=sys.stderr)
    o = ours(a.calls, 4 if a.gather else 1)
    tot = lambda side: sum(side.values())
    callee = "callees' CPU" if a.gather else "callee CPU"
    print(f"{'per round trip':<22} | {'wall':>8} | {'caller CPU':>10} | {callee:>10}")
    for label, (w, (c, p)) in ((names[0], r), (names[1], o)):
        print(f"{label:<22} | {w * 1e6:5.0f} us | {tot(c) * 1e6:7.0f} us | {tot(p) * 1e6:7.0f} us")
    print(f"{'ratio':<22} | {o[0] / r[0]:7.2f}x | {tot(o[1][0]) / tot(r[1][0]):9.2f}x | "
          f"{tot(o[1][1]) / tot(r[1][1]):9.2f}x")
    print()
    print(f"{'CPU per round trip, by thread':<44} | {'us':>6}")
    for label, (_, sides) in (("raw", r), ("ours", o)):
        for side, sample in zip(("caller", "callee"), sides):
            for name, sec in sorted(sample.items(), key=lambda kv: -kv[1]):
                if sec * 1e6 >= 0.5:
                    print(f"{label + ' ' + side + ': ' + name:<44} | {sec * 1e6:6.1f}")


if __name__ == "__main__":
    main()
