"""sync_workspace across real hosts (network namespaces of the test cluster, each host agent
with its own copy of the workspace): live procs on both hosts (same pids) run the edited code
with their state kept, a proc spawned afterwards too, a syntax error is named per host."""
from __future__ import annotations

import subprocess
import sys

import pytest

import runtime
from runtime import Workspace, WorkspaceSyncError

from .agents import Agents

pytestmark = pytest.mark.timeout(180)

SOURCE = '''
import os
from runtime import Actor, endpoint

VALUE = {value}

class Keeper(Actor):
    def __init__(self):
        self.n = 0

    @endpoint
    def bump(self):
        self.n += 1
        return (VALUE, self.n, os.getpid(), __file__)
'''


def test_edit_sync_reload_on_two_hosts(cluster, tmp_path):
    kd = tmp_path / "key"
    kd.mkdir(mode=0o700)
    key = kd / "cluster.key"
    subprocess.run([sys.executable, "-m", "runtime.transport.auth", "keygen", str(key)],
                   check=True, capture_output=True)
    d = tmp_path / "mhproj"
    d.mkdir()
    (d / "mh_trainer.py").write_text(SOURCE.format(value=1))
    agents = Agents(cluster, key, tmp_path)
    sys.path.insert(0, str(d))
    try:
        addrs = [agents.start(n) for n in cluster.nodes[:2]]
        hosts = runtime.attach_to_workers(addrs, key_file=str(key))
        first = hosts.sync_workspace(Workspace(dirs=[str(d)]))
        assert len({h.root for h in first.hosts}) == 2
        import mh_trainer

        procs = hosts.spawn_procs(per_host={"procs": 1})
        k = procs.spawn("k", mh_trainer.Keeper)
        before = sorted(k.bump.call().get(timeout=60).values())
        assert [v[:2] for v in before] == [(1, 1), (1, 1)]
        assert {v[3].rsplit("/current/", 1)[0] for v in before} == {h.root for h in first.hosts}
        (d / "mh_trainer.py").write_text(SOURCE.format(value=2))
        hosts.sync_workspace(Workspace(dirs=[str(d)]), auto_reload=True)
        after = sorted(k.bump.call().get(timeout=60).values())
        assert [v[:2] for v in after] == [(2, 2), (2, 2)]
        assert sorted(v[2] for v in after) == sorted(v[2] for v in before)
        k2 = hosts.spawn_procs(per_host={"procs": 1}).spawn("k2", mh_trainer.Keeper)
        assert [v[:2] for v in k2.bump.call().get(timeout=60).values()] == [(2, 1), (2, 1)]
        (d / "mh_trainer.py").write_text(SOURCE.format(value=3) + "\nbroken(:\n")
        with pytest.raises(WorkspaceSyncError) as ei:
            hosts.sync_workspace(Workspace(dirs=[str(d)]), auto_reload=True)
        for h in ei.value.result.hosts:
            assert f"host {h.host} ({h.address}) proc" in str(ei.value)
        assert "SyntaxError" in str(ei.value)
        assert [v[:2] for v in sorted(k.bump.call().get(timeout=60).values())] == [(2, 3)] * 2
        hosts.shutdown()
    finally:
        sys.path.remove(str(d))
        sys.modules.pop("mh_trainer", None)
        agents.stop()
