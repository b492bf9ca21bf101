"""Monarch's HostMesh API through the public API: `initialized`, `stop()` (procs end, the
hosts stay), `spawn_procs(proc_bind=...)` pinning procs to CPUs."""

from __future__ import annotations

import os

import pytest

from runtime import this_host
from _monarch_supervise_actors import Dies
from _procs import pid_alive

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def hosts():
    hm = this_host()
    yield hm
    hm.stop().get(timeout=60)


def test_stop_ends_the_procs_and_keeps_the_hosts(hosts):
    assert hosts.initialized.get(timeout=10) is True  # Monarch's Future[Literal[True]]
    pm = hosts.spawn_procs(per_host={"procs": 2})
    assert pm.initialized.get(timeout=60) is True
    pm.spawn("d", Dies).ok.call().get(timeout=60)  # procs are up (their pids known)
    pids = [p.pid for p in pm.procs]
    assert all(p > 0 and pid_alive(p) for p in pids)
    assert hosts.stop().get(timeout=30) is None
    assert pm.stopped and not any(pid_alive(p) for p in pids)
    pm2 = hosts.spawn_procs(per_host={"procs": 1})  # the host agent is still there
    assert pm2.spawn("d", Dies).ok.call_one().get(timeout=60) == 1


def test_proc_bind_pins_each_proc(hosts):
    cpus = sorted(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match=r"proc_bind length \(1\) must equal procs_per_host "
                                         r"\(2\)"):
        hosts.spawn_procs(per_host={"procs": 2}, proc_bind=[{"cpus": "0"}])
    with pytest.raises(ValueError, match="supported keys"):
        hosts.spawn_procs(per_host={"procs": 1}, proc_bind=[{"membind": "0"}])
    a, b = cpus[0], cpus[-1]
    pm = hosts.spawn_procs(per_host={"procs": 2}, proc_bind=[{"cpus": str(a)}, {"cpus": str(b)}])
    pm.spawn("d", Dies).ok.call().get(timeout=60)  # procs are up (their pids known)
    pids = [p.pid for p in pm.procs]
    assert all(p > 0 for p in pids) and [os.sched_getaffinity(p) for p in pids] == [{a}, {b}]


def test_with_python_executable_is_refused_naming_the_alternative(hosts):
    """Deliberate difference: procs are forked from the agent's zygote, so a per-mesh
    interpreter is refused with the reason and the way to get one (agents started with it)."""
    with pytest.raises(NotImplementedError, match=r"(?s)with_python_executable\('/opt/py/bin/"
                       r"python'\) is not supported: procs are forked from a zygote.*"
                       r"LocalJob\(hosts=N, python=PATH\)"):
        hosts.with_python_executable("/opt/py/bin/python")
