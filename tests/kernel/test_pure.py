"""Pure parts of the kernel: cell execution, error folding, line prefixing and routing."""

import asyncio
import pickle
import threading

from monarch_kernel.remote.cell_exec import Unpicklable, new_namespace, portable, run_cell
from monarch_kernel.folding import (MeshCellError, RankFailure, compress_ranks, fold,
                                    live_selection, render)
from monarch_kernel.output import LinePrefixer, OutputRouter

from _util import FakeClock


def run(ns, code):
    return asyncio.run(run_cell(ns, code, "t"))


def test_namespace_persists_and_last_expression_is_returned():
    ns = new_namespace()
    r = run(ns, "x = 40\ny = 2")
    assert r.ok and not r.has_value and r.value is None
    r = run(ns, "x + y")
    assert r.ok and r.has_value and r.value == 42
    assert ns["_"] == 42
    r = run(ns, "def f(a):\n    return a * 2\nf(x)")
    assert r.value == 80
    assert run(ns, "print('hi')").has_value is False  # None is not a value


def test_top_level_await():
    ns = new_namespace()
    r = run(ns, "import asyncio\nawait asyncio.sleep(0)\nv = 3")
    assert r.ok and ns["v"] == 3
    r = run(ns, "async def g():\n    return 5\nawait g()")
    assert r.ok and r.value == 5


def test_error_traceback_shows_cell_lines_only():
    ns = new_namespace()
    r = run(ns, "a = 1\ndef boom():\n    return 1 / 0\nboom()")
    assert not r.ok and r.error_type == "ZeroDivisionError"
    assert "return 1 / 0" in r.traceback and "boom()" in r.traceback
    assert "cell_exec.py" not in r.traceback
    assert r.traceback.rstrip().endswith("ZeroDivisionError: division by zero")
    assert ns["a"] == 1  # statements before the error took effect


def test_syntax_error_and_keyboard_interrupt_are_reported():
    r = run(new_namespace(), "x = (")
    assert not r.ok and r.error_type == "SyntaxError" and "x = (" in r.traceback
    r = run(new_namespace(), "raise KeyboardInterrupt")
    assert not r.ok and r.error_type == "KeyboardInterrupt"


def test_portable_replaces_unpicklable_values_by_their_repr():
    lock = threading.Lock()
    p = portable(lock, pickle.dumps)
    assert isinstance(p, Unpicklable) and "lock" in repr(p)
    assert portable([1, 2], pickle.dumps) == [1, 2]
    p2 = pickle.loads(pickle.dumps(p))
    assert p2 == p


def test_compress_ranks():
    assert compress_ranks([5, 0, 1, 2, 7, 8]) == "0-2, 5, 7-8"
    assert compress_ranks([3]) == "3"
    assert compress_ranks([]) == ""


def _fail(rank, tb, etype="ValueError"):
    return RankFailure(rank=rank, coords={"procs": rank}, error_type=etype, message="m",
                       traceback=tb)


def test_identical_tracebacks_fold_into_one():
    tb_a = "Traceback (most recent call last):\n  line 1\nValueError: bad\n"
    tb_b = "Traceback (most recent call last):\n  line 2\nKeyError: 'k'\n"
    fails = [_fail(3, tb_a), _fail(0, tb_a), _fail(1, tb_b, "KeyError"), _fail(2, tb_a)]
    groups = fold(fails)
    assert [[m.rank for m in g] for g, _ in groups] == [[0, 2, 3], [1]]
    text = render(fails, total=6, mesh="trainers")
    assert text.startswith("4 of 6 ranks failed on trainers: ValueError x3, KeyError x1")
    assert text.count("ValueError: bad") == 1 and text.count("KeyError: 'k'") == 1
    assert "--- ranks 0, 2-3 ---" in text and "--- rank 1 (procs=1) ---" in text


def test_mesh_cell_error_renders_for_ipython_and_pickles():
    e = MeshCellError([_fail(0, "TB\nValueError: m\n")], total=2, mesh="t")
    lines = e._render_traceback_()
    assert lines[0].startswith("MeshCellError: 1 of 2 ranks failed on t")
    e2 = pickle.loads(pickle.dumps(e))
    assert e2.report() == e.report()


def test_prefixer_prefixes_complete_lines_and_holds_partials():
    p = LinePrefixer()
    assert p.feed("t 0", "stdout", "a\nb") == "[t 0] a\n"
    assert p.feed("t 1", "stdout", "x\n") == "[t 1] x\n"
    assert p.feed("t 0", "stdout", "c\n") == "[t 0] bc\n"  # partial joined, no interleave
    assert p.feed("t 0", "stderr", "e\r\n") == "[t 0] e\r\n"
    assert not p.has_pending()


