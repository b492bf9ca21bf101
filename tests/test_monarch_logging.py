"""ProcMesh.logging_option through the public API: aggregation of lines from many ranks
(sink and script), stream_to_client=False, the level of Actor.logger, flushes."""
from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import runtime
from runtime import Future, this_host

from _monarch_context_actors import Printer

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parent.parent


class Sink:
    def __init__(self) -> None:
        self.got: list = []
        self.cv = threading.Condition()

    def __call__(self, label, stream, text) -> None:
        with self.cv:
            self.got.append((label, stream, text))
            self.cv.notify_all()

    def wait(self, pred, timeout: float = 15) -> bool:
        with self.cv:
            return self.cv.wait_for(lambda: pred(self.got), timeout)


@pytest.fixture
def sink():
    rt = runtime.get_runtime()
    s = Sink()
    rt.set_output_sink(s)
    yield s
    rt.set_output_sink(None)


def _in_tail(pm, needle: str) -> bool:
    rt = runtime.get_runtime()
    return all(any(needle in ln for ln in rt.output_tail(p.proc_id)) for p in pm.procs)


def test_similar_lines_from_many_ranks_print_once(sink):
    with this_host().spawn_procs(per_host={"gpus": 4}) as pm:
        f = pm.logging_option(stream_to_client=True, aggregate_window_sec=1)
        assert isinstance(f, Future) and f.get() is None
        p = pm.spawn("printer", Printer)
        p.say.call("loss 0.13").get(timeout=30)
        assert sink.wait(lambda g: any("similar" in lbl for lbl, _, _ in g))
        agg = [(lbl, t) for lbl, _, t in sink.got if "loss" in t]
        assert agg == [("4 similar log lines", "[printer 0-3] loss 0.13\n")]
        # line by line again without a window; Monarch's form: asyncio.run(...) of it
        import asyncio

        assert asyncio.run(pm.logging_option(aggregate_window_sec=None)) is None

        async def main():
            return await pm.logging_option(aggregate_window_sec=None)

        assert asyncio.run(main()) is None
        p.say.call("each on its own").get(timeout=30)
        assert sink.wait(lambda g: sum("each on its own" in t for _, _, t in g) == 4)
        assert sorted(lbl for lbl, _, t in sink.got if "each on its own" in t) == [
            "printer 0", "printer 1", "printer 2", "printer 3"]


def test_a_line_whose_newline_comes_late_is_one_line(sink):
    """A line written in two parts, its newline after the agent flushed the first (print's
    text and its newline are two writes, far apart on a loaded machine): one line per rank,
    aggregated or not, with the actor's label; no empty line (it was one, labelled with the
    mesh, and counted by the aggregation)."""
    with this_host().spawn_procs(per_host={"procs": 2}) as pm:
        pm.logging_option(stream_to_client=True, aggregate_window_sec=1).get()
        p = pm.spawn("slowly", Printer)
        p.say_slowly.call("late newline", 0.4).get(timeout=30)
        p.say.call("after").get(timeout=30)
        assert sink.wait(lambda g: any("after" in t for _, _, t in g))
        assert [(lbl, t) for lbl, _, t in sink.got if "similar" in lbl] == [
            ("2 similar log lines", "[slowly 0-1] late newline\n"),
            ("2 similar log lines", "[slowly 0-1] after\n")], sink.got
        for proc in pm.procs:
            kept = runtime.get_runtime().output_tail(proc.proc_id)
            assert "[stdout] late newline" in kept and "[stdout] " not in kept, kept
        pm.logging_option(aggregate_window_sec=None).get()
        sink.got.clear()
        p.say_slowly.call("late again", 0.4).get(timeout=30)
        p.say.call("end").get(timeout=30)
        assert sink.wait(lambda g: sum("end" in t for _, _, t in g) == 2)
        by_rank = {lbl: "".join(t for l2, _, t in sink.got if l2 == lbl)
                   for lbl, _, _ in sink.got}
        assert by_rank == {"slowly 0": "late again\nend\n", "slowly 1": "late again\nend\n"}, \
            sink.got


def test_stream_off_keeps_lines_in_the_procs_log(sink):
    with this_host().spawn_procs(per_host={"gpus": 2}) as pm:
        pm.logging_option(stream_to_client=False)
        p = pm.spawn("quiet", Printer)
        p.say.call("not streamed").get(timeout=30)
        deadline = time.monotonic() + 10
        while not _in_tail(pm, "not streamed") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _in_tail(pm, "not streamed")
        assert not any("not streamed" in t for _, _, t in sink.got)


def test_held_lines_flush_on_request_and_at_stop(sink):
    rt = runtime.get_runtime()
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        pm.logging_option(aggregate_window_sec=1000)  # never on its own
        p = pm.spawn("held", Printer)
        p.say.call("first batch").get(timeout=30)
        deadline = time.monotonic() + 10
        while not _in_tail(pm, "first batch") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not any("first batch" in t for _, _, t in sink.got)
        rt.flush_output()  # what the notebook kernel does when a cell ends
        assert ("2 similar log lines", "stdout", "[held 0-1] first batch\n") in sink.got
        p.say.call("second batch").get(timeout=30)
    finally:
        pm.stop().get(timeout=30)
    assert ("2 similar log lines", "stdout", "[held 0-1] second batch\n") in sink.got


def test_level_of_actor_logger(sink):
    with this_host().spawn_procs(per_host={"gpus": 2}) as pm:
        p = pm.spawn("dbg", Printer)
        p.debug.call("hidden debug").get(timeout=30)
        pm.logging_option(aggregate_window_sec=None, level=logging.DEBUG)
        p.debug.call("shown debug").get(timeout=30)
        assert sink.wait(lambda g: sum("shown debug" in t for _, _, t in g) == 2)
        assert not any("hidden debug" in t for _, _, t in sink.got)
        with pytest.raises(ValueError, match="logging level"):
            pm.logging_option(level=300)
        with pytest.raises(ValueError, match="aggregate_window_sec"):
            pm.logging_option(aggregate_window_sec=0)


SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, "tests")
    from runtime import this_host
    from _monarch_context_actors import Printer
    pm = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 8})
    pm.logging_option(stream_to_client=True, aggregate_window_sec=3)
    p = pm.spawn("trainers", Printer)
    p.say.call("loss 0.13").get()
    pm.stop().get()
""")


def test_a_script_prints_the_aggregated_line():
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                       text=True, timeout=100)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [ln for ln in r.stdout.splitlines() if "loss" in ln]
    assert lines == ["[16 similar log lines] [trainers 0-15] loss 0.13"], r.stdout
