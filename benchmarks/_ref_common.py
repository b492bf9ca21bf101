"""Shared timing helpers for the reference runs (Ray, Monarch); no project imports."""

import json
import statistics
import sys
import time

MiB = 1 << 20


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def measure(call_one, call_all, pipelined, send_array, n_rt, n_pipe):
    """Run workloads (b)-(e) given four callables; returns a dict of figures."""
    import numpy as np
    import torch

    out = {}
    for _ in range(100):
        call_one()
    lat = []
    for _ in range(n_rt):
        t = time.perf_counter()
        call_one()
        lat.append(time.perf_counter() - t)
    out["rt_median"] = statistics.median(lat)
    out["rt_p99"] = pct(lat, 99)
    lat = []
    for _ in range(max(200, n_rt // 2)):
        t = time.perf_counter()
        call_all()
        lat.append(time.perf_counter() - t)
    out["gather_median"] = statistics.median(lat)
    t = time.perf_counter()
    pipelined(n_pipe)
    out["pipe_rate"] = n_pipe / (time.perf_counter() - t)
    a = np.ones(64 * MiB // 4, dtype=np.float32)
    send_array(a)
    ts = []
    for _ in range(3):
        t = time.perf_counter()
        send_array(a)
        ts.append(time.perf_counter() - t)
    out["numpy_gbs"] = a.nbytes / statistics.median(ts) / 1e9
    tt = torch.ones(64 * MiB // 4)
    send_array(tt)
    ts = []
    for _ in range(3):
        t = time.perf_counter()
        send_array(tt)
        ts.append(time.perf_counter() - t)
    out["torch_gbs"] = a.nbytes / statistics.median(ts) / 1e9
    return out


def emit(d):
    print(json.dumps(d), flush=True)


def quick():
    return "--quick" in sys.argv