def test_prefixer_flush_keeps_line_open_and_another_label_closes_it():
    p = LinePrefixer()
    assert p.feed("t 0", "stdout", "50%") == ""
    assert p.flush() == [("stdout", "[t 0] 50%")]
    assert p.feed("t 0", "stdout", " done\n") == " done\n"  # continues the open line
    p.feed("t 0", "stdout", "a")
    p.flush()
    assert p.feed("t 1", "stdout", "b\n") == "\n[t 1] b\n"
    assert p.feed("t 0", "stdout", "10%\r20%\r") == "[t 0] 10%\r[t 0] 20%\r"
    p.feed("t 2", "stdout", "tail")
    assert p.close_lines() == [("stdout", "[t 2] tail"), ("stdout", "\n")]


def test_router_writes_to_target_and_flushes_partials_on_a_timer():
    got = []
    ev = threading.Event()

    def write(stream, text, parent):
        got.append((stream, text, parent))
        if "partial" in text:
            ev.set()

    r = OutputRouter(write, partial_delay=0.05)
    cell1 = {"header": {"msg_id": "1"}}
    r.set_target(cell1)
    r("m 0", "stdout", "hello\n")
    r("m 1", "stderr", "warn\n")
    r("m 0", "stdout", "partial")
    assert ev.wait(2)
    assert got == [("stdout", "[m 0] hello\n", cell1), ("stderr", "[m 1] warn\n", cell1),
                   ("stdout", "[m 0] partial", cell1)]
    cell2 = {"header": {"msg_id": "2"}}
    r.set_target(cell2)  # ends the open line in the old cell
    assert got[-1] == ("stdout", "\n", cell1)
    r("m 0", "stdout", "next\n")
    assert got[-1] == ("stdout", "[m 0] next\n", cell2)


def test_router_is_thread_safe_lines_never_interleave():
    got = []
    r = OutputRouter(lambda s, t, p: got.append(t))

    def writer(i):
        for k in range(200):
            r(f"m {i}", "stdout", f"line {k} ")
            r(f"m {i}", "stdout", f"of {i}\n")

    ts = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    r.flush()
    lines = "".join(got).splitlines()
    assert len(lines) == 800
    for line in lines:
        label, rest = line.split("] ", 1)
        assert rest.endswith(f"of {label[-1]}"), line


def _router(clock: FakeClock) -> OutputRouter:
    """A router whose `settle` measures and waits on `clock` (no sleeping)."""
    return OutputRouter(lambda stream, text, parent: None, clock=clock, sleep=clock.sleep)


STEP = 0.005  # settle's poll: what it waits is its duration, to one poll


def test_settle_waits_the_grace_when_no_output_comes():
    clock = FakeClock()
    r = _router(clock)
    waited = r.settle(grace=0.05, quiet=0.03, limit=1.0)
    assert 0.05 <= waited < 0.05 + STEP + 1e-9


def test_settle_waits_until_output_has_been_quiet_for_quiet_seconds():
    clock = FakeClock()
    r = _router(clock)
    start = clock()

    def output_until_0_1(now: float) -> None:  # a chunk at each poll for the first 0.1 s
        if now - start < 0.1:
            r("m 0", "stdout", "x\n")

    clock.on_sleep = output_until_0_1
    waited = r.settle(grace=0.01, quiet=0.05, limit=2.0)
    last = r.last_output - start
    assert 0.1 - STEP - 1e-9 <= last < 0.1  # the last chunk came just before 0.1 s
    assert last + 0.05 <= waited < last + 0.05 + STEP + 1e-9  # then quiet for 0.05 s


def test_settle_stops_at_its_limit_while_output_keeps_coming():
    clock = FakeClock()
    r = _router(clock)
    r("m 0", "stdout", "x\n")  # output came just now, and keeps coming at each poll
    clock.on_sleep = lambda now: r("m 0", "stdout", "x\n")
    waited = r.settle(grace=0.0, quiet=0.05, limit=0.2)
    assert 0.2 <= waited < 0.2 + STEP + 1e-9


def test_live_selection_keeps_the_most_ranks_without_the_dead_ones():
    assert live_selection({"procs": 4}, [{"procs": 3}]) == "procs=0:3"
    assert live_selection({"procs": 4}, [{"procs": 0}]) == "procs=1:4"
    assert live_selection({"procs": 5}, [{"procs": 1}]) == "procs=2:5"
    assert live_selection({"procs": 2}, [{"procs": 0}]) == "procs=1"
    assert live_selection({"hosts": 2, "procs": 4}, [{"hosts": 1, "procs": 2}]) == "hosts=0"
    assert live_selection({"hosts": 4, "procs": 2}, [{"hosts": 0, "procs": 1}]) == "hosts=1:4"
    assert live_selection({"procs": 2}, [{"procs": 0}, {"procs": 1}]) is None
