"""CPU per call: where a `call_one` round trip spends its time, thread by thread, against
raw pyzmq REQ/REP.

    python benchmarks/bench_call_cpu.py [--calls 3000]

Prints wall time and CPU time per round trip on each side (the controller: this process;
the proc / the REP peer), measured in the same run, then the CPU per round trip of every
thread of both sides (Linux per-thread times through psutil). CPU time is steadier than
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


def ours(n: int) -> tuple[float, list]:
    import runtime
    from runtime import Actor, endpoint, this_host

    class Noop(Actor):
        @endpoint
        def noop(self) -> None:
            return None

        @endpoint
        def thread_names(self) -> dict:
            return {t.native_id: t.name for t in threading.enumerate()}

    pm = this_host().spawn_procs(per_host={"procs": 1})
    try:
        one = pm.spawn("noop", Noop)
        names = one.thread_names.call_one().get(timeout=60)
        proc_names = {k: ("actor thread" if v.startswith("actor-") else
                          "I/O thread" if v.startswith("monarch-io") else v)
                      for k, v in names.items()}
        ctl_names = lambda: {k: ("caller (main) thread" if v == "MainThread" else
                                 "I/O thread" if v.startswith("monarch-io") else v)
                             for k, v in _own_names().items()}
        return _measure(lambda: one.noop.call_one().get(),
                        [(os.getpid(), ctl_names), (pm.procs[0].pid, lambda: proc_names)], n)
    finally:
        pm.stop().get(timeout=30)
        runtime.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3000)
    a = ap.parse_args()
    print("measuring raw pyzmq REQ/REP ...", file=sys.stderr)
    r = raw(a.calls)
    print("measuring call_one ...", file=sys.stderr)
    o = ours(a.calls)
    tot = lambda side: sum(side.values())
    print(f"{'per round trip':<22} | {'wall':>8} | {'caller CPU':>10} | {'callee CPU':>10}")
    for label, (w, (c, p)) in (("raw pyzmq REQ/REP", r), ("call_one", o)):
        print(f"{label:<22} | {w * 1e6:5.0f} us | {tot(c) * 1e6:7.0f} us | {tot(p) * 1e6:7.0f} us")
    print(f"{'ratio':<22} | {o[0] / r[0]:7.2f}x | {tot(o[1][0]) / tot(r[1][0]):9.2f}x | "
          f"{tot(o[1][1]) / tot(r[1][1]):9.2f}x")
    print()
    print(f"{'CPU per round trip, by thread':<44} | {'us':>6}")
    for label, (_, sides) in (("raw", r), ("call_one", o)):
        for side, sample in zip(("caller", "callee"), sides):
            for name, sec in sorted(sample.items(), key=lambda kv: -kv[1]):
                if sec * 1e6 >= 0.5:
                    print(f"{label + ' ' + side + ': ' + name:<44} | {sec * 1e6:6.1f}")


if __name__ == "__main__":
    main()
