"""Interrupting a cell cancels exactly the calls that cell started (docs/kernel.md,
"Interrupt"): in an IPython shell with `%load_ext monarch_kernel`, Ctrl-C in a cell (as a
signal would raise it) cancels the cell's calls still running, while calls of earlier cells
go on, also when the cell was waiting on one of them."""

from __future__ import annotations

import _thread
import threading

import pytest
from IPython.utils.capture import capture_output
from _kernel_helpers import ipython_with_extension

import runtime
from _util import wait_until

pytestmark = pytest.mark.timeout(90)

ACTOR = '''
import os, time
from runtime import Actor, endpoint

class Holder(Actor):
    @endpoint
    def hold(self, tag, marks, release):
        open(os.path.join(marks, tag), "w").close()
        end = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < end:
            time.sleep(0.01)
        return tag
'''


@pytest.fixture(scope="module")
def ip():
    with ipython_with_extension() as shell:
        r = shell.run_cell(ACTOR)
        assert r.success, r.error_in_exec
        shell.run_line_magic("mesh", "alloc ci --per-host procs=1 --no-progress")
        for name in ("a", "b", "c"):
            shell.run_line_magic("mesh", f"spawn ci Holder --name {name} --as {name}")
        yield shell


def _interrupt_the_cell_when(cond) -> threading.Thread:
    """Ctrl-C in the main thread (which runs the cell) once `cond()` holds."""
    def go() -> None:
        wait_until(cond, 30, "the cell never got there")
        _thread.interrupt_main()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def _waiting(ip, name: str):
    """A condition: the main thread is blocked in `.get()` on the future `name`."""
    main = threading.main_thread().ident
    return lambda: (name in ip.user_ns and
                    runtime.future.waiting_in(main) is ip.user_ns[name])


def test_an_interrupted_cell_cancels_its_calls_and_not_an_earlier_cells(ip, tmp_path):
    ip.user_ns.update(marks=str(tmp_path), release=str(tmp_path / "release"))
    r = ip.run_cell("earlier = a.hold.call_one('earlier', marks, release)")
    assert r.success, r.error_in_exec
    t = _interrupt_the_cell_when(_waiting(ip, "earlier"))
    with capture_output() as cap:
        r = ip.run_cell("import os\n"
                        "mine = b.hold.call_one('mine', marks, release)\n"
                        "while not os.path.exists(os.path.join(marks, 'mine')):\n"
                        "    time.sleep(0.01)\n"
                        "earlier.get()\n")
    t.join(10)
    assert isinstance(r.error_in_exec, KeyboardInterrupt), r.error_in_exec
    assert ("interrupted: cancelled 1 call this cell started (Holder.hold.call_one); "
            "calls of earlier cells go on") in cap.stderr, cap.stderr
    mine, earlier = ip.user_ns["mine"], ip.user_ns["earlier"]
    with pytest.raises(runtime.CancelledError, match="hold"):
        mine.get(timeout=10)
    (tmp_path / "release").touch()
    assert earlier.get(timeout=30) == "earlier"  # it went on, to its end
    # b is usable for the next cell
    assert ip.user_ns["b"].hold.call_one("next", str(tmp_path), str(tmp_path / "release")
                                         ).get(timeout=10) == "next"


def test_an_interrupt_outside_a_wait_cancels_every_call_of_the_cell(ip, tmp_path):
    ip.user_ns.update(marks=str(tmp_path), release=str(tmp_path / "release"))
    main = threading.main_thread().ident
    ready = lambda: ((tmp_path / "one").exists() and (tmp_path / "two").exists()  # noqa: E731
                     and "two" in ip.user_ns)
    t = _interrupt_the_cell_when(lambda: ready() and runtime.future.waiting_in(main) is None)
    with capture_output() as cap:
        r = ip.run_cell("one = a.hold.call_one('one', marks, release)\n"
                        "two = c.hold.call_one('two', marks, release)\n"
                        "while True:\n"
                        "    time.sleep(0.01)\n")
    t.join(10)
    assert isinstance(r.error_in_exec, KeyboardInterrupt), r.error_in_exec
    assert "interrupted: cancelled 2 calls this cell started" in cap.stderr, cap.stderr
    for name in ("one", "two"):
        with pytest.raises(runtime.CancelledError):
            ip.user_ns[name].get(timeout=10)
    # a cell that ends without an interrupt cancels nothing
    r = ip.run_cell("done = a.hold.call_one('done', marks, release)")
    assert r.success
    (tmp_path / "release").touch()
    assert ip.user_ns["done"].get(timeout=30) == "done"
