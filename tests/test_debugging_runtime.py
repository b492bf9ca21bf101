"""The debugger through real procs, without a kernel: breakpoints, stepping, source
serving, queued ranks, cast, timeouts, the no-stdin policy, post-mortem and health."""

import io
import linecache
import sys
import threading
import time

import pytest

import runtime
from runtime import Actor, ActorError, current_rank, endpoint, this_host
from runtime.debugging import console, settings
from runtime.debugging.console import DebugConsole
from runtime.debugging.registry import DebugError
from runtime.supervision.health import ActorState

pytestmark = pytest.mark.timeout(90)


class Stepper(Actor):
    @endpoint
    def work(self, x):
        y = x * 2
        breakpoint()
        z = y + current_rank().rank
        return z

    @endpoint
    def drops_a_weak_member(self):
        import weakref

        class Held:
            pass

        held = weakref.WeakSet()
        box = [Held()]  # its only reference (pdb's view of the locals holds the list)
        held.add(box[0])
        breakpoint()
        box.clear()  # the member is freed: the WeakSet's callback runs here, on this thread
        return len(held)

    @endpoint
    def traced(self, x):
        import pdb

        base = x + 100
        pdb.set_trace()
        return base

    @endpoint
    def disabled(self):
        import os

        os.environ["PYTHONBREAKPOINT"] = "0"  # as for plain Python: breakpoint() is a no-op
        try:
            breakpoint()
            return "ran through"
        finally:
            del os.environ["PYTHONBREAKPOINT"]

    @endpoint
    def boom(self, x):
        secret = x * 3
        raise ValueError(f"bad {x}")

    @endpoint
    def set_ack_timeout(self, seconds: float) -> float:
        """This proc's wait for a controller's acknowledgement of a breakpoint; returns the
        value it replaces."""
        from runtime.debugging import actor_pdb

        old, actor_pdb.ACK_TIMEOUT = actor_pdb.ACK_TIMEOUT, seconds
        return old


with open(__file__) as _f:
    STOP_LINE = next(i for i, ln in enumerate(_f, 1)
                     if ln.strip() == "z = y + current_rank().rank")
CELL = "<monarch-test-cell-1>"
CELL_SRC = '''\
from runtime import Actor, endpoint


def twice(v):
    doubled = v * 2
    return doubled


class CellActor(Actor):
    @endpoint
    def run(self, n):
        total = 0
        for i in range(n):
            total += i
        breakpoint()
        total = twice(total)
        return total
'''


def cell_actor_class():
    """An actor class defined in 'notebook cell' code: only the controller has its source."""
    linecache.cache[CELL] = (len(CELL_SRC), None, CELL_SRC.splitlines(True), CELL)
    ns = {"__name__": "cellmod_not_importable"}
    exec(compile(CELL_SRC, CELL, "exec"), ns)
    return ns["CellActor"]


@pytest.fixture(scope="module")
def procs():
    p = this_host().spawn_procs(per_host={"procs": 3}, name="dbgprocs")
    yield p
    runtime.shutdown()


@pytest.fixture
def reg(procs):
    settings.reset()
    settings.set_policy("fail")  # whatever the environment says
    settings.set_timeout(600)
    r = runtime.debugging.get_registry()
    yield r
    r.continue_all(clear=True)
    settings.reset()
    console.console_factory = DebugConsole


