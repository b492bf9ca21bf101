"""Reference run on PyTorch Monarch (torchmonarch), same workloads as bench_runtime.py.
Run with a Python that has torchmonarch installed; prints one JSON line."""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ref_common import emit, measure, quick  # noqa: E402

from monarch.actor import this_host  # noqa: E402
from _ref_actors import Bench  # noqa: E402


def main():
    colds = []
    for _ in range(2 if quick() else 3):
        t = time.perf_counter()
        pm = this_host().spawn_procs(per_host={"procs": 4})
        am = pm.spawn("bench", Bench)
        am.noop.call().get()
        colds.append(time.perf_counter() - t)
        pm.stop().get()
    pm = this_host().spawn_procs(per_host={"procs": 4})
    am = pm.spawn("bench", Bench)
    am.noop.call().get()
    one = am.slice(procs=0)

    def pipelined(n):
        futs = [one.noop.call_one() for _ in range(n)]
        for f in futs:
            f.get()

    n_rt = 300 if quick() else 2000
    out = measure(lambda: one.noop.call_one().get(), lambda: am.noop.call().get(), pipelined,
                  lambda a: one.nbytes.call_one(a).get(), n_rt, 1000 if quick() else 5000)
    out["cold"] = statistics.median(colds)
    import psutil

    kids = psutil.Process().children(recursive=True)
    out["idle_rss_mib"] = sum(k.memory_info().rss for k in kids) / (1 << 20)
    pm.stop().get()
    emit(out)
    os._exit(0)


if __name__ == "__main__":
    main()
