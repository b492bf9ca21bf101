"""Latency of Tab and Shift-Tab in %%mesh cells (answered by a proc), seen by a client.

    PYTHONPATH=. python benchmarks/bench_completion.py [--n 60]

Starts a Monarch kernel (jupyter_client, the test suite's temporary kernelspec) with a
2-proc mesh, then times complete_request and inspect_request round trips from the client:
%%mesh bodies answered remotely by rank 0, against a floor measured in the same run
(the same completions outside %%mesh, answered in the kernel). Target: remote completion
median under 150 ms. The table goes to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "kernel"))

from _kernel_helpers import install_kernelspec, kill_all, snapshot  # noqa: E402

SETUP = ("class Model:\n"
         "    def __init__(self):\n"
         "        self.hidden_size = 4\n"
         "    def forward(self, x: int) -> int:\n"
         "        '''Run it.'''\n"
         "        return x\n"
         "model = Model()\n"
         "remote_only = 1\n")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def execute(kc, code: str) -> None:
    reply = kc.execute(code, reply=True, timeout=120)
    if reply["content"]["status"] != "ok":
        raise SystemExit(f"cell failed: {code!r}: {reply['content']}")


def time_requests(kc, kind: str, code: str, n: int, want: str) -> tuple[list[float], int]:
    """Round-trip times (ms) of n requests; how many were answered by a proc."""
    times, remote = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        if kind == "complete":
            c = kc.complete(code, len(code), reply=True, timeout=10)["content"]
            ok = want in c["matches"]
            remote += c["metadata"].get("monarch", {}).get("source") == "remote"
        else:
            c = kc.inspect(code, len(code), reply=True, timeout=10)["content"]
            ok = c["found"] and want in c["data"]["text/plain"]
            remote += c["data"]["text/plain"].startswith("[mesh")
        times.append((time.perf_counter() - t0) * 1e3)
        if not ok:
            raise SystemExit(f"{kind} of {code!r} did not find {want!r}: {c}")
    return times, remote


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=60, help="requests per row (default 60)")
    a = ap.parse_args()
    from jupyter_client.manager import start_new_kernel

    install_kernelspec()
    print("starting a kernel and 2 procs", file=sys.stderr)
    km, kc = start_new_kernel(kernel_name="monarch", startup_timeout=60)
    pids: dict[int, float] = {}
    try:
        execute(kc, "%mesh alloc procs --per-host procs=2 --no-progress")
        execute(kc, "import os, psutil\n_pids = [os.getpid()] + [c.pid for c in "
                    "psutil.Process().children(recursive=True)]")
        r = kc.execute("_pids", reply=False)
        while True:
            msg = kc.get_iopub_msg(timeout=30)
            if msg["parent_header"].get("msg_id") == r and msg["msg_type"] == "execute_result":
                pids = snapshot(eval(msg["content"]["data"]["text/plain"]))
                break
        execute(kc, "%%mesh procs\n" + SETUP)
        execute(kc, SETUP)  # the floor completes the same names in the kernel
        rows = [
            ("complete %%mesh: name", "complete", "%%mesh procs\nremote_o", "remote_only"),
            ("complete %%mesh: attribute", "complete", "%%mesh procs\nmodel.hid",
             "hidden_size"),
            ("inspect %%mesh: method", "inspect", "%%mesh procs\nmodel.forward", "Run it."),
            ("floor, in the kernel: name", "complete", "remote_o", "remote_only"),
            ("floor, in the kernel: attribute", "complete", "model.hid", "hidden_size"),
            ("floor, in the kernel: inspect", "inspect", "model.forward", "Run it."),
        ]
        results = []
        for label, kind, code, want in rows:
            time_requests(kc, kind, code, 5, want)  # warm-up (jedi, imports)
            print(f"  {label}", file=sys.stderr)
            times, remote = time_requests(kc, kind, code, a.n, want)
            results.append((label, times, remote))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        kill_all(pids)
    floor = {"complete": statistics.median(results[3][1] + results[4][1]),
             "inspect": statistics.median(results[5][1])}
    print(f"\nRound trip seen by a jupyter_client client, {a.n} requests per row (ms)\n")
    print(f"{'request':<34}{'median':>8}{'p95':>8}{'max':>8}{'remote':>8}{'/floor':>8}")
    for (label, kind, _, _), (_, times, remote) in zip(rows, results):
        med = statistics.median(times)
        print(f"{label:<34}{med:8.1f}{pct(times, 0.95):8.1f}{max(times):8.1f}"
              f"{remote:>5}/{len(times):<2}{med / floor[kind]:8.2f}")
    both = results[0][1] + results[1][1]
    med = statistics.median(both)
    print(f"\nremote completion median {med:.1f} ms, p95 {pct(both, 0.95):.1f} ms "
          f"(target < 150 ms: {'met' if med < 150 else 'NOT met'})")


if __name__ == "__main__":
    main()
