"""When the machine cannot host the namespaced cluster, the tests say why (no cluster needed)."""
from __future__ import annotations

import pytest

from . import conftest, mhcluster


def test_reason_without_root(monkeypatch):
    monkeypatch.setattr(mhcluster.os, "geteuid", lambda: 1000)
    assert "root" in mhcluster.unavailable()


def test_reason_without_slurm(monkeypatch):
    if mhcluster.os.geteuid() != 0:
        pytest.skip("the root check comes first")
    real = mhcluster.shutil.which
    monkeypatch.setattr(mhcluster.shutil, "which", lambda c: None if c == "slurmd" else real(c))
    assert "slurmd" in mhcluster.unavailable()


def test_required_turns_skip_into_failure(monkeypatch):
    monkeypatch.setenv("MONARCH_REQUIRE_MULTIHOST", "1")
    with pytest.raises(pytest.fail.Exception, match="required"):
        conftest._skip_or_fail("no namespaces")
    monkeypatch.delenv("MONARCH_REQUIRE_MULTIHOST")
    with pytest.raises(pytest.skip.Exception, match="no namespaces"):
        conftest._skip_or_fail("no namespaces")


_ABANDON = """
import sys, time
sys.path.insert(0, {tests!r})
from multihost.mhcluster import Cluster
c = Cluster(n=1, net="10.78.0", prefix="mz")
c.up()
print(c.dir, *c.pids, flush=True)
time.sleep(120)
"""


def test_a_cluster_left_up_by_a_killed_run_is_reclaimed_by_the_next():
    """A test run killed from outside never runs its cluster's tear-down: the next run finds
    the bridge, sees that the test process that recorded it is gone, tears that cluster
    down (its daemons, namespaces, bridge and directory) and has the machine, instead of
    skipping every multihost test."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    if mhcluster.unavailable("mz"):
        pytest.skip(mhcluster.unavailable("mz"))
    tests = str(Path(__file__).resolve().parents[1])
    p = subprocess.Popen([sys.executable, "-c", _ABANDON.format(tests=tests)], text=True,
                         stdout=subprocess.PIPE)
    try:
        d, *pids = p.stdout.readline().split()
        assert pids and Path("/sys/class/net/mzbr0").exists()
        assert "another multihost test run" in mhcluster.unavailable("mz")  # its owner runs
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        assert mhcluster.unavailable("mz") is None  # reclaimed
        assert not Path("/sys/class/net/mzbr0").exists() and not Path(d).exists()
        assert not any(mhcluster.pid_alive(int(pid)) for pid in pids)
        assert not os.path.exists("/run/netns/mz1")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        p.stdout.close()
        mhcluster.reclaim_abandoned("mz")
