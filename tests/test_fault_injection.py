"""Failures on demand (`runtime.inject_actor_failures`, Monarch's fault_injection): the
named classes fail at random and their owners hear `MeshFailure.is_injected`; supervisors
named in `supervisors=` handle injected failures only; classes not named are untouched."""

from __future__ import annotations

import pytest

import runtime
from runtime import (ActorFailurePolicy, SupervisionError, inject_actor_failures,
                     this_host)
from _fault_injection_actors import ChaosOwner, Crashes, Flaky, Steady
from _util import wait_until

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def procs(failures):
    owners = this_host().spawn_procs(per_host={"procs": 1}, name="fi_owners")
    kids = this_host().spawn_procs(per_host={"procs": 2}, name="fi_kids")
    try:
        yield owners, kids
    finally:
        owners.stop().get(timeout=30)
        kids.stop().get(timeout=30)


def test_injected_failures_reach_the_supervisor_with_is_injected(procs):
    owners, kids = procs
    with inject_actor_failures({Flaky: ActorFailurePolicy(1.0, 0.1)},
                               supervisors=[ChaosOwner]):
        owner = owners.spawn("owner", ChaosOwner, kids, Flaky)
    seen = wait_until(lambda: len(got := owner.failures.call_one().get(timeout=10)) >= 2
                      and got, timeout=30, what="both ranks' injected failures")
    assert sorted(r for _, ranks, _, _ in seen for r in ranks) == [0, 1], seen
    for mesh, _, injected, cause in seen:
        assert mesh == "kids" and injected is True, seen
        assert "injected failure" in cause and "Flaky" in cause, cause


def test_the_controller_hears_is_injected_and_other_classes_are_untouched(procs, failures):
    _, kids = procs
    with inject_actor_failures({Flaky: ActorFailurePolicy(1.0, 0.1)}):
        flaky = kids.spawn("flaky", Flaky)
        steady = kids.spawn("steady", Steady)
    wait_until(lambda: len(failures) >= 2, timeout=30, what="both ranks reported")
    assert {f.mesh for f in failures} == {"flaky"}
    assert all(f.is_injected for f in failures), [str(f) for f in failures]
    with pytest.raises(SupervisionError):
        flaky.ping.call().get(timeout=10)
    # the class nobody named still answers on the very same procs
    assert list(steady.ping.call().get(timeout=10).values()) == [2, 2]


def test_a_chaos_supervisor_leaves_a_real_fault_unhandled(procs, failures):
    owners, kids = procs
    with inject_actor_failures({}, supervisors=[ChaosOwner]):
        owner = owners.spawn("owner", ChaosOwner, kids, Crashes)
    owner.initialized.get(timeout=30)
    owner.crash_kids.call_one().get(timeout=30)
    # not injected: the patched __supervise__ is not called, the owner fails, the root hears
    wait_until(lambda: any(f.mesh == "owner" for f in failures), timeout=30,
               what="the owner's failure at the root")
    f = next(f for f in failures if f.mesh == "owner")
    assert f.is_injected is False
    assert f.caused_by is not None and f.caused_by.mesh == "kids"
    assert f.caused_by.is_injected is False


def test_raise_mode_fails_calls_not_the_actor(procs, failures):
    """`mode="raise"`: a hit makes the actor's next call raise InjectedFault (an ActorError
    naming it, the actor lives on): no failure reaches anyone, and later calls answer."""
    _, kids = procs
    with inject_actor_failures({Flaky: ActorFailurePolicy(1.0, 0.2, mode="raise")}):
        flaky = kids.spawn("raisy", Flaky)
    one = flaky.slice(procs=0)
    outcomes: list = []

    def call() -> bool:
        try:
            outcomes.append(one.ping.call_one().get(timeout=10))
        except runtime.ActorError as e:
            outcomes.append(e)
        return any(isinstance(o, runtime.ActorError) for o in outcomes) and \
            outcomes[-1] == 1
    wait_until(call, 30, "no raise, or no answer after one", every=0.05)
    err = next(o for o in outcomes if isinstance(o, runtime.ActorError))
    assert "InjectedFault" in str(err) and "injected failure" in str(err), str(err)
    assert "the actor lives on" in str(err)
    assert failures == []  # the actor did not fail: nothing to supervise
    flaky.stop().get(timeout=30)


def test_inject_raise_makes_one_live_actor_raise_once(procs, failures):
    """`runtime.inject_raise`: an actor already running, of a class no policy names, raises
    InjectedFault (naming the reason) at its next call only; the actor lives on, the other
    ranks are untouched, nothing is supervised."""
    _, kids = procs
    steady = kids.spawn("steady", Steady)
    steady.initialized.get(timeout=30)
    assert runtime.inject_raise(steady, 1, reason="a test's chaos").get(timeout=30) is True
    with pytest.raises(runtime.ActorError, match="InjectedFault") as e:
        steady.slice(procs=1).ping.call_one().get(timeout=30)
    assert "injected failure: a test's chaos raised in actor Steady steady (rank 1)" in \
        str(e.value) and "the actor lives on" in str(e.value), str(e.value)
    assert steady.slice(procs=1).ping.call_one().get(timeout=30) == 2  # once, and it lives
    assert steady.slice(procs=0).ping.call_one().get(timeout=30) == 2
    with pytest.raises(IndexError, match="rank 2"):
        runtime.inject_raise(steady, 2)
    with pytest.raises(TypeError, match="ActorMesh"):
        runtime.inject_raise(kids, 0)
    assert failures == []
    steady.stop().get(timeout=30)
    assert runtime.inject_raise(steady, 0).get(timeout=30) is False  # a stopped mesh


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="probability"):
        ActorFailurePolicy(1.5)
    with pytest.raises(ValueError, match="interval_seconds"):
        ActorFailurePolicy(0.5, 0)
    with pytest.raises(ValueError, match="mode must be 'fail'"):
        ActorFailurePolicy(0.5, 1.0, mode="explode")
    with pytest.raises(TypeError, match="Actor subclasses"):
        with inject_actor_failures({int: ActorFailurePolicy(0.5)}):
            pass
    with pytest.raises(TypeError, match="ActorFailurePolicy"):
        with inject_actor_failures({Flaky: 0.5}):
            pass
    with pytest.raises(TypeError, match="must define __supervise__"):
        with inject_actor_failures({}, supervisors=[Steady]):
            pass
