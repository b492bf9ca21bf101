"""Monarch's endpoint kinds through the public API: explicit response ports, as_endpoint,
send(), @concurrent_endpoint, this_proc(), get_or_spawn_controller(), meshes as
arguments and generic mesh annotations."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

import runtime
from runtime import (Actor, ActorMesh, Channel, SupervisionError, ValueMesh, as_endpoint,
                     concurrent_endpoint, endpoint, get_or_spawn_controller, send, this_host,
                     this_proc)
from _monarch_actors import Answerer, Gate, Ported, Sequential, Where
from _procs import spawn_procs_fixture

pytestmark = pytest.mark.timeout(90)


procs = spawn_procs_fixture({"procs": 2}, "monarch_ep", stop_timeout=20)


@pytest.fixture(scope="module")
def ported(procs):
    m = procs.spawn("ported", Ported)
    m.initialized.get(timeout=30)
    return m


# -- explicit response ports -----------------------------------------------------------------
def test_explicit_port_answers_call_one_and_call(ported):
    assert ported.slice(procs=0).add.call_one(2).get(timeout=20) == 5
    vm = ported.add.call(10).get(timeout=20)
    assert list(vm.values()) == [13, 13]


def test_explicit_port_signature_excludes_the_port(ported):
    with pytest.raises(TypeError, match="missing a required argument: 'b'"):
        ported.add.call()


def test_explicit_port_may_answer_later(ported):
    one = ported.slice(procs=1)
    fut = one.park.call_one()
    with pytest.raises(TimeoutError):
        fut.get(timeout=0.3)
    assert one.release.call_one("later").get(timeout=20) == 1
    assert fut.get(timeout=20) == "later"


def test_explicit_port_may_be_answered_by_another_actor(procs, ported):
    other = procs.slice(procs=1).spawn("answerer", Answerer)
    got = ported.slice(procs=0).forward.call_one(other, "x").get(timeout=30)
    pid1 = procs.procs[1].pid
    assert got == f"answered x from pid {pid1}"
    other.stop().get(timeout=20)


def test_explicit_port_exception_is_raised_by_the_caller(ported):
    with pytest.raises(ValueError, match="refused"):
        ported.slice(procs=0).refuse.call_one().get(timeout=20)
    assert ported.slice(procs=0).ping.call_one(4).get(timeout=20) == 4


def test_explicit_port_raising_fails_the_actor(procs):
    m = procs.slice(procs=0).spawn("crashy", Ported)
    with pytest.raises(SupervisionError, match="no answer sent"):
        m.crash.call_one().get(timeout=30)
    with pytest.raises(SupervisionError):
        m.ping.call_one(1).get(timeout=30)


def test_endpoint_accepts_monarch_keywords():
    class K(Actor):
        @endpoint(propagate=lambda x: x, instrument=False, explicit_response_port=False)
        def f(self, x):
            return x

    assert not K.f._explicit_response_port
    with pytest.raises(ValueError, match="propagate"):
        endpoint(propagate=42)


# -- as_endpoint and send ----------------------------------------------------------------------
def test_plain_method_is_not_an_endpoint_until_wrapped(ported):
    with pytest.raises(RuntimeError, match="not annotated as an endpoint"):
        ported.plain(1)
    # an adverb on it says the same, naming the adverb (not an AttributeError)
    with pytest.raises(RuntimeError, match=r"Ported\.plain is not annotated as an endpoint.*"
                                           r"as_endpoint\(mesh\.plain\)\.call_one\(\.\.\.\)"):
        ported.slice(procs=0).plain.call_one(1)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ported.plain.nope
    ep = as_endpoint(ported.plain)
    assert list(ep.call(4).get(timeout=20).values()) == [40, 40]
    ep2 = as_endpoint(ported.slice(procs=0).plain_port, explicit_response_port=True)
    assert ep2.call_one(1).get(timeout=20) == 101
    with pytest.raises(ValueError, match="spawned actor"):
        as_endpoint(len)


def test_rref_needs_the_endpoints_propagate(ported):
    with pytest.raises(ValueError, match=r"rref\(\) needs the shapes.*propagate=fn"):
        ported.ping.rref(1)


def test_send_to_a_port_and_selection(ported):
    port, recv = Channel.open()
    send(ported.ping, (7,), {}, port=port)
    assert sorted(recv.recv().get(timeout=20) for _ in range(2)) == [7, 7]
    send(ported.add, (1,), {}, port=port, selection="choose")
    assert recv.recv().get(timeout=20) == 4
    with pytest.raises(TimeoutError):
        recv.recv().get(timeout=0.3)  # choose: one actor only
    send(ported.ping, (1,), {})  # no port: fire and forget
    with pytest.raises(ValueError, match="selection"):
        send(ported.ping, (1,), {}, selection="some")


# -- concurrent endpoints -------------------------------------------------------------------
def test_concurrent_endpoint_decorator_rules():
    with pytest.raises(ValueError, match="does not wrap @endpoint"):
        class Stacked(Actor):
            @concurrent_endpoint
            @endpoint
            async def ping(self):
                return 1

    with pytest.raises(ValueError, match="can only wrap async endpoints"):
        class SyncOne(Actor):
            @concurrent_endpoint
            def ping(self):
                return 1

    assert Gate.wait._explicit_response_port and Gate.started._explicit_response_port
    assert not Gate.ping._explicit_response_port


def test_concurrent_endpoint_runs_interleaved(procs):
    g = procs.slice(procs=0).spawn("gate", Gate)
    wait = g.wait.call_one()
    assert g.release_when_ready.call_one().get(timeout=20) == "released"
    assert wait.get(timeout=20) == "done"
    assert g.started.call_one().get(timeout=20) == "started"
    assert g.ping.call_one().get(timeout=20) == "pong"  # the started task still awaits
    with pytest.raises(runtime.ActorError, match="boom") as ei:
        g.fail.call_one().get(timeout=20)
    assert ei.value.remote_traceback.splitlines()[1].strip().startswith('File "') and \
        "_endpoints.py" not in ei.value.remote_traceback
    assert g.ping.call_one().get(timeout=20) == "pong"
    assert "Actor call gate.fail failed" in str(ei.value)  # Monarch's wording
    g.stop().get(timeout=20)


def test_concurrent_explicit_port_exception_kills_the_actor(procs, monkeypatch):
    """As in Monarch (and as a plain explicit-port endpoint): a concurrent explicit-port
    endpoint that raises fails the actor; its caller gets a SupervisionError, not a hang."""
    seen: list = []
    monkeypatch.setattr(runtime, "unhandled_fault_hook", seen.append)
    g = procs.slice(procs=0).spawn("gate_port_fail", Gate)
    assert g.ping.call_one().get(timeout=20) == "pong"
    with pytest.raises(SupervisionError, match="port_fail\\(\\) raised ValueError: explicit boom"):
        g.port_fail.call_one(False).get(timeout=20)
    with pytest.raises(SupervisionError):
        g.ping.call_one().get(timeout=20)
    assert any(f.mesh == "gate_port_fail" for f in seen)


def test_concurrent_explicit_port_answer_then_raise_fails_the_actor(procs, monkeypatch):
    """As in Monarch: a concurrent explicit-port endpoint whose task raises fails the actor,
    like a plain explicit-port endpoint; a caller still waiting gets SupervisionError (at
    once, not a timeout), an answer already sent stays delivered, later calls fail too."""
    monkeypatch.setattr(runtime, "unhandled_fault_hook", lambda failure: None)
    g = procs.slice(procs=0).spawn("gate_port_fail3", Gate)
    assert g.port_fail.call_one(True).get(timeout=20) == "answered"  # it failed after
    with pytest.raises(SupervisionError, match="explicit boom"):
        g.ping.call_one().get(timeout=20)
    h = procs.slice(procs=0).spawn("gate_port_fail4", Gate)
    with pytest.raises(SupervisionError, match="port_fail.*explicit boom"):  # not a timeout
        h.port_fail.call_one(False).get(timeout=20)
    with pytest.raises(SupervisionError):
        h.ping.call_one().get(timeout=20)


def test_inherited_concurrent_endpoints_run_interleaved(procs):
    from _monarch_actors import ChildGate

    assert ChildGate.wait._explicit_response_port and not ChildGate.release._explicit_response_port
    g = procs.slice(procs=1).spawn("child_gate", ChildGate)
    base = g.wait.call_one()
    assert g.child_wait.call_one().get(timeout=20) == "child"
    g.release.call_one().get(timeout=20)
    assert base.get(timeout=20) == "done"
    g.stop().get(timeout=20)


def test_plain_async_endpoints_stay_one_at_a_time(procs):
    s = procs.slice(procs=1).spawn("seq", Sequential)
    slow = s.slow.call_one(0.6)
    ping = s.ping.call_one()
    with pytest.raises(TimeoutError):
        ping.get(timeout=0.3)
    assert ping.get(timeout=20) == "pong" and slow.get(timeout=20) == "slow"
    s.stop().get(timeout=20)


def test_stop_cancels_concurrent_tasks_before_cleanup(tmp_path):
    path = str(tmp_path / "order")
    pm = this_host().spawn_procs(per_host={"procs": 1}, name="gate_stop",
                                 env={"GATE_CLEANUP_FILE": path})
    try:
        g = pm.spawn("gate2", Gate)
        g.hang.broadcast(path)
        assert g.ping.call_one().get(timeout=20) == "pong"
    finally:
        pm.stop().get(timeout=20)
    with open(path) as f:
        assert f.read() == "cancelled\ncleanup\n"


# -- this_proc and get_or_spawn_controller ----------------------------------------------------
def test_this_proc_hosts_actors_in_the_controller():
    m = this_proc().spawn("local_where", Where, "local")
    info = m.where.call_one().get(timeout=20)
    assert info["pid"] == os.getpid()
    assert info["thread"] != threading.current_thread().name
    assert info["tag"] == "local" and info["name"] == "local_where"
    assert list(m.where.call().get(timeout=20).values())[0]["n"] == 2
    assert asyncio.run(_await(m.where.call_one()))["n"] == 3
    m.stop().get(timeout=20)


async def _await(fut):
    return await fut


def test_this_proc_inside_an_actor_is_its_own_proc(procs):
    w = procs.slice(procs=1).spawn("w_here", Where)
    assert w.spawn_here.call_one().get(timeout=30) == procs.procs[1].pid
    w.stop().get(timeout=20)


def test_get_or_spawn_controller_is_a_singleton_from_anywhere(procs):
    a = get_or_spawn_controller("the_singleton", Where, "ctl").get(timeout=20)
    b = get_or_spawn_controller("the_singleton", Where, "ignored").get(timeout=20)
    assert a.where.call_one().get(timeout=20)["pid"] == os.getpid()
    assert b.where.call_one().get(timeout=20)["n"] == 2  # the same actor
    w = procs.spawn("asker", Where)
    from_actors = w.singleton.call("the_singleton").get(timeout=30)
    infos = [m.where.call_one().get(timeout=20) for m in from_actors.values()]
    assert [i["n"] for i in infos] == [3, 4] and infos[0]["tag"] == "ctl"
    fresh = w.slice(procs=0).singleton.call_one("made_by_actor").get(timeout=30)
    info = fresh.where.call_one().get(timeout=20)
    assert info["pid"] == os.getpid() and info["tag"] == "from-actor"
    assert w.slice(procs=1).asingleton.call_one("awaited").get(timeout=30) == os.getpid()
    w.stop().get(timeout=20)


# -- meshes as arguments, generic annotations ------------------------------------------------
def test_generic_mesh_annotations(ported):
    assert ActorMesh[Where] is ActorMesh and ValueMesh[int] is ValueMesh
    assert isinstance(ported.ping, runtime.Endpoint[[int], int])


def test_proc_mesh_is_a_picklable_reference(procs):
    w = procs.slice(procs=0).spawn("spawner", Where)
    pids = w.spawn_on.call_one(procs).get(timeout=40)
    assert pids == sorted(p.pid for p in procs.procs)
    pids = w.spawn_on.call_one(procs.slice(procs=1)).get(timeout=40)
    assert pids == [procs.procs[1].pid]
    assert "only its owner can stop it" in w.try_stop.call_one(procs).get(timeout=20)
    w.stop().get(timeout=20)


def test_host_mesh_is_a_picklable_reference(procs):
    w = procs.slice(procs=0).spawn("host_user", Where)
    n = w.procs_on.call_one(this_host()).get(timeout=60)
    assert n == 2
    w.stop().get(timeout=20)


def test_asyncio_tasks_of_an_actor_run_between_messages(procs, tmp_path):
    from _monarch_actors import Background

    b = procs.slice(procs=0).spawn("background", Background)
    ticks = tmp_path / "ticks"
    b.start.call_one(str(ticks)).get(timeout=20)
    first = b.ticks_now.call_one().get(timeout=20)

    def ticked() -> int:
        try:
            return int(ticks.read_text() or 0)
        except (OSError, ValueError):
            return 0

    deadline = time.monotonic() + 20
    while ticked() < first + 10:  # no message meanwhile: the loop still runs the task
        assert time.monotonic() < deadline, (first, ticked())
        time.sleep(0.02)
    later = b.ticks_now.call_one().get(timeout=20)
    assert later >= first + 10, (first, later)
    assert b.finish.call_one().get(timeout=20) >= later
    b.stop().get(timeout=20)


def test_sync_and_async_endpoints_mix_in_one_actor(procs, ported, tmp_path):
    """Monarch refuses such an actor at spawn (docs/porting.md says why this runtime keeps
    it): they share state, keep one-at-a-time order, both may wait on other actors, and
    an async __cleanup__ runs with sync endpoints."""
    from _monarch_actors import Mixed

    path = tmp_path / "cleanup"
    m = procs.slice(procs=1).spawn("mixed", Mixed, str(path))
    futs = [m.add_async.call_one(1), m.add_sync.call_one(2), m.add_async.call_one(3),
            m.add_sync.call_one(4)]
    want = [("async", 1), ("sync", 2), ("async", 3), ("sync", 4)]
    assert [f.get(timeout=20) for f in futs] == [want[:i + 1] for i in range(4)]
    other = ported.slice(procs=0)
    assert m.ask_sync.call_one(other).get(timeout=30) == 7
    assert m.ask_async.call_one(other).get(timeout=30) == 8
    m.stop().get(timeout=20)
    assert path.read_text() == "cleaned after 4"


def test_an_endpoint_named_stop_shadows_the_mesh_method(procs):
    """As in Monarch (its meshes set each endpoint as an attribute): `mesh.stop` is the
    endpoint; ActorMesh.stop(mesh) still stops the actors, and stopping the procs too."""
    from _monarch_actors import StopEndpoint

    m = procs.spawn("stopper", StopEndpoint)
    assert list(m.stop.call().get(timeout=20).values()) == ["the endpoint"] * 2
    assert m.slice(procs=1).stop.call_one().get(timeout=20) == "the endpoint"  # a view too
    assert not m.stopped
    ActorMesh.stop(m).get(timeout=20)
    assert m.stopped
