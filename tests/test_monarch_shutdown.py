"""Every stop/shutdown call returns a Future[None] (as in Monarch): `.get()` and `await`."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import asyncio, os, sys, time
    sys.path.insert(0, "tests")
    import runtime
    from runtime import Future, shutdown_context, this_host
    from runtime.job import LocalJob
    from _actors import Echo

    def dead(pid):
        try:
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True

    # a job's host mesh: shutdown() -> Future, .get() is None, the agent's procs end
    job = LocalJob(1, progress=False)
    hosts = job.state().hosts
    pm = hosts.spawn_procs(per_host={"procs": 2})
    pids = [p.pid for p in pm.procs]
    f = hosts.shutdown()
    assert isinstance(f, Future) and f.get(timeout=30) is None
    deadline = time.monotonic() + 10
    while not all(dead(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(dead(p) for p in pids), pids
    job.cleanup()  # kill, and remove the job's directory

    # await works on every stop/shutdown
    async def main():
        pm = this_host().spawn_procs(per_host={"procs": 1})
        echo = pm.spawn("echo", Echo)
        assert await echo.ping.call_one(3) == 3
        assert await echo.stop() is None
        assert await pm.stop() is None
        assert await this_host().shutdown() is None
        pm2 = this_host().spawn_procs(per_host={"procs": 1})   # a fresh local agent
        pid = pm2.procs[0].pid
        assert await shutdown_context() is None
        return pid

    pid = asyncio.run(main())
    deadline = time.monotonic() + 10
    while not dead(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert dead(pid)
    f = runtime.shutdown()       # nothing left: still a resolved Future
    assert isinstance(f, Future) and f.get() is None
    print("OK")
""")


def test_shutdown_calls_return_futures():
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                       text=True, timeout=100)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stderr[-3000:]


LIFECYCLE = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, "tests")
    import cloudpickle
    import runtime
    from runtime import Actor, endpoint
    from runtime.job import LocalJob

    class Echo(Actor):
        @endpoint
        def ping(self, x):
            return x

    job = LocalJob(1, progress=False)
    hosts = job.state().hosts
    assert hosts.is_fake_in_process is False
    # a host mesh received by reference (pickled) cannot be shut down by its holder
    ref = cloudpickle.loads(cloudpickle.dumps(hosts))
    try:
        ref.shutdown()
        raise SystemExit("a reference was shut down")
    except RuntimeError as e:
        assert "reference instead of owned" in str(e), e

    async def main():
        async with hosts as hm:            # shut down when the block ends
            pm = hm.spawn_procs(per_host={"procs": 1})
            assert await pm.spawn("e", Echo).ping.call_one(5) == 5
        for again in (lambda: hm.spawn_procs(per_host={"procs": 1}), hm.shutdown):
            try:
                again()
                raise SystemExit("a shut-down host mesh was used")
            except RuntimeError as e:
                assert "HostMesh has already been shut down" in str(e), e
    asyncio.run(main())
    job.cleanup()
    print("OK")
""")


def test_host_mesh_context_manager_and_used_after_shutdown():
    r = subprocess.run([sys.executable, "-c", LIFECYCLE], cwd=ROOT, capture_output=True,
                       text=True, timeout=100)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stderr[-3000:]
