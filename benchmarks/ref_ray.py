"""Reference run on Ray, same workloads as bench_runtime.py. Prints one JSON line."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ref_common import emit, measure, quick  # noqa: E402

import ray  # noqa: E402


@ray.remote
class Bench:
    def noop(self):
        return None

    def nbytes(self, a):
        return a.nbytes if hasattr(a, "nbytes") else a.numel() * a.element_size()


def main():
    t = time.perf_counter()
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR")
    actors = [Bench.remote() for _ in range(4)]
    ray.get([a.noop.remote() for a in actors])
    cold = time.perf_counter() - t
    one = actors[0]

    def pipelined(n):
        ray.get([one.noop.remote() for _ in range(n)])

    n_rt = 300 if quick() else 2000
    out = measure(lambda: ray.get(one.noop.remote()),
                  lambda: ray.get([a.noop.remote() for a in actors]), pipelined,
                  lambda a: ray.get(one.nbytes.remote(a)), n_rt, 1000 if quick() else 5000)
    out["cold"] = cold
    ray.shutdown()
    emit(out)


if __name__ == "__main__":
    main()
