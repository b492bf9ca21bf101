"""Shared timing helpers for the reference runs (Ray, Monarch); no project imports."""

import json
import statistics
import sys
import time

MiB = 1 << 20
_T0 = time.perf_counter()


def progress(msg):
    """One line on stderr saying what runs now (stdout keeps only the results)."""
    print(f"[{time.perf_counter() - _T0:6.1f} s] {msg}", file=sys.stderr, flush=True)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def measure(call_one, call_all, pipelined, send_array, n_rt, n_pipe):
    """Run workloads (b)-(e) given four callables; returns a dict of figures."""
    import numpy as np
    import torch

    out = {}
    progress("round trips (call_one)")
    for _ in range(100):
        call_one()
    lat = []
    for _ in range(n_rt):
        t = time.perf_counter()
        call_one()
        lat.append(time.perf_counter() - t)
    out["rt_median"] = statistics.median(lat)
    out["rt_p99"] = pct(lat, 99)
    progress("call on all + gather")
    lat = []
    for _ in range(max(200, n_rt // 2)):
        t = time.perf_counter()
        call_all()
        lat.append(time.perf_counter() - t)
    out["gather_median"] = statistics.median(lat)
    progress(f"{n_pipe} pipelined calls")
    t = time.perf_counter()
    pipelined(n_pipe)
    out["pipe_rate"] = n_pipe / (time.perf_counter() - t)
    # 64 MiB arguments: median of 9 calls, the first included (no warm-up: a first-call
    # cost is part of what a user pays), numpy then torch as in bench_runtime.py
    for key, x in (("numpy", np.ones(64 * MiB // 4, dtype=np.float32)),
                   ("torch", torch.ones(64 * MiB // 4))):
        progress(f"64 MiB {key} argument, 9 calls")
        ts = []
        for _ in range(9):
            t = time.perf_counter()
            send_array(x)
            ts.append(time.perf_counter() - t)
        out[f"{key}_gbs"] = 64 * MiB / statistics.median(ts) / 1e9
        out[f"{key}_first_s"] = ts[0]
    return out


def emit(d):
    print(json.dumps(d), flush=True)


def quick():
    return "--quick" in sys.argv