def wait_paused(reg, n=1, timeout=20.0, drain=True):
    """The first `n` paused sessions by rank; `drain` drops the location pdb printed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ps = reg.paused()
        if len(ps) >= n:
            ps = sorted(ps, key=lambda s: s.rank)
            for s in ps if drain else ():
                reg.wait(s, 5)
            return ps
        time.sleep(0.02)
    raise AssertionError(f"expected {n} paused sessions, have {reg.sessions()}")


def test_print_step_list_continue(procs, reg):
    m = procs.slice(procs=1).spawn("stepper", Stepper)
    fut = m.work.call_one(20)
    (s,) = wait_paused(reg, drain=False)
    assert (s.mesh, s.rank, s.function) == ("stepper", 0, "work")
    assert s.file == __file__ and s.line == STOP_LINE
    head = s.header_line()
    assert "mesh 'stepper' rank 0" in head and s.host in head and f"{__file__}:{STOP_LINE}" in head
    text, state = reg.wait(s, 5)
    assert state == "paused" and "-> z = y + current_rank().rank" in text
    assert reg.run_command(s, "p y") == ("40\n", "paused")
    text, _ = reg.run_command(s, "n")
    assert "-> return z" in text
    assert reg.run_command(s, "p z")[0] == "40\n"
    text, _ = reg.run_command(s, "ll")
    assert "def work(self, x):" in text and "breakpoint()" in text
    text, _ = reg.run_command(s, "w")
    assert "work()" in text and "proc.py" not in text and "threading" not in text
    assert "Oldest frame" in reg.run_command(s, "u")[0]
    text, state = reg.run_command(s, "c")
    assert state == "ended"
    assert fut.get(10) == 40
    assert reg.sessions() == []
    m.stop().get(10)


def test_pdb_set_trace_is_remote_too(procs, reg):
    m = procs.slice(procs=0).spawn("tracer", Stepper)
    fut = m.traced.call_one(1)
    (s,) = wait_paused(reg)
    assert reg.run_command(s, "p base")[0] == "101\n"
    assert reg.run_command(s, "c")[1] == "ended"
    assert fut.get(10) == 101
    m.stop().get(10)


def test_source_of_cell_code_comes_from_controller(procs, reg):
    m = procs.slice(procs=2).spawn("cell", cell_actor_class())
    fut = m.run.call_one(4)
    (s,) = wait_paused(reg)
    assert s.file == CELL
    text, _ = reg.run_command(s, "l")
    assert "for i in range(n):" in text and "breakpoint()" in text
    text, _ = reg.run_command(s, "ll")
    assert "def run(self, n):" in text
    assert reg.run_command(s, "p total")[0] == "6\n"
    # step into a function of another "cell", list it, go up and down the stack
    text, _ = reg.run_command(s, "s")
    assert "--Call--" in text and "twice()" in text, text
    text, _ = reg.run_command(s, "n")
    assert "-> doubled = v * 2" in text
    assert "def twice(v):" in reg.run_command(s, "ll")[0]
    text, _ = reg.run_command(s, "u")
    assert "run()" in text and "-> total = twice(total)" in text
    assert reg.run_command(s, "p total")[0] == "6\n"
    assert "-> doubled = v * 2" in reg.run_command(s, "d")[0]
    # a breakpoint set by line number in the cell file works too
    ret = CELL_SRC.splitlines().index("        return total") + 1
    text, _ = reg.run_command(s, f"b {CELL}:{ret}")
    assert f"Breakpoint 1 at {CELL}:{ret}" in text, text
    assert reg.run_command(s, "c")[1] == "ended"  # the actor runs on...
    (s,) = wait_paused(reg, drain=False)  # ...and stops at the breakpoint: paused again
    assert s.line == ret and "-> return total" in reg.wait(s, 5)[0]
    assert "Deleted breakpoint 1" in reg.run_command(s, "clear 1")[0]
    assert reg.run_command(s, "c")[1] == "ended"
    assert fut.get(10) == 12
    m.stop().get(10)


def test_two_ranks_paused_handled_one_after_the_other(procs, reg):
    m = procs.spawn("pair", Stepper)
    fut = m.work.call(1)
    sessions = wait_paused(reg, 3)
    assert [s.rank for s in sessions] == [0, 1, 2]
    for s in sessions:
        assert reg.run_command(s, "p y + current_rank().rank")[0] == f"{2 + s.rank}\n"
        assert reg.run_command(s, "c")[1] == "ended"
        assert not fut.done() or s is sessions[-1]
    assert list(fut.get(10).values()) == [2, 3, 4]
    m.stop().get(10)


def test_cast_to_a_set_of_ranks(procs, reg):
    m = procs.spawn("caster", Stepper)
    fut = m.work.call(5)
    wait_paused(reg, 3)
    out = reg.cast("ranks(procs=0:2)", "p y * 10 + current_rank().rank")
    assert sorted((s.rank, text) for s, text, _ in out) == [(0, "100\n"), (1, "101\n")]
    with pytest.raises(DebugError, match="no paused actor matches"):
        reg.cast("ranks(procs=7)", "p 1")
    out = reg.cast("all", "n")
    assert all("-> return z" in text for _, text, _ in out) and len(out) == 3
    assert reg.continue_all() == 3
    assert list(fut.get(10).values()) == [10, 11, 12]
    m.stop().get(10)


def test_health_shows_paused(procs, reg):
    rt = runtime.get_runtime()
    m = procs.slice(procs=0).spawn("healthy", Stepper)
    fut = m.work.call_one(1)
    (s,) = wait_paused(reg)

    def state(want: ActorState):
        deadline = time.monotonic() + 20
        while True:  # the proc's heartbeats carry its actors' states
            a = rt.health.mesh(m._rec.health_name).actors[0]
            if a.state == want:
                return a
            assert time.monotonic() < deadline, f"never {want}: {a}"
            time.sleep(0.02)

    assert state(ActorState.PAUSED).endpoint == "work"  # neither hung nor busy
    reg.run_command(s, "c")
    assert fut.get(10) == 2
    state(ActorState.IDLE)
    m.stop().get(10)


def test_unattended_timeout_fail_and_continue(procs, reg):
    settings.set_timeout(1.0)
    notes = []
    reg.notify = notes.append
    m = procs.slice(procs=1).spawn("unattended", Stepper)
    try:
        with pytest.raises(ActorError) as e:
            # wait in a non-main thread: no prompt opens, nobody attends
            t = m.work.call_one(3)
            res = {}
            th = threading.Thread(target=lambda: res.setdefault("e", t.exception(20)))
            th.start()
            th.join(20)
            raise res["e"]
        msg = str(e.value)
        assert "BreakpointWithoutDebugger" in msg and f"{__file__}:{STOP_LINE}" in msg
        assert "unattended for 1 s" in msg
        assert any("paused at" in n for n in notes) and any("unattended" in n for n in notes)
        settings.set_policy("continue")
        t = m.work.call_one(3)
        th = threading.Thread(target=lambda: t.exception(20))
        th.start()
        th.join(20)
        assert t.get(1) == 6
    finally:
        reg.notify = print
        m.stop().get(10)


def test_no_stdin_policy_in_a_waiting_main_thread(procs, reg, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # a script run without a terminal
    monkeypatch.delenv("MONARCH_DEBUG_STDIN", raising=False)
    m = procs.slice(procs=2).spawn("nostdin", Stepper)
    try:
        with pytest.raises(ActorError) as e:
            m.work.call_one(2).get(20)
        assert e.value.exception_type == "BreakpointWithoutDebugger"
        assert f"{__file__}:{STOP_LINE}" in str(e.value) and "no stdin" in str(e.value)
        settings.set_policy("continue")
        assert m.work.call_one(2).get(20) == 4
    finally:
        m.stop().get(10)


def test_console_in_waiting_thread_scripted(procs, reg):
    """The wait hook opens the prompt in the main thread blocked on the call."""
    script = iter(["p y", "%list", "n", "%cast ranks(1) p y + 1", "%help", "c", "p y",
                   KeyboardInterrupt])
    printed = []
    prompts = []

    def scripted_input(prompt):
        if not prompts:  # both ranks are at the breakpoint before the script goes on
            wait_paused(reg, 2, drain=False)
        prompts.append(prompt)
        item = next(script)
        if item is KeyboardInterrupt:
            raise KeyboardInterrupt
        return item

    def out(*a, **k):
        printed.append(" ".join(str(x) for x in a) + k.get("end", "\n"))

    console.console_factory = lambda r: DebugConsole(r, input_fn=scripted_input, print_fn=out)
    m = procs.slice(procs=slice(0, 2)).spawn("scripted", Stepper)
    try:
        assert list(m.work.call(7).get(30).values()) == [14, 15]
    finally:
        m.stop().get(10)
    text = "".join(printed)
    assert "--- breakpoint: mesh 'scripted' rank 0" in text
    assert "14\n" in text and "stepper" not in text
    assert "scripted rank 1 (procs=1) work() [breakpoint, paused]" in text  # %list
    assert "--- scripted rank 1 ---\n> " in text and "work()\n-> z = y + current_rank().rank\n15\n" in text  # %cast
    assert "attach [MESH] RANK" in text  # %help
    assert "--- scripted rank 0 continued ---" in text
    assert "--- breakpoint: mesh 'scripted' rank 1" in text  # the queued rank comes next
    assert "--- detached from scripted rank 1: it continues ---" in text  # Ctrl-C
    assert prompts[0] == "(Pdb scripted:0) " and prompts[-1] == "(Pdb scripted:1) "


def test_postmortem_in_failed_frame(procs, reg):
    m = procs.slice(procs=0).spawn("pm", Stepper)
    try:
        with pytest.raises(ActorError, match="bad 4"):
            m.boom.call_one(4).get(10)
        s = reg.postmortem(m._rec.actor_id, 0)
        assert s.kind == "postmortem" and s.file == __file__ and s.function == "boom"
        text, state = reg.wait(s, 5)
        assert "post-mortem of ValueError: bad 4" in text and state == "paused"
        assert reg.run_command(s, "p secret")[0] == "12\n"
        assert reg.run_command(s, "c")[1] == "ended"
        # the actor is still usable and keeps serving
        with pytest.raises(ActorError):
            m.boom.call_one(1).get(10)
        s = reg.postmortem(m._rec.actor_id, 0)
        assert "bad 1" in reg.wait(s, 5)[0]
        assert reg.run_command(s, "p secret")[0] == "3\n"
        reg.run_command(s, "c")
    finally:
        m.stop().get(10)
    m2 = procs.slice(procs=1).spawn("pm2", Stepper)
    try:
        with pytest.raises(DebugError, match="no failed frame"):
            reg.postmortem(m2._rec.actor_id, 0)
    finally:
        m2.stop().get(10)


class Child(Actor):
    @endpoint
    def f(self, x):
        y = x + 1
        breakpoint()
        return y


class Parent(Actor):
    @endpoint
    def run(self, x):
        kids = this_host().spawn_procs(per_host={"procs": 1}, name="kids")
        return kids.spawn("child", Child).f.call_one(x).get(30)


def test_breakpoint_in_a_nested_actor_reaches_the_controller(procs, reg):
    """A grandchild's debug traffic goes up through its owner proc to the controller."""
    m = procs.slice(procs=0).spawn("parent", Parent)
    fut = m.run.call_one(41)
    (s,) = wait_paused(reg)
    assert (s.mesh, s.function) == ("child", "f")
    assert reg.run_command(s, "p y")[0] == "42\n"
    assert "breakpoint()" in reg.run_command(s, "l")[0]
    assert reg.run_command(s, "c")[1] == "ended"
    assert fut.get(20) == 42
    m.stop().get(10)


