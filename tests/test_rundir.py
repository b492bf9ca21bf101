"""The per-user runtime root (runtime/rundir.py): names, the sweep's rules, the checks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from runtime import rundir


def test_sweep_removes_only_entries_of_gone_processes(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_pid = p.pid
    start = rundir.process_start_time(dead_pid) or 1
    p.wait(10)
    me = rundir.tag()
    mine_pid, mine_start = (int(x) for x in me.split("-"))
    names = {
        f"run-{dead_pid}-{start}-abcd1234": "dir",  # creator gone: removed
        f"admin-{dead_pid}-{start}-4242.json": "file",  # likewise
        f".admin-{dead_pid}-{start}-xyz": "file",  # a half-written connection file
        f"rdma-{mine_pid}-{mine_start + 1}-reused": "dir",  # our pid, another start: reused pid
        f"run-{me}-live": "dir",  # a live process's: kept
        "notes.txt": "file",  # not the runtime's: kept
        "run-notanumber-x": "dir",  # not the runtime's name: kept
    }
    for name, kind in names.items():
        if kind == "dir":
            (tmp_path / name).mkdir()
            (tmp_path / name / "sock").write_text("")
        else:
            (tmp_path / name).write_text("{}")
    removed = rundir.sweep(tmp_path)
    assert sorted(removed) == sorted([f"run-{dead_pid}-{start}-abcd1234",
                                      f"admin-{dead_pid}-{start}-4242.json",
                                      f".admin-{dead_pid}-{start}-xyz",
                                      f"rdma-{mine_pid}-{mine_start + 1}-reused"])
    assert sorted(os.listdir(tmp_path)) == sorted(["notes.txt", f"run-{me}-live",
                                                  "run-notanumber-x"])


@pytest.mark.skipif(os.getuid() != 0, reason="making another user's file needs root")
def test_sweep_never_touches_another_users_entry(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(10)
    theirs = tmp_path / f"run-{p.pid}-1-theirs"
    theirs.mkdir()
    os.chown(theirs, 12345, 12345)
    assert rundir.sweep(tmp_path) == []
    assert theirs.exists()


def test_root_is_private_and_checked(tmp_path, monkeypatch):
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "r"
    link.symlink_to(target)
    monkeypatch.setenv("MONARCH_RUNTIME_DIR", str(link))
    with pytest.raises(rundir.RuntimeRootError, match="not a directory"):
        rundir.root()
    monkeypatch.setenv("MONARCH_RUNTIME_DIR", str(tmp_path / "ok"))
    d = rundir.root()
    assert (os.stat(d).st_mode & 0o777) == 0o700


def test_socket_directories_leave_a_long_root_for_a_short_one(tmp_path, monkeypatch):
    long_root = tmp_path / ("x" * 60)
    monkeypatch.setenv("MONARCH_RUNTIME_DIR", str(long_root))
    assert rundir.root() == long_root
    short = rundir.socket_root(create=False)
    existed = short.exists()
    d = rundir.make_dir("run")
    try:
        assert len(d) + 1 + 33 <= 107
        assert os.path.dirname(d) == str(short) != str(long_root)
        assert os.path.basename(d).startswith(f"run-{rundir.tag()}-")
        assert rundir.roots() == [long_root, short]
    finally:
        os.rmdir(d)
        if not existed:
            try:
                short.rmdir()
            except OSError:
                pass
