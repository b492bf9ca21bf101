"""Line breakpoints set from the controller (what the Jupyter Debugger panel's gutter sets)
through real procs, without a kernel: set live, reaching procs spawned later, answered with
structured requests (stack, scopes, variables, evaluate), stepping, continuing, cleared;
and no trace function in an actor while no breakpoint is set."""

import json
import sys
import time

import numpy as np
import pytest

import runtime
from runtime import Actor, endpoint, this_host
from runtime.debugging import settings
from runtime.debugging.registry import DebugError

pytestmark = pytest.mark.timeout(120)


class Lines(Actor):
    @endpoint
    def work(self, x):
        arr = np.arange(6, dtype=np.float32).reshape(2, 3) * x
        info = {"x": x, "tag": "w"}
        y = x * 10  # LINE-A
        z = y + 1
        return z

    @endpoint
    def other(self, x):
        return x + 1

    @endpoint
    def tracing(self):
        return sys.gettrace() is not None


with open(__file__) as _f:
    LINE_A = next(i for i, ln in enumerate(_f, 1) if ln.rstrip().endswith("# LINE-A"))


@pytest.fixture(scope="module")
def procs():
    p = this_host().spawn_procs(per_host={"procs": 3}, name="lineprocs")
    yield p
    runtime.debugging.set_line_breakpoints(__file__, [])
    runtime.shutdown()


@pytest.fixture
def reg(procs):
    settings.reset()
    settings.set_timeout(600)
    r = runtime.debugging.get_registry()
    yield r
    runtime.debugging.set_line_breakpoints(__file__, [])
    r.continue_all(clear=True)
    settings.reset()


def wait_paused(reg, n, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ps = [s for s in reg.paused()]
        if len(ps) >= n:
            return sorted(ps, key=lambda s: s.rank)
        time.sleep(0.02)
    raise AssertionError(f"expected {n} paused sessions, have {reg.sessions()}")


def wait_state(reg, s, timeout=10.0):
    return reg.wait(s, timeout)[1]


def test_no_tracer_without_breakpoints(procs, reg):
    m = procs.spawn("notrace", Lines)
    assert list(m.tracing.call().get(10).values()) == [False] * 3
    # the table goes to every proc from this thread before it returns, so the next call
    # from this thread finds it there (no wait)
    runtime.debugging.set_line_breakpoints(__file__, [LINE_A])
    assert list(m.tracing.call().get(10).values()) == [True] * 3  # armed
    runtime.debugging.set_line_breakpoints(__file__, [])
    m.tracing.call().get(10)  # the first call after clearing disarms
    assert list(m.tracing.call().get(10).values()) == [False] * 3
    m.stop().get(10)


def test_line_breakpoint_stack_variables_evaluate_step(procs, reg):
    m = procs.spawn("lines", Lines)
    m.other.call(1).get(10)
    runtime.debugging.set_line_breakpoints(__file__, [LINE_A])  # live: the mesh runs
    fut = m.work.call(3)
    sessions = wait_paused(reg, 3)
    assert [s.rank for s in sessions] == [0, 1, 2]
    dap = runtime.debugging.get_dap_client()
    for s in sessions:
        assert (s.file, s.line, s.function) == (__file__, LINE_A, "work")
        st = dap.request(s, "stackTrace")
        top = st["frames"][0]
        assert (top["file"], top["line"], top["name"]) == (__file__, LINE_A, "work")
        assert all("proc.py" not in f["file"] for f in st["frames"])
        scopes = dap.request(s, "scopes", {"frame": top["index"]})["scopes"]
        assert [sc["name"] for sc in scopes] == ["Locals", "Globals"]
        vs = {v["name"]: v for v in dap.request(
            s, "variables", {"ref": scopes[0]["variablesReference"]})["variables"]}
        assert vs["x"]["value"] == "3"
        assert vs["arr"]["value"].startswith("ndarray(shape=(2, 3), dtype=float32) [0, 3, 6")
        kids = dap.request(s, "variables", {"ref": vs["info"]["variablesReference"]})
        assert {v["name"]: v["value"] for v in kids["variables"]} == {"x": "3", "tag": "'w'"}
        ev = dap.request(s, "evaluate", {"expression": "x * 7 + arr.shape[1]"})
        assert ev["result"] == "24"
        with pytest.raises(DebugError, match="NameError"):
            dap.request(s, "evaluate", {"expression": "nope + 1"})
    s0 = sessions[0]
    reg.send_line(s0, "next")
    assert wait_state(reg, s0) == "paused" and s0.line == LINE_A + 1
    assert dap.request(s0, "evaluate", {"expression": "y"})["result"] == "30"
    for s in sessions:
        reg.release(s)
    assert list(fut.get(10).values()) == [31] * 3
    # the breakpoint stays: the next call stops again; cleared live, it does not
    one = m.slice(procs=1)
    fut = one.work.call_one(1)
    (s,) = wait_paused(reg, 1)
    runtime.debugging.set_line_breakpoints(__file__, [])
    reg.release(s)
    assert fut.get(10) == 11
    assert one.work.call_one(2).get(10) == 21
    m.stop().get(10)


def test_breakpoint_reaches_procs_spawned_later(reg):
    """Procs spawned after a breakpoint was set start with it armed: their first call
    stops, every time (the table comes with the spawn, not after it)."""
    runtime.debugging.set_line_breakpoints(__file__, [LINE_A])
    for i in range(4):
        procs = this_host().spawn_procs(per_host={"procs": 2}, name=f"lateprocs{i}")
        m = procs.spawn(f"late{i}", Lines)
        fut = m.work.call(2)
        sessions = wait_paused(reg, 2)
        assert {s.mesh for s in sessions} == {f"late{i}"}
        for s in sessions:
            reg.release(s)
        assert list(fut.get(10).values()) == [21, 21]
        m.stop().get(10)
        procs.stop().get(10)


def test_the_breakpoint_table_travels_with_a_spawn():
    from runtime.debugging.proc_side import BREAKS_ENV, spawn_env

    runtime.debugging.set_line_breakpoints(__file__, [])
    assert spawn_env() == {}
    runtime.debugging.set_line_breakpoints(__file__, [LINE_A])
    try:
        spec = json.loads(spawn_env()[BREAKS_ENV])
        assert spec["table"] == {__file__: [LINE_A]}
    finally:
        runtime.debugging.set_line_breakpoints(__file__, [])


class Failing(Actor):
    @endpoint
    def boom(self, x):
        secret = x * 3
        raise ValueError(f"bad {x}")


def test_exception_filter_stops_in_the_failed_frame(procs, reg):
    from runtime import ActorError

    m = procs.slice(procs=0).spawn("failing", Failing)
    runtime.debugging.set_exception_breakpoints(["uncaught"])
    try:
        fut = m.boom.call_one(5)
        (s,) = wait_paused(reg, 1)
        assert s.kind == "exception" and s.function == "boom"
        dap = runtime.debugging.get_dap_client()
        assert dap.request(s, "evaluate", {"expression": "secret"})["result"] == "15"
        assert not fut.done()  # the call waits while the frame is inspected
        reg.release(s)
        with pytest.raises(ActorError, match="bad 5"):
            fut.get(10)
    finally:
        runtime.debugging.set_exception_breakpoints([])
    with pytest.raises(ActorError, match="bad 6"):
        m.boom.call_one(6).get(10)  # filters off: no stop
    m.stop().get(10)