def test_controller_without_debugger_applies_the_actor_policy(procs, reg):
    """No Kind.DEBUG handler in the controller: the actor gives up after ACK_TIMEOUT (1 s
    here instead of 5: the wait is not what is checked)."""
    import os

    from runtime.transport.framing import Kind

    if os.environ.get("MONARCH_DEBUG_POLICY", "fail") != "fail":
        pytest.skip("the procs' environment sets another debug policy")
    rt = runtime.get_runtime()
    m = procs.slice(procs=1).spawn("nodebugger", Stepper)
    old = m.set_ack_timeout.call_one(1.0).get(timeout=30)
    handler = rt._handlers.pop(int(Kind.DEBUG))
    try:
        err = m.work.call_one(1).exception(30)  # after the actor's ack timeout
        assert isinstance(err, ActorError) and err.exception_type == "BreakpointWithoutDebugger"
        assert "did not acknowledge it (no debugger installed there)" in str(err)
    finally:
        rt.register_handler(Kind.DEBUG, handler)
        m.set_ack_timeout.call_one(old).get(timeout=10)
        m.stop().get(10)


def test_pythonbreakpoint_0_disables(procs, reg):
    m = procs.slice(procs=2).spawn("disabled", Stepper)
    assert m.disabled.call_one().get(10) == "ran through"
    assert reg.sessions() == []
    m.stop().get(10)


