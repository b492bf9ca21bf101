"""Why is it stuck? `runtime.diagnose(mesh)` on the three classic hangs (docs/debugging.md,
"Why is it stuck?"): a sync endpoint calling its own actor, two actors calling each other,
an endpoint waiting on a port nobody sends to; and `explain`, the pure text, directly."""

from __future__ import annotations

import pytest

import runtime
from runtime import Actor, Channel, diagnose, endpoint, this_host
from runtime._meshes.diagnose import Stuck, explain
from _util import wait_until

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


@pytest.fixture(scope="module")
def procs():
    pm = this_host().spawn_procs(per_host={"procs": 1}, name="why")
    yield pm
    pm.stop().get(timeout=30)


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
