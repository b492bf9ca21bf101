"""The gateway's cost: a round trip to one actor and a call + gather on 4 actors (2 hosts x
2 procs), straight to the host agents and through a gateway (runtime/transport/gateway.py),
side by side in one controller.

Four host agents on loopback TCP (CurveZMQ), two per path, each pair with its own cluster
key: the direct pair is attached plainly, the other pair through the gateway that its first
agent runs (`--gateway`), so every message of that path crosses one more process (and
hop). By default on this machine; `--direct A1,A2 --gated A1,A2 --gateway tcp://H:P
--key-file K --gated-key-file K2` measures agents you started elsewhere (e.g. the
namespaced cluster). Progress goes to stderr, the table to stdout.

    PYTHONPATH=. python benchmarks/bench_gateway.py [--iters 200]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import runtime
from runtime import Actor, endpoint
from runtime.transport import auth


class Echo(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x


if __name__ != "__main__":  # imported (a driver script): procs elsewhere cannot import us
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _agent(d: str, name: str, key: str, gateway: bool) -> tuple[subprocess.Popen, dict]:
    af = os.path.join(d, name + ".json")
    argv = [sys.executable, "-m", "runtime.host", "--listen", "tcp://127.0.0.1:0",
            "--key-file", key, "--address-file", af, "--parent-pid", str(os.getpid()),
            "--log-dir", d]  # its procs' log files go with the temporary directory
    if gateway:
        argv += ["--gateway", "tcp://127.0.0.1:0"]
    p = subprocess.Popen(argv, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    deadline = time.monotonic() + 30
    while not os.path.exists(af):
        if p.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"agent {name} did not start")
        time.sleep(0.02)
    with open(af) as f:
        return p, json.load(f)


def measure(hosts, iters: int) -> tuple[float, float]:
    """Median ms of a round trip to one actor and of a call + gather on the 4 actors."""
    procs = hosts.spawn_procs(per_host={"procs": 2})
    echo = procs.spawn("echo", Echo)
    one = echo.slice(**{list(hosts.sizes)[0]: 1}, procs=1)  # the second host
    for _ in range(20):
        one.ping.call_one(0).get(timeout=30)
        echo.ping.call(0).get(timeout=30)
    rt, c4 = [], []
    for i in range(iters):
        t0 = time.perf_counter()
        one.ping.call_one(i).get(timeout=30)
        rt.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        echo.ping.call(i).get(timeout=30)
        c4.append(time.perf_counter() - t0)
    procs.stop().get(timeout=30)
    return statistics.median(rt) * 1e3, statistics.median(c4) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--direct", help="A1,A2: agents to attach straight (default: start two)")
    ap.add_argument("--gated", help="A1,A2: agents behind the gateway (default: start two)")
    ap.add_argument("--gateway", help="tcp://H:P of the gated agents' gateway")
    ap.add_argument("--key-file", help="key of the direct agents")
    ap.add_argument("--gated-key-file", help="key of the gated agents")
    a = ap.parse_args()
    started = []
    with tempfile.TemporaryDirectory() as d:
        try:
            if a.direct is None:
                keys = [os.path.join(d, "direct.key"), os.path.join(d, "gated.key")]
                for k in keys:
                    auth.write_key_file(k)
                direct = [_agent(d, f"d{i}", keys[0], False) for i in range(2)]
                gated = [_agent(d, f"g{i}", keys[1], i == 0) for i in range(2)]
                started = [p for p, _ in direct + gated]
                a.direct = ",".join(info["address"] for _, info in direct)
                a.gated = ",".join(info["address"] for _, info in gated)
                a.gateway = gated[0][1]["gateway"]
                a.key_file, a.gated_key_file = keys
            print("attaching...", file=sys.stderr)
            h_direct = runtime.attach_to_workers(a.direct.split(","), key_file=a.key_file,
                                                 name="direct")
            h_gated = runtime.attach_to_workers(a.gated.split(","), key_file=a.gated_key_file,
                                                gateway=a.gateway, name="gated")
            rows = []
            for name, hosts in [("direct", h_direct), ("gateway", h_gated)]:
                print(f"measuring {name} ({a.iters} iterations)...", file=sys.stderr)
                rows.append((name, *measure(hosts, a.iters)))
            ref = rows[0]
            print(f"{'path':>8}  {'round trip ms':>13}  {'x direct':>8}  "
                  f"{'call on 4 ms':>12}  {'x direct':>8}")
            for name, rt_ms, c4_ms in rows:
                print(f"{name:>8}  {rt_ms:13.2f}  {rt_ms / ref[1]:8.2f}  {c4_ms:12.2f}  "
                      f"{c4_ms / ref[2]:8.2f}")
            for h in (h_direct, h_gated):
                h.shutdown()
        finally:
            for p in started:
                if p.poll() is None:
                    p.kill()
                p.wait(10)


if __name__ == "__main__":
    main()
