"""Why is it stuck? `runtime.diagnose(mesh)` on the three classic hangs (docs/debugging.md,
"Why is it stuck?"): a sync endpoint calling its own actor, two actors calling each other,
an endpoint waiting on a port nobody sends to; and `explain`, the pure text, directly."""

from __future__ import annotations

import socket
import threading
import time

import pytest

import runtime
from runtime import Actor, Channel, diagnose, endpoint, this_host
from runtime._meshes.diagnose import Stuck, explain
from runtime.stacks import CCallWatch, find_py_spy
from _util import wait_until
from _procs import spawn_procs_fixture

pytestmark = pytest.mark.timeout(90)


class Hangs(Actor):
    @endpoint
    def call_self(self, me) -> int:
        return me.answer.call_one().get(timeout=30)  # queued behind this very handler

    @endpoint
    def call_other(self, other, me) -> int:
        return other.call_back.call_one(me).get(timeout=30)

    @endpoint
    def call_back(self, first) -> int:
        return first.answer.call_one().get(timeout=30)

    @endpoint
    def wait_port(self) -> int:
        _, recv = Channel.open()
        return recv.recv().get(timeout=30)  # nothing will ever send there

    @endpoint
    def answer(self) -> int:
        return 1

    @endpoint
    def sleep_in_c(self, seconds: float) -> int:
        time.sleep(seconds)  # one C call: a cancel reaches it only when it returns
        return 2


procs = spawn_procs_fixture({"procs": 1}, "why")


def test_a_sync_endpoint_calling_its_own_actor_is_named_with_its_fix(procs):
    a = procs.spawn("selfcall", Hangs)
    fut = a.call_self.call_one(a)
    try:
        d = wait_until(lambda: diagnose(a) if diagnose(a).cycles else None, 20,
                       "no cycle diagnosed")
        text = str(d)
        assert "selfcall rank 0: running call_self()" in text, text
        assert "1 message(s) wait behind it" in text, text
        assert "calls its own actor" in d.cycles[0] and "@concurrent_endpoint" in d.cycles[0]
    finally:
        fut.cancel()
        a.stop().get(timeout=30)


def test_two_actors_calling_each_other_are_one_cycle(procs):
    a = procs.spawn("first", Hangs)
    b = procs.spawn("second", Hangs)
    fut = a.call_other.call_one(b, a)
    try:
        d = wait_until(lambda: diagnose(procs) if diagnose(procs).cycles else None, 20,
                       "no cycle diagnosed")
        assert len(d.cycles) == 1, str(d)
        assert "first rank 0's call_other() waits on second rank 0" in d.cycles[0] or \
            "second rank 0's call_back() waits on first rank 0" in d.cycles[0], str(d)
        assert "each waits for the other" in d.cycles[0]
    finally:
        fut.cancel()
        a.stop().get(timeout=30)
        b.stop().get(timeout=30)


def test_an_endpoint_waiting_on_a_port_nobody_sends_to_says_so(procs):
    a = procs.spawn("porter", Hangs)
    fut = a.wait_port.call_one()
    try:
        d = wait_until(lambda: diagnose(a) if "Channel port" in str(diagnose(a)) else None,
                       20, "no port wait diagnosed")
        assert "porter rank 0: running wait_port()" in str(d) and not d.cycles, str(d)
    finally:
        fut.cancel()
        a.stop().get(timeout=30)


def test_nothing_stuck_says_so(procs):
    a = procs.spawn("calm", Hangs)
    assert a.answer.call_one().get(timeout=30) == 1
    assert "nothing is stuck" in str(diagnose(a))
    with pytest.raises(TypeError, match="ActorMesh or a ProcMesh"):
        diagnose("calm")
    a.stop().get(timeout=30)


def test_explain_names_each_actor_and_each_cycle_once():
    a = Stuck("a", "a-1", 0, "busy", "f", 3.0, 2, {"actor": "b-1", "ranks": [1],
                                                  "label": "B.g.call_one"})
    b = Stuck("b", "b-1", 1, "busy", "g", 2.0, 0, {"actor": "a-1", "ranks": [0]})
    text = explain([a, b])
    assert text.splitlines()[0] == ("a rank 0: running f() for 3.0 s; 2 message(s) wait "
                                    "behind it; it waits on a call B.g.call_one to b rank 1")
    assert sum(ln.startswith("cycle:") for ln in text.splitlines()) == 1
    idle_queue = Stuck("c", "c-1", 0, "idle", "", 0.0, 4, None)
    assert explain([idle_queue]) == "c rank 0: idle; 4 message(s) wait behind it"
    assert explain([]).startswith("nothing is stuck")
    assert runtime.Diagnosis([a, b]).cycles == [ln for ln in text.splitlines()
                                                if ln.startswith("cycle:")]


def test_a_long_wait_in_the_main_thread_prints_the_diagnosis_once(procs, capsys):
    """A cell (here: the main thread) waiting on a stuck call past `stuck_after` gets the
    diagnosis printed under it once, without asking."""
    a = procs.spawn("stuckmain", Hangs)
    fut = a.call_self.call_one(a)
    try:
        with runtime.configured(stuck_after=0.5), pytest.raises(TimeoutError):
            fut.get(timeout=5)  # the call cannot answer: the wait ends at its bound
        err = capsys.readouterr().err
        assert err.count("has waited") == 1, err
        assert "stuckmain rank 0: running call_self()" in err and "calls its own actor" in err
    finally:
        fut.cancel()
        a.stop().get(timeout=30)


