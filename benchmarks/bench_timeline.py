"""What recording the timeline (%mesh timeline) costs an endpoint call, and its memory.

    PYTHONPATH=. python benchmarks/bench_timeline.py [--n 200000] [--rounds 7]

Per call, the proc does `t0 = timeline.now_ns()` before the endpoint and
`timeline.record_call(...)` after it (runtime/proc/_actor_instance.py,
ActorInstance._handle_call). The table times that pair against a floor measured in the same run: the same loop calling an
empty function with the same arguments (what any hook costs). The medians of `--rounds`
rounds are printed, with their difference (the recording's own cost) and ratio; then a
user span (`runtime.span`, mostly OpenTelemetry's own cost when its API is installed)
and the timeline's part of it against `contextlib.nullcontext()`, and the bytes one full
ring of `timeline_records` records holds.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime import span, timeline  # noqa: E402
from runtime.config import config  # noqa: E402


def _noop(t0: int, name: str, actor: str, rank: int, failed: bool) -> None:
    return None


def floor_loop(n: int) -> float:
    now, hook = time.perf_counter_ns, _noop
    t = time.perf_counter()
    for _ in range(n):
        t0 = 0
        errors0 = 0
        hook(t0, "step", "trainers", 3, 0 != errors0)
    return (time.perf_counter() - t) / n


def record_loop(n: int) -> float:
    now, record = timeline.now_ns, timeline.record_call
    t = time.perf_counter()
    for _ in range(n):
        t0 = now()
        errors0 = 0
        record(t0, "step", "trainers", 3, 0 != errors0)
    return (time.perf_counter() - t) / n


def record_span_loop(n: int) -> float:
    now, record = timeline.now_ns, timeline.record_span
    t = time.perf_counter()
    for _ in range(n):
        t0 = now()
        record(t0, "step", False)
    return (time.perf_counter() - t) / n


def null_span_loop(n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        with contextlib.nullcontext():
            pass
    return (time.perf_counter() - t) / n


def span_loop(n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        with span("step"):
            pass
    return (time.perf_counter() - t) / n


def ring_bytes(n: int) -> int:
    timeline.reset(n)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        timeline.record_call(timeline.now_ns(), "step", "trainers", 3, False)
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return used


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000, help="calls per round")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    timeline.reset(config.timeline_records)
    floor, rec, nspan, sspan, rspan = [], [], [], [], []
    for _ in range(a.rounds):  # interleaved, so machine load hits both alike
        floor.append(floor_loop(a.n))
        rec.append(record_loop(a.n))
        nspan.append(null_span_loop(a.n // 4))
        sspan.append(span_loop(a.n // 4))
        rspan.append(record_span_loop(a.n))
    f, r = statistics.median(floor), statistics.median(rec)
    ns, ss, rs = statistics.median(nspan), statistics.median(sspan), statistics.median(rspan)
    try:
        import opentelemetry  # noqa: F401
        otel = "OTel API"
    except ImportError:
        otel = "no OTel"
    print(f"per call, median of {a.rounds} rounds of {a.n:,} (Python {sys.version.split()[0]})")
    print(f"{'what':<44}{'ns/call':>10}{'x floor':>10}")
    print(f"{'floor: empty hook call, same arguments':<44}{f * 1e9:>10.0f}{1.0:>10.2f}")
    print(f"{'now_ns() + record_call() (the proc hook)':<44}{r * 1e9:>10.0f}{r / f:>10.2f}")
    print(f"{'  recording itself (difference)':<44}{(r - f) * 1e9:>10.0f}")
    print(f"{'nullcontext() with-block':<44}{ns * 1e9:>10.0f}{1.0:>10.2f}")
    print(f"{'runtime.span() with-block (' + otel + ')':<44}{ss * 1e9:>10.0f}{ss / ns:>10.2f}")
    print(f"{'  of which the timeline: record_span()':<44}{rs * 1e9:>10.0f}{rs / ns:>10.2f}")
    n = config.timeline_records
    b = ring_bytes(n)
    print(f"memory: a full ring of {n:,} records (timeline_records) holds {b / 1e6:.2f} MB "
          f"({b / max(1, n):.0f} bytes/record)")


if __name__ == "__main__":
    main()
