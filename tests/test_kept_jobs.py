"""Kept jobs: a ProcessJob with `keep=` outlives its controller for a lease; another
controller reattaches (`Job.load(path).state()`, `job.proc_mesh(name)`,
`pm.actor_mesh(name)`) and finds the actors' state; the old controller's calls in flight
are reported once as lost; a second controller is refused while the first lives; a lease
that ends with nobody attached ends every proc and agent and leaves no file."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from _procs import pid_alive
from tests._util import wait_until

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parent.parent

# the controller: a kept job, procs and actors with state, a call left running, then it
# waits to be killed. The actor class is defined here (in __main__): it reaches the procs
# by value, and the next controller gets it back from them.
CONTROLLER = textwrap.dedent("""
    import json, sys, time
    import runtime
    from runtime import Actor, endpoint
    from runtime.job import ProcessJob

    class Counter(Actor):
        def __init__(self, start):
            self.value = start

        @endpoint
        def incr(self, by=1):
            self.value += by
            return self.value

        @endpoint
        def get(self):
            return self.value

        @endpoint
        def slow(self, t):
            time.sleep(t)
            return self.value

    job = ProcessJob({"hosts": 1}, keep=float(sys.argv[2]))
    hosts = job.state(cached_path=sys.argv[1]).hosts
    procs = hosts.spawn_procs(per_host={"procs": 2}, name="trainers")
    counters = procs.spawn("counters", Counter, 10)
    counters.incr.call(5).get(timeout=60)                      # 15 on each rank
    counters.slice(procs=1).incr.call_one(100).get(timeout=60)  # rank 1: 115
    time.sleep(1.0)  # heartbeats heard since these answers: they are not counted as lost
    if sys.argv[3] == "inflight":
        counters.slice(procs=0).slow.call_one(float(sys.argv[4]))  # never waited for
    print(json.dumps({"agents": sorted(job.agent_pids.values()),
                      "procs": [p.pid for p in procs.procs],
                      "workdir": str(job.workdir),
                      "health_keep": [m.keep for m in runtime.get_runtime().health.snapshot()
                                      if m.name == "counters"]}), flush=True)
    time.sleep(600)
""")


# a third controller takes the job over from a live one, reads the state, and exits
# normally: its kept procs stay for the next one
TAKER = textwrap.dedent("""
    import json, sys, warnings
    from runtime.job import Job
    job = Job.load(sys.argv[1])
    job.state(cached_path=None, takeover=True)
    pm = job.proc_mesh("trainers")
    values = pm.actor_mesh("counters").get.call().get(timeout=60)
    print(json.dumps({"values": sorted(values.values()), "lost": len(pm.lost_calls)}),
          flush=True)