def test_threads_blocked_in_c_calls_are_named_with_what_they_wait_on():
    """Pure (threads of this process): a sleep, a lock and a socket read in C are each seen
    by two samples, with the call, its kind and where; a Python loop is not."""
    lock = threading.Lock()
    lock.acquire()
    a, b = socket.socketpair()
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(100))

    def sleeper() -> None:
        while not stop.is_set():
            time.sleep(0.5)

    work = {"sleep": sleeper,
            "lock": lambda: lock.acquire(timeout=30),
            "recv": lambda: a.recv(10),
            "spin": spin}
    threads = {k: threading.Thread(target=f, daemon=True) for k, f in work.items()}
    for t in threads.values():
        t.start()
    try:
        watches = {k: CCallWatch() for k in threads}

        def sampled(k: str):
            return watches[k].sample(threads[k].ident) or None

        got = {k: wait_until(lambda k=k: sampled(k), 10, f"{k} not seen in C")
               for k in ("sleep", "lock", "recv")}
        assert got["sleep"]["call"] == "time.sleep(0.5)" and got["sleep"]["kind"] == "a sleep"
        assert "in sleeper()" in got["sleep"]["where"]
        assert got["lock"]["kind"] == "a lock" and got["lock"]["fn"] == "acquire"
        assert got["recv"]["kind"] == "I/O" and got["recv"]["call"] == "a.recv(10)"
        assert got["recv"]["thread"] == threads["recv"].ident
        # busy Python code is never reported as blocked in C
        for _ in range(20):
            assert watches["spin"].sample(threads["spin"].ident) is None
            time.sleep(0.01)
    finally:
        stop.set()
        lock.release()
        b.send(b"x")
        for t in threads.values():
            t.join(10)
        a.close()
        b.close()


def test_explain_says_a_handler_blocked_in_c_is_not_cancellable():
    c = {"call": "sock.recv(10)", "fn": "recv", "kind": "I/O", "where": "/w/x.py:9 in f()",
         "since": time.time() - 4.0, "thread": 7}
    e = Stuck("hung", "h-1", 0, "busy", "f", 4.0, 0, {"label": "a C call (I/O)", "c": c},
              ("its thread, with native frames (py-spy, innermost first):",
               "    recv [native, libc.so.6]"))
    lines = explain([e]).splitlines()
    assert lines[0].startswith("hung rank 0: running f() for 4.0 s; it is blocked inside a "
                               "C call (I/O) for 4.") and "sock.recv(10) at /w/x.py:9 in f()" \
        in lines[0], lines
    assert "not cancellable" in lines[0] and "%mesh kill hung" in lines[0], lines
    assert lines[1:] == ["    its thread, with native frames (py-spy, innermost first):",
                         "        recv [native, libc.so.6]"]


def test_a_handler_stuck_in_c_is_diagnosed_with_its_native_stack_and_killed(failures):
    """time.sleep in an endpoint: %mesh why's text says it is blocked in a C call and not
    cancellable, with its thread's native stack; cancel fails the call at once but the
    handler sleeps on; kill() ends its proc, and the failure says the user killed it."""
    pm = this_host().spawn_procs(per_host={"procs": 1}, name="inc")
    try:
        a = pm.spawn("cstuck", Hangs)
        fut = a.sleep_in_c.call_one(120)
        d = wait_until(lambda: (d := diagnose(a)) and "blocked inside a C call" in str(d)
                       and d, 20, "no C call diagnosed")
        text = str(d)
        assert "cstuck rank 0: running sleep_in_c() for" in text, text
        assert "C call (a sleep)" in text and "time.sleep(seconds) at " in text, text
        assert "test_diagnose.py" in text and "not cancellable" in text, text
        if find_py_spy()[0] is not None:
            assert "its thread, with native frames" in text, text
            assert "[native, " in text and "sleep" in text.split("native frames", 1)[1], text
        assert fut.cancel()  # the call fails here at once ...
        with pytest.raises(runtime.CancelledError):
            fut.get(timeout=10)
        # ... but the handler is still in its C call: the next call cannot run
        nxt = a.answer.call_one()
        with pytest.raises(TimeoutError):
            nxt.get(timeout=1.0)
        a.kill().get(timeout=30)
        with pytest.raises(runtime.SupervisionError, match="killed by the user"):
            nxt.get(timeout=10)
        wait_until(lambda: failures, 10, "no failure reported")
        f = failures[0]
        assert "killed by the user (kill() of actor mesh 'cstuck')" in f.cause, f.cause
        assert f.signal == 9 and f.is_injected is False
        assert "killed by the user" in f.report()
    finally:
        pm.stop().get(timeout=30)


def test_kill_refuses_what_it_cannot_kill():
    with pytest.raises(ValueError, match="this process"):
        runtime.this_proc().kill()
