"""sync_workspace across real hosts (network namespaces of the test cluster, each host agent
with its own copy of the workspace): live procs on both hosts (same pids) run the edited code
with their state kept, a proc spawned afterwards too, a syntax error is named per host; a host
killed (or cut off) in the middle of a sync fails that host's sync, by name, within the
timeout, while the other host's sync completes."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import runtime
from runtime import Workspace, WorkspaceSyncError
from runtime.config import config

from .agents import HB_TIMEOUT, Agents

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

    @endpoint
    def value_of(self, mod, name):
        import importlib
        try:
            return getattr(importlib.import_module(mod), name)
        except ImportError as e:
            return f"ImportError: {{e}}"
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
        # an added module imports; an edit that keeps size and mtime is seen
        (d / "mh_added.py").write_text("X = 'added'\n")
        src = d / "mh_trainer.py"
        st = src.stat()
        src.write_text(SOURCE.format(value=4))
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert src.stat().st_size == st.st_size
        res = hosts.sync_workspace(Workspace(dirs=[str(d)]), auto_reload=True)
        assert [(h.sent_files, h.changed) for h in res.hosts] == [(2, 2)] * 2
        assert [v[:2] for v in sorted(k.bump.call().get(timeout=60).values())] == [(4, 3)] * 2
        assert list(k.value_of.call("mh_added", "X").get(timeout=60).values()) == ["added"] * 2
        # an unchanged tree moves no file contents
        again = hosts.sync_workspace(Workspace(dirs=[str(d)]), auto_reload=True)
        assert [(h.sent_files, h.sent_bytes, h.changed) for h in again.hosts] == [(0, 0, 0)] * 2
        # a deleted module is gone
        (d / "mh_added.py").unlink()
        res = hosts.sync_workspace(Workspace(dirs=[str(d)]), auto_reload=True)
        assert [h.deleted for h in res.hosts] == [1, 1]
        assert all(not (Path(h.root) / "current" / "mhproj" / "mh_added.py").exists()
                   for h in res.hosts)
        gone = list(k.value_of.call("mh_added", "X").get(timeout=60).values())
        assert all(v.startswith("ImportError") for v in gone), gone
        (d / "mh_trainer.py").write_text(SOURCE.format(value=3) + "\nbroken(:\n")
        with pytest.raises(WorkspaceSyncError) as ei:
            hosts.sync_workspace(Workspace(dirs=[str(d)]), auto_reload=True)
        for h in ei.value.result.hosts:
            assert f"host {h.host} ({h.address}) proc" in str(ei.value)
        assert "SyntaxError" in str(ei.value)
        assert [v[:2] for v in sorted(k.bump.call().get(timeout=60).values())] == [(4, 4)] * 2
        hosts.shutdown()
    finally:
        sys.path.remove(str(d))
        sys.modules.pop("mh_trainer", None)
        agents.stop()


TIMEOUT = 10.0  # the sync's timeout (workspace_timeout) in the test below


@pytest.mark.parametrize("fault", ["killed", "cut_off"])
def test_a_host_lost_mid_sync_fails_that_host_within_the_timeout(cluster, tmp_path, fault,
                                                                monkeypatch):
    """The victim's agent is lost at a step of the sync the test chooses: its first batch of
    contents stored (so the offer was answered), its commit not yet sent (the sync thread of
    that host waits in the progress callback, which is where the fault is made). `killed`:
    SIGKILL to its agent; `cut_off`: its node's link goes down (the agent lives on, silent).
    Either way the controller hears nothing more from it: the sync of that host fails when
    the agent is declared lost (heartbeat timeout) or its answer is overdue (TIMEOUT)."""
    monkeypatch.setattr(config, "heartbeat_timeout", HB_TIMEOUT)
    kd = tmp_path / "key"
    kd.mkdir(mode=0o700)
    key = kd / "cluster.key"
    subprocess.run([sys.executable, "-m", "runtime.transport.auth", "keygen", str(key)],
                   check=True, capture_output=True)
    d = tmp_path / "mhbig"
    d.mkdir()
    (d / "first.py").write_text("X = 1\n")
    agents = Agents(cluster, key, tmp_path)
    victim_node = cluster.nodes[1]
    victim_root = ""
    try:
        addrs = [agents.start(n) for n in cluster.nodes[:2]]
        hosts = runtime.attach_to_workers(addrs, key_file=str(key))
        first = hosts.sync_workspace(Workspace(dirs=[str(d)]))  # every host has generation 1
        victim, other = (next(h for h in first.hosts if h.host == n) for n in
                         (victim_node, cluster.nodes[0]))
        victim_root = victim.root
        for i in range(300):  # two batches (256 files each at most)
            (d / f"f{i:03}.txt").write_text(f"file {i}\n" * 50)
        seen: dict = {}

        def progress(host: str, files: int, of: int, nbytes: int, of_bytes: int) -> None:
            if host != victim_node or files == 0 or seen:
                return
            root = Path(victim_root)  # mid-sync: contents stored aside, nothing committed
            seen["incoming"] = len(os.listdir(root / "incoming"))
            seen["current"] = os.readlink(root / "current")
            if fault == "killed":
                agents.procs[victim_node].kill()
                agents.procs[victim_node].wait(timeout=10)
            else:
                cluster.link(victim_node, False)

        out: dict = {}

        def sync() -> None:
            try:
                hosts.sync_workspace(Workspace(dirs=[str(d)]), progress=progress,
                                     timeout=TIMEOUT)
            except BaseException as e:  # noqa: BLE001 - looked at below
                out["error"] = e

        t = threading.Thread(target=sync, daemon=True)
        t.start()
        t.join(TIMEOUT + 20)  # the sync ends: the lost host fails within its timeout
        assert not t.is_alive(), "the sync did not end after losing a host"
        assert seen and seen["incoming"] >= 1 and seen["current"] == "gen-1", seen
        err = out.get("error")
        assert isinstance(err, WorkspaceSyncError), out
        failed = [h for h in err.result.hosts if h.error]
        assert [h.host for h in failed] == [victim_node]
        assert f"host {victim_node} ({victim.address}): " in str(err)
        ok = next(h for h in err.result.hosts if h.host == other.host)
        assert ok.error is None and ok.changed == 300 and ok.root == other.root
        assert (Path(other.root) / "current" / "mhbig" / "f299.txt").read_text() == \
            "file 299\n" * 50
        assert os.readlink(Path(victim_root) / "current") == "gen-1", "nothing committed"
        if fault == "cut_off":
            cluster.link(victim_node, True)
        hosts.shutdown()
    finally:
        cluster.link(victim_node, True)
        agents.stop()
        if fault == "killed" and victim_root:  # a killed agent leaves its run directory
            shutil.rmtree(Path(victim_root).parent, ignore_errors=True)
