"""A kept job outlives its kernel: `%mesh alloc ... --job process --keep 2m` in one kernel,
actors with state, the kernel SIGKILLed, a new kernel's `%mesh attach-job PATH` binds the
same meshes by name with their state and names the call the old kernel had in flight as
lost, calls work, `%mesh list` shows the lease, and `%mesh stop` ends the job with nothing
left."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from _kernel_helpers import kill_all, snapshot, wait_gone

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _util import wait_until  # noqa: E402

pytestmark = pytest.mark.timeout(240)

COUNTER = '''
from runtime import Actor, endpoint

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
    def slow(self, seconds):
        import time
        time.sleep(seconds)
        return seconds
'''


def test_a_kept_job_is_reattached_by_a_new_kernel(tmp_path, monkeypatch):
    from test_kernel_client import Kernel

    monkeypatch.setenv("MONARCH_HEARTBEAT_TIMEOUT", "2")  # the old kernel counts as gone
    old = Kernel()
    new = None
    procs: dict[int, float] = {}
    workdir = None
    try:
        old.execute(f"import os; os.chdir({str(tmp_path)!r})")
        r = old.execute("%mesh alloc trainers --job process --hosts 1 --per-host procs=2 "
                        "--keep 2m --no-progress", timeout=120)
        assert r["error"] is None, r["error"]
        assert "%mesh attach-job" in r["stdout"], r["stdout"]
        saved = tmp_path / ".monarch" / "jobs" / "trainers.pkl"
        assert saved.exists()
        assert old.execute(COUNTER)["error"] is None
        r = old.execute("counters = trainers.spawn('counters', Counter, 10)\n"
                        "counters.incr.call(5).get(timeout=60)\n"
                        "counters.slice(procs=1).incr.call_one(100).get(timeout=60)")
        assert r["error"] is None, r["error"]
        pids = old.value("sorted(trainers_job.agent_pids.values()) + "
                         "[p.pid for p in trainers.procs]")
        workdir = Path(old.value("str(trainers_job.workdir)"))
        procs.update(snapshot(pids))
        listed = old.execute("%mesh list")
        shown = listed["stdout"] + "".join(listed["results"]) + "".join(listed["displays"])
        assert "kept: lease ends 120 s after this kernel" in shown, shown
        # a call in flight when the kernel dies: reported to the new one, once, as lost
        r = old.execute("pending = counters.slice(procs=0).slow.call_one(5)")
        assert r["error"] is None, r["error"]
        old.track_processes()
        os.kill(old.km.provisioner.process.pid, 9)  # the kernel dies without a word
        old.km.shutdown_kernel(now=True)
        assert wait_gone(procs, timeout=3) == sorted(procs)  # kept: all still alive

        new = Kernel()
        new.execute(f"import os; os.chdir({str(tmp_path)!r})")

        def attached() -> bool:
            r = new.execute("%mesh attach-job .monarch/jobs/trainers.pkl", timeout=90)
            if r["error"] is not None:
                assert "takeover" in r["error"]["evalue"], r["error"]
                return False
            assert "counters" in r["stdout"], r["stdout"]
            said.append(r["stdout"])
            return True

        said: list = []

        wait_until(attached, timeout=60, every=0.5, what="the new kernel reattaches")
        assert "lost with the previous kernel: counters[0].slow" in said[0], said[0]
        assert new.value("sorted(counters.get.call().get(timeout=30).values())") == [15, 115]
        assert new.value("counters.slice(procs=0).incr.call_one(1).get(timeout=30)") == 16
        assert new.value("[p.pid for p in trainers.procs]") == pids[-2:]
        r = new.execute("%mesh stop trainers")
        assert r["error"] is None, r["error"]
        assert not wait_gone(procs, timeout=20), "the job's agents and procs end"
        assert not workdir.exists()
    finally:
        if new is not None:
            new.close()
        old.close()
        kill_all(procs)
        if workdir is not None:  # a failed test: the agents were killed before removing it
            shutil.rmtree(workdir, ignore_errors=True)
