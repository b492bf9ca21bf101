"""The health model: per-actor state (starting, idle, busy, failed, stopped) and events."""

from __future__ import annotations

import os
import signal
import time

import pytest

import runtime
from runtime import ActorState, this_host
from _actors import Echo, FailingInit
from _util import wait_until

pytestmark = pytest.mark.timeout(60)


def actor_states(name):
    m = runtime.get_runtime().health.mesh(name)
    return {a.rank: a for a in m.actors} if m else {}


def test_states_through_a_mesh_lifetime(monkeypatch):
    monkeypatch.setattr(runtime, "unhandled_fault_hook", lambda f: None)
    rt = runtime.get_runtime()
    events = []
    unsubscribe = rt.health.subscribe(events.append)
    try:
        pm = this_host().spawn_procs(per_host={"procs": 2})
        m = pm.spawn("watched", Echo)
        assert {a.state for a in actor_states("watched").values()} <= {ActorState.STARTING,
                                                                       ActorState.IDLE}
        m.initialized.get(timeout=30)
        wait_until(lambda: all(a.state == ActorState.IDLE
                               for a in actor_states("watched").values()), what="all idle")
        fut = m.slice(procs=0).sleep.call_one(2.0)
        busy = wait_until(lambda: actor_states("watched")[0].state == ActorState.BUSY
                          and actor_states("watched")[0])
        assert busy.endpoint == "sleep" and busy.since <= time.time()
        fut.get(timeout=10)
        wait_until(lambda: actor_states("watched")[0].state == ActorState.IDLE)
        snap = rt.health.mesh("watched")
        assert snap.procs and all(p.rss_bytes > 0 for p in snap.procs)
        os.kill(pm.procs[1].pid, signal.SIGKILL)
        failed = wait_until(lambda: actor_states("watched")[1].state == ActorState.FAILED
                            and actor_states("watched")[1], timeout=5)
        assert "SIGKILL" in failed.last_error
        assert any(e.mesh == "watched" and e.rank == 1 and e.new == ActorState.FAILED
                   for e in events)
        pm.stop().get(timeout=15)
    finally:
        unsubscribe()


def test_init_failure_shows_failed_with_traceback():
    pm = this_host().spawn_procs(per_host={"procs": 1})
    bad = pm.spawn("badinit", FailingInit)
    with pytest.raises(runtime.SupervisionError):
        bad.initialized.get(timeout=30)
    a = actor_states("badinit")[0]
    assert a.state == ActorState.FAILED and "init exploded" in a.last_traceback
    pm.stop().get(timeout=15)
