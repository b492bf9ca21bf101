"""The debugger driven through a real kernel with jupyter_client (allow_stdin=True):
the pdb prompt opens in the cell waiting on the call; lines go through stdin."""

import os
import re

import pytest

from kernel_debug.driver import INTERRUPT, KernelSession, kernel_module

pytestmark = pytest.mark.timeout(180)

ACTORS = '''\
from runtime import Actor, endpoint, this_host, current_rank
from runtime.debugging import set_policy, set_timeout


class Stepper(Actor):
    @endpoint
    def work(self, x):
        y = x * 2
        breakpoint()
        z = y + current_rank().rank
        return z

    @endpoint
    def boom(self, x):
        secret = x * 3
        raise ValueError(f"bad {x}")


procs = this_host().spawn_procs(per_host={"procs": 3}, name="nbprocs")
'''


@pytest.fixture(scope="module")
def kernel():
    k = KernelSession()
    r = k.run(ACTORS)
    assert r.ok, r.transcript
    yield k
    k.close()


def test_print_step_list_notebook_source_continue(kernel):
    kernel.run('one = procs.slice(procs=0).spawn("one", Stepper)')
    r = kernel.run("one.work.call_one(20).get()", ["p y", "n", "p z", "l", "ll", "w", "c"])
    t = r.transcript
    assert r.ok, t
    assert re.search(r"--- breakpoint: mesh 'one' rank 0 on \S+ pid \d+, at "
                     r"\S+\.py:10 in work\(\) ---", t), t
    assert "(Pdb one:0) p y\n40\n" in t
    assert "-> return z" in t and "(Pdb one:0) p z\n40\n" in t
    # `l` / `ll` list the notebook cell's code: the controller served it to the actor
    assert "def work(self, x):" in t and "breakpoint()" in t and "raise ValueError" in t
    assert "--- one rank 0 continued ---" in t
    assert r.results == ["40"]
    assert r.prompts == ["(Pdb one:0) "] * 7


def test_two_ranks_paused_one_after_the_other(kernel):
    kernel.run('two = procs.slice(procs=slice(0, 2)).spawn("two", Stepper)')
    r = kernel.run("list(two.work.call(1).get().values())",
                   ["p current_rank().rank", "c", "p current_rank().rank", "c"])
    t = r.transcript
    assert r.ok, t
    assert r.prompts == ["(Pdb two:0) ", "(Pdb two:0) ", "(Pdb two:1) ", "(Pdb two:1) "]
    assert t.index("mesh 'two' rank 0") < t.index("two rank 0 continued") < \
        t.index("mesh 'two' rank 1") < t.index("two rank 1 continued")
    assert "(Pdb two:1) p current_rank().rank\n1\n" in t
    assert r.results == ["[2, 3]"]


def test_cast_list_and_continue_all(kernel):
    kernel.run('three = procs.spawn("three", Stepper)')
    r = kernel.run("list(three.work.call(5).get().values())",
                   ["%list", "%cast ranks(procs=1:3) p y * 100 + current_rank().rank",
                    "%continue"])
    t = r.transcript
    assert r.ok, t
    assert len(re.findall(r"three rank \d \(procs=\d\) work\(\) \[breakpoint, paused\]", t)) == 3
    assert "--- three rank 1 ---" in t and "1001\n" in t
    assert "--- three rank 2 ---" in t and "1002\n" in t
    assert "--- three rank 0 ---" not in t
    assert "3 paused actors continue" in t
    assert r.results == ["[10, 11, 12]"]


def test_ctrl_c_detaches_and_the_actor_continues(kernel):
    kernel.run('cc = procs.slice(procs=1).spawn("cc", Stepper)')
    r = kernel.run("cc.work.call_one(4).get()", ["p y", INTERRUPT])
    t = r.transcript
    assert r.ok, t
    assert "--- detached from cc rank 0: it continues ---" in t
    assert r.results == ["8"]


