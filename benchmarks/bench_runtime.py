"""Runtime benchmark: ours against raw pyzmq floors measured in the same run.

    python benchmarks/bench_runtime.py [--quick] [--compare [--python PATH]] [--repeat N]

Prints, for 4 actors in 4 procs: (a) cold start, (b) no-op call_one round trip (median,
p99), (c) call on all 4 and gather, (d) pipelined calls/s to one actor, (e) 64 MiB numpy
array and torch tensor as an argument (GB/s), idle RSS of 4 procs; and the floors: raw
pyzmq REQ/REP over ipc, broadcast-gather to 4 raw peers, pipelined raw messages/s, memcpy.
With --compare, runs the same workloads on Ray and Monarch (torchmonarch) where importable
by the given Python (a separate virtual environment), side by side. Progress goes to stderr,
the table to stdout. --torch-first measures the torch row of (e) before the numpy row.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import zmq  # noqa: E402

from _ref_common import pct, progress  # noqa: E402  (shared with the reference runs)

MiB = 1 << 20


# ----------------------------------------------------------------------------- raw floors
# Every socket has SNDHWM = RCVHWM = 0 (unbounded queues, as the runtime's own sockets): with
# the default high-water mark of 1,000 the pipelined floor deadlocked once thousands of
# messages were in flight (the echo peer blocked in send while this side was still sending).
# Receives carry a timeout, so a lost message fails the run instead of hanging it.
_PEER = r"""
import sys, zmq
ctx = zmq.Context()
mode, addr = sys.argv[1], sys.argv[2]
if mode == "rep":
    s = ctx.socket(zmq.REP); s.bind(addr)
    while True:
        m = s.recv()
        if m == b"quit": s.send(b""); break
        s.send(m)
else:  # pull/push echo: receive on addr, reply to sys.argv[3]
    r = ctx.socket(zmq.PULL); r.setsockopt(zmq.RCVHWM, 0); r.bind(addr)
    w = ctx.socket(zmq.PUSH); w.setsockopt(zmq.SNDHWM, 0); w.connect(sys.argv[3])
    while True:
        m = r.recv_multipart()
        if m[0] == b"quit": break
        w.send_multipart(m)
    w.close(linger=5000)
