"""What a call leaves for the garbage collector (docs/benchmarks.md: with thousands of calls
in flight, every tracked object per call makes full collections come sooner): a call in
flight holds a handful of tracked objects, and a finished call leaves no reference cycle."""

from __future__ import annotations

import collections
import gc

import pytest

from _actors import Ledger
from _procs import spawn_procs_fixture

pytestmark = pytest.mark.timeout(120)
N = 500


procs = spawn_procs_fixture({"procs": 1}, "gcobj")


@pytest.fixture(scope="module")
def ledger(procs):
    m = procs.spawn("ledger", Ledger)
    m.add.call_one(0, 0).get(timeout=30)
    return m


def _tracked() -> collections.Counter:
    return collections.Counter(type(o).__name__ for o in gc.get_objects())


def test_a_call_in_flight_holds_few_tracked_objects(ledger, tmp_path):
    for _ in range(50):  # the paths warm (sockets, caches)
        ledger.add.call_one(0, 0).get(timeout=30)
    gate = tmp_path / "go"
    busy = ledger.hold.call_one(str(gate))  # busy until the gate opens: the calls below
    # wait unanswered however slow this machine is
    gc.collect()
    gc.disable()
    try:
        before = _tracked()
        futs = [ledger.add.call_one(1, i) for i in range(N)]
        grown = _tracked() - before
    finally:
        gc.enable()
    gate.touch()
    per_call = sum(grown.values()) / N
    assert per_call <= 5.5, f"{per_call:.1f} tracked objects per call in flight: {grown}"
    assert busy.get(timeout=30) is True
    assert [f.get(timeout=30) for f in futs] == list(range(N))


@pytest.mark.parametrize("adverb", ["call_one", "call", "pipelined"])
def test_a_finished_call_leaves_no_cycle(ledger, adverb):
    one = ledger.slice(procs=0)
    gc.collect()
    gc.disable()
    try:
        if adverb == "pipelined":
            futs = [one.add.call_one(2, i) for i in range(N)]
            for f in futs:
                f.get(timeout=30)
            del futs
        else:
            for i in range(N):
                getattr(ledger.add, adverb)(2, i).get(timeout=30)
        unreachable = gc.collect()
    finally:
        gc.enable()
    assert unreachable / N < 0.1, f"{unreachable} objects in cycles after {N} calls"