def test_unattended_breakpoint_note_attach_with_magic_and_timeout(kernel):
    kernel.run('ua = procs.slice(procs=2).spawn("ua", Stepper)')
    kernel.run("import time\n"
               "def _until(cond, seconds=30):\n"
               "    end = time.monotonic() + seconds\n"
               "    while not cond() and time.monotonic() < end:\n"
               "        time.sleep(0.02)\n"
               "def _states(m):\n"
               "    return [a.state.value for a in "
               "runtime.get_runtime().health.mesh(m._rec.health_name).actors]\n"
               "def _paused(m):\n"
               "    return _until(lambda: _states(m) == ['paused'])\n"
               "def _noted():\n"
               "    import threading\n"
               "    from runtime.debugging.registry import get_registry\n"
               "    _until(lambda: any(s.noted for s in get_registry().sessions()))\n"
               "    done = threading.Event()  # the I/O thread, which notes, is past it\n"
               "    runtime.get_runtime().loop.call_soon(done.set)\n"
               "    done.wait(10)\n")
    # the call is made, but no cell waits on it: a note, the dashboard shows it paused
    r = kernel.run("fut = ua.work.call_one(6)\n_noted()\n_paused(ua)\nprint(_states(ua))")
    assert r.ok, r.transcript
    assert "ua rank 0 paused at" in r.stderr and "%mesh debug" in r.stderr
    assert "['paused']" in r.stdout
    r = kernel.run('debugger.debug_magic("list", get_ipython())')
    assert "ua rank 0 work() [breakpoint, paused]" in r.stdout
    r = kernel.run('debugger.debug_magic("", get_ipython())', ["p y", "c"])
    assert "(Pdb ua:0) p y\n12\n" in r.transcript and "ua rank 0 continued" in r.transcript
    assert kernel.run("fut.get()").results == ["12"]
    # the dashboard's attach button / `%mesh attach MESH RANK` (monarch_widgets.controls)
    r = kernel.run("fut = ua.work.call_one(6)\n_paused(ua)\n"
                   "from monarch_widgets import controls\n"
                   "controls.attach(ua._rec.health_name, 0)", ["p y + 1", "c"])
    assert "(Pdb ua:0) p y + 1\n13\n" in r.transcript, r.transcript
    assert r.results == ["'done with ua rank 0'"]
    assert kernel.run("fut.get()").results == ["12"]
    if kernel_module() == "monarch_kernel":  # the Monarch kernel's `%mesh attach MESH RANK`
        r = kernel.run("fut = ua.work.call_one(6)\n_paused(ua)\n"
                       "get_ipython().run_line_magic('mesh', 'attach ua 0')", ["p x", "c"])
        assert "(Pdb ua:0) p x\n6\n" in r.transcript, r.transcript
        assert kernel.run("fut.get()").results == ["12"]
    # nobody attends within the timeout: the policy (fail) applies (the call ends by itself)
    r = kernel.run("set_timeout(1.5)\nfut = ua.work.call_one(6)\n_until(fut.done)\nfut.get()")
    assert r.error is not None and r.error["ename"] == "ActorError"
    assert "BreakpointWithoutDebugger" in r.error["evalue"]
    assert "unattended for 1.5 s" in r.error["evalue"]
    kernel.run("set_timeout(600)")


def test_no_stdin_fails_the_call_naming_the_breakpoint(kernel):
    kernel.run('ns = procs.slice(procs=0).spawn("ns", Stepper)')
    r = kernel.run("ns.work.call_one(3).get()", allow_stdin=False)
    assert r.error is not None and r.error["ename"] == "ActorError", r.transcript
    assert "BreakpointWithoutDebugger" in r.error["evalue"]
    assert re.search(r"breakpoint at \S+\.py:10 in mesh 'ns' rank 0", r.error["evalue"])
    r = kernel.run('set_policy("continue")\nns.work.call_one(3).get()', allow_stdin=False)
    assert r.ok and r.results == ["6"], r.transcript
    assert "policy 'continue': the actor continues" in r.stderr
    kernel.run('set_policy("fail")')


def test_postmortem_opens_pdb_in_the_failed_frame(kernel):
    kernel.run('pm = procs.slice(procs=1).spawn("pm", Stepper)')
    r = kernel.run("pm.boom.call_one(7).get()")
    assert r.error is not None and r.error["ename"] == "ActorError"
    r = kernel.run('debugger.debug_magic("--postmortem", get_ipython())',
                   ["p secret", "w", "c"])
    t = r.transcript
    assert r.ok, t
    assert "--- post-mortem: mesh 'pm' rank 0" in t
    assert "post-mortem of ValueError: bad 7" in t
    assert "(Pdb pm:0) p secret\n21\n" in t
    assert 'raise ValueError(f"bad {x}")' in t  # source of the cell, from the controller
    # the actor kept serving
    assert kernel.run("pm.work").ok