"""
RECV_TIMEOUT_MS = 60_000


def raw_floors(n_rt: int, n_pipe: int) -> dict:
    d = tempfile.mkdtemp(prefix="bench-")
    ctx = zmq.Context()
    ctx.setsockopt(zmq.LINGER, 1000)
    ctx.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
    ctx.setsockopt(zmq.SNDHWM, 0)
    ctx.setsockopt(zmq.RCVHWM, 0)
    out: dict = {}
    peers: list = []
    try:
        progress("floor: raw REQ/REP round trip")
        addr = f"ipc://{d}/rep"
        p = subprocess.Popen([sys.executable, "-c", _PEER, "rep", addr])
        peers.append(p)
        s = ctx.socket(zmq.REQ)
        s.connect(addr)
        for _ in range(200):
            s.send(b"x")
            s.recv()
        lat = []
        for _ in range(n_rt):
            t = time.perf_counter()
            s.send(b"x")
            s.recv()
            lat.append(time.perf_counter() - t)
        s.send(b"quit")
        s.recv()
        p.wait(10)
        s.close()
        out["rt_median"] = statistics.median(lat)
        # broadcast-gather to 4 peers and pipelined messages to one
        progress("floor: broadcast-gather to 4 raw peers")
        back = ctx.socket(zmq.PULL)
        back_addr = f"ipc://{d}/back"
        back.bind(back_addr)
        socks = []
        for i in range(4):
            a = f"ipc://{d}/peer{i}"
            peers.append(subprocess.Popen([sys.executable, "-c", _PEER, "pull", a, back_addr]))
            w = ctx.socket(zmq.PUSH)
            w.connect(a)
            socks.append(w)
        for _ in range(100):
            for w in socks:
                w.send_multipart([b"x"])
            for _ in socks:
                back.recv_multipart()
        lat = []
        for _ in range(max(200, n_rt // 2)):
            t = time.perf_counter()
            for w in socks:
                w.send_multipart([b"x"])
            for _ in socks:
                back.recv_multipart()
            lat.append(time.perf_counter() - t)
        out["gather_median"] = statistics.median(lat)
        progress(f"floor: {n_pipe} pipelined raw messages to one peer (x3)")
        rates = []
        for _ in range(3):  # all sent, then all received (queues unbounded: no deadlock)
            t = time.perf_counter()
            for i in range(n_pipe):
                socks[0].send_multipart([b"x", b"%d" % i])
            for _ in range(n_pipe):
                back.recv_multipart()
            rates.append(n_pipe / (time.perf_counter() - t))
        out["pipe_rate"] = statistics.median(rates)
        for w in socks:
            w.send_multipart([b"quit"])
            w.close()
        for p in peers:
            p.wait(10)
        back.close()
    finally:
        for p in peers:
            if p.poll() is None:
                p.kill()
                p.wait()
        ctx.destroy(linger=0)
        shutil.rmtree(d, ignore_errors=True)
    # memcpy of 64 MiB into warm memory
    progress("floor: memcpy 64 MiB")
    src = np.ones(64 * MiB // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    ts = []
    for _ in range(10):
        t = time.perf_counter()
        np.copyto(dst, src)
        ts.append(time.perf_counter() - t)
    out["memcpy_gbs"] = 64 * MiB / statistics.median(ts) / 1e9
    return out


# ----------------------------------------------------------------------------- ours
T = 60  # seconds: every wait has a timeout, so a lost reply fails the run instead of hanging


def ours(n_rt: int, n_pipe: int, reps_cold: int, torch_first: bool = False) -> dict:
    import psutil

    import runtime
    from runtime import Actor, endpoint, this_host

    class Bench(Actor):
        @endpoint
        def noop(self):
            return None

        @endpoint
        def nbytes(self, a):
            return a.nbytes if hasattr(a, "nbytes") else a.numel() * a.element_size()

    out: dict = {}
    progress(f"ours: cold start x{reps_cold}")
    colds = []
    for _ in range(reps_cold):
        t = time.perf_counter()
        host = this_host()
        pm = host.spawn_procs(per_host={"procs": 4})
        am = pm.spawn("bench", Bench)
        am.noop.call().get(timeout=T)
        colds.append(time.perf_counter() - t)
        pm.stop().get(timeout=30)
        host.shutdown()
    out["cold"] = statistics.median(colds)

    pm = this_host().spawn_procs(per_host={"procs": 4})
    am = pm.spawn("bench", Bench)
    am.noop.call().get(timeout=T)
    one = am.slice(procs=0)
    progress("ours: call_one round trips")
    for _ in range(300):  # steady state for the latency distribution (connections, code paths)
        one.noop.call_one().get(timeout=T)
    lat = []
    for _ in range(n_rt):
        t = time.perf_counter()
        one.noop.call_one().get(timeout=T)
        lat.append(time.perf_counter() - t)
    out["rt_median"] = statistics.median(lat)
    out["rt_p99"] = pct(lat, 99)
    progress("ours: call on 4 + gather")
    lat = []
    for _ in range(max(200, n_rt // 2)):
        t = time.perf_counter()
        am.noop.call().get(timeout=T)
        lat.append(time.perf_counter() - t)
    out["gather_median"] = statistics.median(lat)
    # pipelined: every call is queued before the first reply is awaited; the runtime's
    # sockets have no high-water mark and its I/O threads receive while the caller sends,
    # so this cannot block on a full queue
    progress(f"ours: {n_pipe} pipelined calls to one actor (x3)")
    rates = []
    for _ in range(3):
        t = time.perf_counter()
        futs = [one.noop.call_one() for _ in range(n_pipe)]
        for f in futs:
            f.get(timeout=T)
        rates.append(n_pipe / (time.perf_counter() - t))
    out["pipe_rate"] = statistics.median(rates)
    # 64 MiB arguments: median of 9 calls, the first included (no warm-up: the first call's
    # cost is the user's too; it is also reported on its own)
    import torch

    args = {"numpy": np.ones(64 * MiB // 4, dtype=np.float32),
            "torch": torch.ones(64 * MiB // 4, dtype=torch.float32)}
    for key in (("torch", "numpy") if torch_first else ("numpy", "torch")):
        x = args[key]
        progress(f"ours: 64 MiB {key} argument, 9 calls")
        ts = []
        for _ in range(9):
            t = time.perf_counter()
            assert one.nbytes.call_one(x).get(timeout=T) == 64 * MiB
            ts.append(time.perf_counter() - t)
        out[f"{key}_gbs"] = 64 * MiB / statistics.median(ts) / 1e9
        out[f"{key}_first_s"] = ts[0]
    # idle RSS: a fresh mesh of 4 procs that never imported torch or numpy payloads
    progress("ours: idle RSS of 4 fresh procs")
    pm.stop().get(timeout=30)
    pm2 = this_host().spawn_procs(per_host={"procs": 4})
    pm2.spawn("idle", Bench).noop.call().get(timeout=T)
    time.sleep(0.5)
    out["idle_rss_mib"] = sum(psutil.Process(p.pid).memory_info().rss
                              for p in pm2.procs) / MiB
    pm2.stop().get(timeout=30)
    runtime.shutdown()
    return out


# ----------------------------------------------------------------------------- references
def compare(python: str, quick: bool) -> dict:
    res = {}
    for name in ("ray", "monarch"):
        script = os.path.join(HERE, f"ref_{name}.py")
        progress(f"reference: {name} ({python})")
        # a temporary directory of its own, removed after: Ray keeps a session directory per
        # run and Monarch its sockets and log file under the temporary directory
        tmp = tempfile.mkdtemp(prefix=f"ref-{name}-")
        env = dict(os.environ, PYTHONPATH=HERE, TMPDIR=tmp)
        p = subprocess.Popen([python, script] + (["--quick"] if quick else []),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        err: list[str] = []

        def relay(stream=p.stderr, err=err, name=name) -> None:  # its progress, live
            for ln in stream:
                err.append(ln)
                print(f"  {name}: {ln}", end="", file=sys.stderr, flush=True)

        th = threading.Thread(target=relay, daemon=True)
        th.start()
        timed_out = threading.Event()
        killer = threading.Timer(900, lambda: (timed_out.set(), p.kill()))
        killer.start()
        try:
            stdout = p.stdout.read()
            p.wait()
        finally:
            killer.cancel()
            th.join(10)
            p.stdout.close()
            p.stderr.close()
            shutil.rmtree(tmp, ignore_errors=True)
        line = [ln for ln in stdout.splitlines() if ln.startswith("{")]
        if timed_out.is_set():
            res[name] = {"error": "timed out"}
        elif p.returncode != 0 or not line:
            tail = "".join(err or [stdout]).strip().splitlines()[-1:] or ["no output"]
            res[name] = {"error": tail[0][:120]}
        else:
            res[name] = json.loads(line[-1])
    return res


#: (label, our key, floor key, how a value prints, the ratio's direction, target)
_REPEATED = [
    ("(b) call_one round trip, median", "rt_median", "rt_median", "us", "x", "<= 1.5x"),
    ("(c) call on 4 + gather, median", "gather_median", "gather_median", "us", "x", "<= 1.5x"),
    ("(d) pipelined calls to one actor", "pipe_rate", "pipe_rate", "/s", "%", ">= 50%"),
    ("(e) 64 MiB numpy argument", "numpy_gbs", "memcpy_gbs", "GB/s", "%", ">= 1.8 GB/s"),
    ("(e) 64 MiB torch tensor argument", "torch_gbs", "memcpy_gbs", "GB/s", "%", ">= 1.8 GB/s"),
]


def repeated(n: int, quick: bool) -> int:
    """Run the benchmark `n` times, each in its own process, and print per row the median
    and min-max of ours, of the floor, and of their ratio (each run's own ratio)."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            progress(f"run {i + 1} of {n}")
            out = os.path.join(tmp, f"{i}.json")
            subprocess.run([sys.executable, os.path.abspath(__file__), "--json", out]
                           + (["--quick"] if quick else []), stdout=subprocess.DEVNULL,
                           check=True)
            with open(out) as f:
                runs.append(json.load(f))

    def fmt(v: float, how: str) -> str:
        return {"us": f"{v * 1e6:,.0f} us", "/s": f"{v:,.0f}/s", "GB/s": f"{v:.2f} GB/s",
                "x": f"{v:.2f}x", "%": f"{v:.0%}"}[how]

    def spread(vals: list, how: str) -> str:
        return (f"{fmt(statistics.median(vals), how)} ({fmt(min(vals), how)}-"
                f"{fmt(max(vals), how)})")

    head = ["workload", "monarch-notebook", "floor", "ratio", "ratio, runs in order", "target"]
    table = []
    for label, key, fkey, how, rhow, target in _REPEATED:
        ours_v = [r["ours"][key] for r in runs]
        floor_v = [r["floor"][fkey] for r in runs]
        ratios = [o / f for o, f in zip(ours_v, floor_v)]
        table.append([label, spread(ours_v, how), spread(floor_v, how), spread(ratios, rhow),
                      ", ".join(fmt(x, rhow) for x in ratios), target])
    print(f"{n} runs{' (--quick)' if quick else ''}: median (min-max)")
    widths = [max(len(str(r[i])) for r in [head] + table) for i in range(len(head))]
    print(" | ".join(h.ljust(w) for h, w in zip(head, widths)))
    print("-+-".join("-" * w for w in widths))
    for r in table:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    return 0


def fmt_us(s: float) -> str:
    return f"{s * 1e6:,.0f} us"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer iterations")
    ap.add_argument("--compare", action="store_true", help="also run Ray and Monarch")
    ap.add_argument("--python", default=os.environ.get("BENCH_PYTHON", sys.executable),
                    help="Python with ray/torchmonarch installed, for --compare")
    ap.add_argument("--json", help="write the results here as JSON")
    ap.add_argument("--torch-first", action="store_true",
                    help="(e): measure the torch tensor before the numpy array")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="run the whole measurement N times (each in a fresh process) and "
                         "print median and spread of ours, the floor and their ratio")
    args = ap.parse_args()
    if args.repeat > 1:
        return repeated(args.repeat, args.quick)
    n_rt = 500 if args.quick else 3000
    n_pipe = 2000 if args.quick else 5000
    floor = raw_floors(n_rt, n_pipe)
    us = ours(n_rt, n_pipe, 2 if args.quick else 5, args.torch_first)
    refs = compare(args.python, args.quick) if args.compare else {}
    progress("done")

    rows = [
        ("(a) cold start, 4 procs + actors", f"{us['cold']:.3f} s", "-", "-", "< 0.3 s", "cold"),
        ("(b) call_one round trip, median", fmt_us(us["rt_median"]), fmt_us(floor["rt_median"]),
         f"{us['rt_median'] / floor['rt_median']:.2f}x", "<= 1.5x", "rt_median"),
        ("(b) call_one round trip, p99", fmt_us(us["rt_p99"]), "-", "-", "-", "rt_p99"),
        ("(c) call on 4 + gather, median", fmt_us(us["gather_median"]),
         fmt_us(floor["gather_median"]), f"{us['gather_median'] / floor['gather_median']:.2f}x",
         "<= 1.5x", "gather_median"),
        ("(d) pipelined calls to one actor", f"{us['pipe_rate']:,.0f}/s",
         f"{floor['pipe_rate']:,.0f}/s", f"{us['pipe_rate'] / floor['pipe_rate']:.0%}", ">= 50%",
         "pipe_rate"),
        ("(e) 64 MiB numpy argument", f"{us['numpy_gbs']:.2f} GB/s",
         f"{floor['memcpy_gbs']:.2f} GB/s", f"{us['numpy_gbs'] / floor['memcpy_gbs']:.0%}",
         ">= 1.8 GB/s", "numpy_gbs"),
        ("(e) 64 MiB torch tensor argument", f"{us['torch_gbs']:.2f} GB/s",
         f"{floor['memcpy_gbs']:.2f} GB/s", f"{us['torch_gbs'] / floor['memcpy_gbs']:.0%}",
         ">= 1.8 GB/s", "torch_gbs"),
        ("4 idle procs, RSS in all", f"{us['idle_rss_mib']:.0f} MiB", "-", "-", "< 400 MiB",
         "idle_rss_mib"),
    ]
    head = ["workload", "monarch-notebook", "floor (raw pyzmq/memcpy)", "ratio", "target"]
    ref_names = list(refs)
    head += ref_names
    table = []
    for label, mine, fl, ratio, target, key in rows:
        extra = []
        for n in ref_names:
            r = refs[n]
            if "error" in r:
                extra.append("n/a")
            elif key not in r:
                extra.append("-")
            else:
                v = r[key]
                extra.append(fmt_us(v) if key.startswith(("rt", "gather")) else
                             f"{v:.3f} s" if key == "cold" else
                             f"{v:,.0f}/s" if key == "pipe_rate" else
                             f"{v:.0f} MiB" if key == "idle_rss_mib" else f"{v:.2f} GB/s")
        table.append([label, mine, fl, ratio, target] + extra)
    widths = [max(len(str(r[i])) for r in [head] + table) for i in range(len(head))]
    print(" | ".join(h.ljust(w) for h, w in zip(head, widths)))
    print("-+-".join("-" * w for w in widths))
    for r in table:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    first = (("torch", "numpy") if args.torch_first else ("numpy", "torch"))
    print(f"(e) first call of each row, in the order measured (included in the median): "
          + ", ".join(f"{k} {us[k + '_first_s'] * 1e3:,.0f} ms" for k in first)
          + " (a proc imports numpy, and torch, on its first such argument)")
    for n, r in refs.items():
        if "error" in r:
            print(f"{n}: not run ({r['error']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ours": us, "floor": floor, "refs": refs}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