def test_quit_fails_the_call_with_bdbquit(procs, reg):
    m = procs.slice(procs=0).spawn("quitter", Stepper)
    fut = m.work.call_one(1)
    (s,) = wait_paused(reg)
    assert reg.run_command(s, "q")[1] == "ended"
    err = fut.exception(10)
    assert isinstance(err, ActorError) and err.exception_type == "BdbQuit"
    assert m.disabled.call_one().get(10) == "ran through"  # the actor lives on
    m.stop().get(10)


def test_a_step_does_not_stop_in_a_weakref_callback(procs, reg):
    """`s` over a line that frees a WeakSet member: the collector's callback runs on the
    actor's thread, and pdb steps over it to the endpoint's next line (it used to stop in
    `_weakrefset._remove`, where a `q` was swallowed as an ignored exception)."""
    m = procs.slice(procs=0).spawn("weakstep", Stepper)
    fut = m.drops_a_weak_member.call_one()
    (s,) = wait_paused(reg, drain=False)
    text, _ = reg.wait(s, 5)
    assert "-> box.clear()" in text, text
    text, _ = reg.run_command(s, "s")
    assert "-> return len(held)" in text and "_weakrefset" not in text, text
    assert reg.run_command(s, "c")[1] == "ended"
    assert fut.get(10) == 0
    m.stop().get(10)

