"""The timeline (runtime/timeline.py): each proc records its endpoint calls and spans in a
bounded ring, `runtime.read_timeline` reads them through the procs' I/O threads, and the
Chrome trace export is valid trace-event JSON; `monarch_widgets.timeline_html` draws a lane
per rank with failures marked."""
from __future__ import annotations

import json
import os
import re
import stat

import pytest

import runtime
from _util import wait_until
from monarch_widgets.timeline_view import timeline_html
from runtime import timeline
from tests._observe_actors import Worker

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def workers():
    pm = runtime.this_host().spawn_procs(per_host={"procs": 2}, name="tl")
    try:
        yield pm, pm.spawn("w", Worker)
    finally:
        pm.stop().get(timeout=30)


def _check_chrome_trace(doc: dict) -> list[dict]:
    """Every event has the fields the trace-event format requires; returns the X events."""
    assert isinstance(doc["traceEvents"], list)
    for ev in doc["traceEvents"]:
        assert ev["ph"] in ("X", "M") and isinstance(ev["pid"], int) and "name" in ev
        if ev["ph"] == "X":
            assert isinstance(ev["ts"], float) and ev["ts"] >= 0 and ev["dur"] >= 0
            assert isinstance(ev["tid"], int)
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def test_calls_and_spans_of_each_rank_with_failures(workers, tmp_path):
    pm, w = workers
    w.step.call(1).get(timeout=30)
    with pytest.raises(runtime.ActorError):
        w.step.call(-1).get(timeout=30)
    assert list(w.traced_step.call().get(timeout=30).values()) == [1, 1]
    tl = runtime.read_timeline(w, last=120)
    assert [lane.rank for lane in tl.lanes] == [0, 1]
    pids = {p.pid for p in pm.procs}
    for lane in tl.lanes:
        assert lane.pid in pids and not lane.error
        calls = [(r[3], r[6]) for r in lane.records if r[2] == "call"]
        assert calls == [("step", False), ("step", True), ("traced_step", False)], calls
        spans = [(r[3], r[4], r[5]) for r in lane.records if r[2] == "span"]
        assert spans == [("inner", "w", lane.rank), ("inner", "w", lane.rank),
                         ("Worker.traced_step", "w", lane.rank)], spans
        for r in lane.records:
            assert tl.start_ns <= r[0] <= r[1] <= tl.end_ns
    assert "rank 1: 3 calls" in str(tl) and "1 failed" in str(tl)
    path = tl.save_chrome_trace(str(tmp_path / "trace.json"))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as f:
        events = _check_chrome_trace(json.load(f))
    assert sorted(e["name"] for e in events if e["args"]["failed"]) == ["step", "step"]
    assert {e["pid"] for e in events} == pids
    drawn = timeline_html(tl)
    assert drawn.count('class="mt-lane"') == 2
    assert drawn.count('class="mt-call mt-failed"') == 2 and drawn.count("mt-fail-mark") == 2


def test_last_keeps_only_recent_records_and_bad_arguments_are_named(workers):
    pm, w = workers
    w.step.call(1).get(timeout=30)
    end = runtime.read_timeline(pm, last=60).end_ns
    w.step.call(2).get(timeout=30)
    recent = runtime.read_timeline(pm, last=(timeline.now_ns() - end) / 1e9)
    assert all(r[0] >= end for r in recent.records)
    assert len([r for r in recent.records if r[2] == "call"]) == 2  # one per rank
    with pytest.raises(ValueError, match="last must be a positive number"):
        runtime.read_timeline(pm, last=0)
    with pytest.raises(TypeError, match="expected a ProcMesh or ActorMesh, got int"):
        runtime.read_timeline(3)


def test_the_ring_is_bounded_and_a_dead_proc_gets_a_lane_saying_so():
    with runtime.configured(timeline_records=4):
        pm = runtime.this_host().spawn_procs(per_host={"procs": 2}, name="tlring")
    try:
        w = pm.spawn("w", Worker)
        for i in range(10):
            w.step.call(i).get(timeout=30)
        tl = runtime.read_timeline(pm, last=120)
        for lane in tl.lanes:  # the newest 4 of 20 records: steps 8 and 9 with their spans
            assert len(lane.records) == 4
            assert [r[2] for r in lane.records] == ["span", "call", "span", "call"]
        rt = runtime.get_runtime()
        rt.kill_proc(pm.procs[1].proc_id)  # through its agent: known dead a moment later
        wait_until(lambda: rt.proc_state(pm.procs[1].proc_id) == "failed", 30,
                   "the killed proc's death is known")
        with pytest.raises(runtime.SupervisionError):
            w.step.call(1).get(timeout=30)
        tl = runtime.read_timeline(pm, last=120, timeout=5)
        assert len(tl.lanes[0].records) == 4 and not tl.lanes[0].error
        assert tl.lanes[1].records == [] and tl.lanes[1].error
        assert re.search(r"rank 1: 0 calls .*\[.+\]", str(tl)), str(tl)
    finally:
        pm.stop().get(timeout=30)


def test_spans_in_the_controller_and_the_trace_of_made_up_lanes():
    t0 = timeline.now_ns()
    with runtime.span("here"):
        pass
    mine = [r for r in timeline.snapshot(t0) if r[3] == "here"]
    assert len(mine) == 1 and mine[0][2:] == ("span", "here", "", -1, False)
    lanes = [timeline.Lane("m", 1, "h", 11, records=[(2_000, 5_000, "call", "f", "a", 1, True)]),
             timeline.Lane("m", 0, "h", 10, records=[(1_000, 3_000, "span", "s", "a", 0, False)])]
    tl = timeline.make_timeline("m", lanes, last_s=5e-6, end_ns=6_000)  # from 1_000 ns
    assert [lane.rank for lane in tl.lanes] == [0, 1]
    events = _check_chrome_trace(json.loads(json.dumps(tl.to_chrome_trace())))
    assert [(e["name"], e["ts"], e["dur"], e["tid"]) for e in events] == [
        ("s", 0.0, 2.0, 2), ("f", 1.0, 3.0, 1)]
    early = timeline.make_timeline("m", lanes, last_s=1e-6, end_ns=6_000)  # from 5_000 ns
    assert [e["ts"] for e in _check_chrome_trace(early.to_chrome_trace())] == [0.0, 1.0]
    with pytest.raises(ValueError, match="non-negative"):
        timeline.reset(-1)


def test_a_drawing_stays_small_however_many_records():
    recs = [(i * 1000, i * 1000 + 500, "call", "f", "a", 0, i == 5000) for i in range(20_000)]
    tl = timeline.Timeline("m", [timeline.Lane("m", 0, records=recs)], 0, 20_000_000)
    drawn = timeline_html(tl, width=600)
    assert drawn.count("<rect class=") <= 600 and drawn.count("mt-failed") == 1
    assert re.search(r'data-count="\d{2,}"', drawn)  # merged bars say how many they hold
    with pytest.raises(ValueError, match="width must be at least"):
        timeline_html(tl, width=50)