""")


def _start_controller(path: Path, keep: float, mode: str = "", arg: str = "0") -> tuple:
    env = {**os.environ, "MONARCH_HEARTBEAT_TIMEOUT": "2"}
    p = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(path), str(keep), mode, arg],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env)
    line = p.stdout.readline()
    if not line:
        p.kill()
        raise AssertionError(f"controller failed: {p.stderr.read()[-3000:]}")
    return p, json.loads(line)


def _reap(pids, workdir: str = "", ctl: "subprocess.Popen | None" = None) -> None:
    """Kill what a failed test left (by pid), and the job directory its agents kept; close
    the pipes of the controller `ctl` (once the pids are gone: they may hold them open)."""
    for pid in pids:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    if ctl is not None:
        ctl.wait(10)
        ctl.stdout.close()
        ctl.stderr.close()
    if workdir:
        shutil.rmtree(workdir, ignore_errors=True)


def _attach(path: Path, takeover: bool = False):
    """Job.load(path).state(); None while the agents still refuse (old controller alive)."""
    from runtime.errors import AttachRefusedError
    from runtime.job import Job

    job = Job.load(path)
    try:
        job.state(cached_path=None, timeout=30, takeover=takeover)
    except AttachRefusedError:
        return None
    return job


def test_a_killed_controllers_meshes_are_reattached_with_their_state(tmp_path):
    from runtime.errors import AttachRefusedError
    from runtime.job import Job
    from runtime.transport.auth import private_dir  # noqa: F401 - the runtime loads
    path = tmp_path / "job.pkl"
    ctl, info = _start_controller(path, keep=120, mode="inflight", arg="3")
    pids = info["agents"] + info["procs"] + [ctl.pid]
    job = None
    try:
        # the first controller is alive: a second one is refused, naming it
        with pytest.raises(AttachRefusedError, match="takeover=True"):
            Job.load(path).state(cached_path=None, timeout=30)
        ctl.send_signal(signal.SIGKILL)
        ctl.wait(10)
        from runtime import LostCallsWarning

        job = wait_until(lambda: _attach(path), timeout=30, every=0.2,
                         what="the agents accept a new controller once the old one is gone")
        with pytest.warns(LostCallsWarning, match=r"counters\[0\]\.slow"):  # said once
            pm = job.proc_mesh("trainers")
        assert [p.pid for p in pm.procs] == info["procs"]  # the same processes
        counters = pm.actor_mesh("counters")
        values = counters.get.call().get(timeout=30)
        assert sorted(values.values()) == [15, 115]
        assert counters.slice(procs=1).incr.call_one(1).get(timeout=30) == 116
        # the call left in flight is reported once, as lost with the old controller
        lost = pm.lost_calls
        assert [(c.mesh, c.rank, c.endpoint) for c in lost] == [("counters", 0, "slow")]
        assert lost[0].state in ("running", "finished")
        with pytest.raises(KeyError, match="counters"):
            pm.actor_mesh("nope")
        with pytest.raises(KeyError, match="trainers"):
            job.proc_mesh("nope")
        assert pm.keep == 120
        # the health views (dashboard, monarch-admin) show the mesh kept, with its lease,
        # and when this controller reattached it; the old controller's spawned it kept
        assert info["health_keep"] == [120.0]
        import runtime

        (health,) = [m for m in runtime.get_runtime().health.snapshot()
                     if m.name == "counters"]
        assert health.keep == 120 and health.reattached is not None
        # another controller takes over (this one is alive) and exits normally: it sees
        # the state, no lost call again (reported once), and the procs stay
        r = subprocess.run([sys.executable, "-c", TAKER, str(path)], cwd=ROOT, text=True,
                           capture_output=True, timeout=120,
                           env={**os.environ, "MONARCH_HEARTBEAT_TIMEOUT": "2"})
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.loads(r.stdout.strip().splitlines()[-1]) == {"values": [15, 116],
                                                                 "lost": 0}
        assert all(pid_alive(p) for p in info["procs"])
        job.kill()
        assert wait_until(lambda: not any(pid_alive(p) for p in pids), timeout=20,
                          what="kill() ends the kept procs and agents")
        assert not Path(info["workdir"]).exists()
    finally:
        if job is not None:
            job.kill()
        _reap(pids, info["workdir"], ctl)


def test_a_lease_that_ends_with_nobody_attached_leaves_nothing(tmp_path):
    from runtime.job import Job, JobError

    path = tmp_path / "job.pkl"
    ctl, info = _start_controller(path, keep=2)
    pids = info["agents"] + info["procs"] + [ctl.pid]
    try:
        ctl.send_signal(signal.SIGKILL)
        ctl.wait(10)
        # 2 x heartbeat timeout (controller silent), then the 2 s lease
        wait_until(lambda: not any(pid_alive(p) for p in info["procs"]), timeout=30,
                   every=0.1, what="the kept procs end when their lease ends")
        wait_until(lambda: not any(pid_alive(p) for p in info["agents"]), timeout=15,
                   every=0.1, what="the kept job's agents end after their lease")
        wait_until(lambda: not Path(info["workdir"]).exists(), timeout=10, every=0.1,
                   what="the job's directory is removed")
        with pytest.raises(JobError, match="has ended.*lease"):
            Job.load(path).state(cached_path=None, timeout=10)
    finally:
        _reap(pids, info["workdir"], ctl)
