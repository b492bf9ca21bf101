"""CPU per call: where a `call_one` round trip spends its time, against raw pyzmq REQ/REP.

    python benchmarks/bench_call_cpu.py [--calls 3000]

Prints wall time and CPU time per round trip on each side (the controller: this process,
all threads; the proc / the REP peer: psutil user + system time), measured in the same run.
CPU time is steadier than wall time on a loaded machine.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
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


def _measure(fn, peer: psutil.Process, n: int) -> tuple[float, float, float]:
    for _ in range(min(500, n)):
        fn()
    c0, p0, t0 = time.process_time(), sum(peer.cpu_times()[:2]), time.perf_counter()
    for _ in range(n):
        fn()
    t1, c1, p1 = time.perf_counter(), time.process_time(), sum(peer.cpu_times()[:2])
    return (t1 - t0) / n, (c1 - c0) / n, (p1 - p0) / n


def raw(n: int) -> tuple[float, float, float]:
    d = tempfile.mkdtemp(prefix="bench-")
    addr = f"ipc://{d}/rep"
    p = subprocess.Popen([sys.executable, "-c", _PEER, addr])
    s = zmq.Context.instance().socket(zmq.REQ)
    s.connect(addr)

    def rt() -> None:
        s.send(b"x")
        s.recv()

    try:
        return _measure(rt, psutil.Process(p.pid), n)
    finally:
        s.send(b"quit")
        s.recv()
        s.close()
        p.wait(10)
        shutil.rmtree(d, ignore_errors=True)


def ours(n: int) -> tuple[float, float, float]:
    import runtime
    from runtime import Actor, endpoint, this_host

    class Noop(Actor):
        @endpoint
        def noop(self) -> None:
            return None

    pm = this_host().spawn_procs(per_host={"procs": 1})
    try:
        one = pm.spawn("noop", Noop)
        one.noop.call_one().get(timeout=60)
        return _measure(lambda: one.noop.call_one().get(), psutil.Process(pm.procs[0].pid), n)
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
    print(f"{'per round trip':<22} | {'wall':>8} | {'caller CPU':>10} | {'callee CPU':>10}")
    for label, (w, c, p) in (("raw pyzmq REQ/REP", r), ("call_one", o)):
        print(f"{label:<22} | {w * 1e6:6.0f} us | {c * 1e6:7.0f} us | {p * 1e6:7.0f} us")
    print(f"{'ratio':<22} | {o[0] / r[0]:7.2f}x | {o[1] / r[1]:9.2f}x | {o[2] / r[2]:9.2f}x")


if __name__ == "__main__":
    main()
