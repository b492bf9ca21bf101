"""Proc log files written by the host agents (runtime/host/logfiles.py): names, modes and
rotation without processes; then through the public API: a job's procs write from Python
and C, are killed, the controller dies, and a new one reads every line after `Job.load()`;
`this_host()` writes files only when `file_capture` is on; rotation at the cap."""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from runtime.host import logfiles
from _procs import pid_alive

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parent.parent


def _reap(pids) -> None:
    for p in pids:
        if pid_alive(p):
            os.kill(p, signal.SIGKILL)


@pytest.fixture
def scratch():
    d = Path(tempfile.mkdtemp(prefix="wt-logs-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


# -- files, without processes -------------------------------------------------------------------
def test_names_round_trip_and_unsafe_characters_are_replaced():
    name = logfiles.file_name("my mesh/1", 3, 4242, 0.0)
    assert "/" not in name and " " not in name and name.endswith(".log")
    info = logfiles.parse_name(name)
    assert info["mesh"] == "my_mesh_1" and info["rank"] == 3 and info["pid"] == 4242
    assert logfiles.parse_name(name + ".2")["gen"] == 2
    assert logfiles.parse_name("notes.txt") is None


def test_modes_and_rotation_at_the_cap(scratch):
    d = logfiles.private_dir(scratch / "logs" / "agent")
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    path = d / logfiles.file_name("m", 0, 1, time.time())
    f = logfiles.LogFile(path, max_bytes=100, backups=2)
    for i in range(30):  # 30 lines of 10 bytes: 3 files' worth
        f.write(f"line {i:04d}\n".encode())
    f.close()
    names = sorted(p.name for p in d.iterdir())
    assert names == [path.name, path.name + ".1", path.name + ".2"]
    for p in d.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600 and p.stat().st_size <= 100
    (got,) = logfiles.read(d, "m")
    assert got["lines"] == [f"line {i:04d}" for i in range(0, 30)]  # oldest file first
    (last,) = logfiles.read(d, "m", tail=3, grep=r"line 00[12]")
    assert last["lines"] == ["line 0027", "line 0028", "line 0029"]
    (sel,) = logfiles.read(d, "m", tail=2, grep=r"line 001")
    assert sel["lines"] == ["line 0018", "line 0019"]
    f2 = logfiles.LogFile(path, max_bytes=100, backups=2)  # one more rotation drops the oldest
    f2.write(b"x" * 95 + b"\n")
    f2.close()
    (after,) = logfiles.read(d, "m")
    assert after["lines"][0] == "line 0010" and after["lines"][-1] == "x" * 95


def test_the_dir_of_another_user_or_a_link_is_refused(scratch):
    target = scratch / "real"
    target.mkdir()
    (scratch / "link").symlink_to(target)
    with pytest.raises(PermissionError):
        logfiles.private_dir(scratch / "link")


def test_read_picks_mesh_and_rank_and_caps_the_reply(scratch, monkeypatch):
    for mesh, rank in (("a", 0), ("a", 1), ("ab", 0)):
        f = logfiles.LogFile(scratch / logfiles.file_name(mesh, rank, 10 + rank, 0.0), 1 << 20, 1)
        f.write(b"".join(f"{mesh}{rank} {i}\n".encode() for i in range(100)))
        f.close()
    assert [(p["mesh"], p["rank"]) for p in logfiles.read(scratch, "a")] == [("a", 0), ("a", 1)]
    (one,) = logfiles.read(scratch, "a", rank=1, tail=2)
    assert one["lines"] == ["a1 98", "a1 99"] and not one["truncated"]
    monkeypatch.setattr(logfiles, "MAX_REPLY_BYTES", 50)
    (capped,) = logfiles.read(scratch, "ab")
    assert capped["truncated"] and capped["lines"][-1] == "ab0 99" and len(capped["lines"]) < 10


# -- through the agents ---------------------------------------------------------------------------
FIRST_KERNEL = textwrap.dedent("""
    import json, os, sys, time
    import runtime
    from runtime.job import ProcessJob
    from tests._log_actors import Writer
    job = ProcessJob({"hosts": 1})
    hosts = job.state(cached_path=sys.argv[1]).hosts
    pm = hosts.spawn_procs(per_host={"procs": 2}, name="trainers")
    pids = list(pm.spawn("writer", Writer).write.call(3).get(timeout=60).values())
    rt = runtime.get_runtime()
    killed = pm.procs[1].proc_id
    rt.kill_proc(killed)
    deadline = time.monotonic() + 30
    while rt.proc_state(killed) != "failed" and time.monotonic() < deadline:
        time.sleep(0.02)
    print(json.dumps({"agents": sorted(job.agent_pids.values()), "procs": pids}), flush=True)
    os._exit(0)  # the kernel dies: no shutdown, no kill()
""")


def _expected(rank: int) -> list[str]:
    return [f"py rank {rank} line {i}" for i in range(3)] + [
        f"c stdout rank {rank}", f"c stderr rank {rank}", f"unfinished rank {rank}"]


def _wait_logs(job, mesh: str, want: int, seconds: float = 20.0):
    """job.logs(mesh) once every proc's log ends with its unfinished last line."""
    deadline = time.monotonic() + seconds
    while True:
        got = job.logs(mesh)
        if sum(1 for p in got if p.lines and p.lines[-1].startswith("unfinished")) >= want \
                or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def test_job_logs_after_the_kernel_restarts(tmp_path):
    from runtime.job import Job

    path = tmp_path / "job.pkl"
    r = subprocess.run([sys.executable, "-c", FIRST_KERNEL, str(path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr[-3000:]
    first = json.loads(r.stdout.strip().splitlines()[-1])
    assert "proc output files: " in r.stderr  # the path, printed once
    assert r.stderr.count("proc output files: ") == 1
    job = None
    try:
        job = Job.load(path)  # a new kernel: the agents are still up, the procs are gone
        got = _wait_logs(job, "trainers", 2)
        assert [(p.rank, p.pid) for p in got] == [(0, first["procs"][0]), (1, first["procs"][1])]
        for p in got:  # Python, C, stderr and the last line without a newline: every line
            assert sorted(p.lines) == sorted(_expected(p.rank)), p.lines
            f = Path(p.path)
            assert stat.S_IMODE(f.stat().st_mode) == 0o600
            assert stat.S_IMODE(f.parent.stat().st_mode) == 0o700
            assert f.name.startswith(f"trainers.{p.rank}.{p.pid}.")
        assert job.logs("trainers", rank=1, tail=1).lines == ["unfinished rank 1"]
        assert job.logs("trainers", grep=r"^c std").lines == [
            "c stdout rank 0", "c stderr rank 0", "c stdout rank 1", "c stderr rank 1"]
        with pytest.raises(ValueError, match="read_logs"):
            job.logs("trainers", grep="(")
        assert len(job.logs("nobody")) == 0
    finally:
        if job is not None:
            job.kill()
        _reap(first["agents"])


THIS_HOST = textwrap.dedent("""
    import json, sys
    import runtime
    from tests._log_actors import Writer
    host = runtime.this_host()
    off = host.spawn_procs(per_host={"procs": 1}, name="quiet")
    off.spawn("w", Writer).write.call(1).get(timeout=60)
    runtime.configure(file_capture=True)  # from the next spawn on
    on = host.spawn_procs(per_host={"procs": 1}, name="loud")
    on.spawn("w", Writer).write.call(3).get(timeout=60)
    on.stop().get(timeout=30)
    out = {"quiet": [p.lines for p in runtime.read_logs(off)],
           "loud": [p.lines for p in runtime.read_logs(on)],
           "paths": [p.path for p in runtime.read_logs(on)]}
    print("RESULT", json.dumps(out), flush=True)
    runtime.shutdown()  # the quiet proc's unfinished line is printed as it ends, after RESULT
""")


def test_this_host_writes_files_only_with_file_capture(scratch):
    env = {**os.environ, "MONARCH_LOG_DIR": str(scratch / "logs")}
    env.pop("MONARCH_FILE_CAPTURE", None)
    r = subprocess.run([sys.executable, "-c", THIS_HOST], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr[-3000:]
    (result,) = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    out = json.loads(result[len("RESULT "):])
    assert out["quiet"] == []
    (lines,) = out["loud"]
    assert sorted(lines) == sorted(_expected(0))
    assert out["paths"][0].startswith(str(scratch / "logs") + "/agent-")


def test_rotation_through_the_agent_keeps_the_newest_lines():
    from runtime.job import LocalJob
    from tests._log_actors import Writer

    job = LocalJob(1, progress=False, env={"MONARCH_LOG_FILE_MAX_BYTES": "2000",
                                           "MONARCH_LOG_FILE_BACKUPS": "1"})
    try:
        pm = job.state(cached_path=None).hosts.spawn_procs(per_host={"procs": 1}, name="big")
        pm.spawn("w", Writer).fill.call(200, 20).get(timeout=60)  # 200 x 28 bytes
        deadline = time.monotonic() + 20
        while True:
            (got,) = job.logs("big")
            if (got.lines and got.lines[-1].startswith("000199")) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert got.lines[-1].startswith("000199")
        files = sorted(Path(got.path).parent.iterdir())
        assert [f.name[len(Path(got.path).name):] for f in files] == ["", ".1"]
        assert all(f.stat().st_size <= 2000 for f in files)
        nums = [int(ln.split()[0]) for ln in got.lines]
        assert nums == list(range(nums[0], 200)) and 0 < nums[0]  # contiguous, oldest dropped
    finally:
        job.cleanup()
