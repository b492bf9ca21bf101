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
