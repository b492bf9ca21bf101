"""LocalJob with real host agents on loopback TCP (CurveZMQ), and `%mesh alloc`'s job half."""
from __future__ import annotations

import time

import pytest

from runtime.job import JobError, LocalJob
from monarch_kernel.args import parse_alloc

from .actors import Where
from .mhcluster import pid_alive

pytestmark = pytest.mark.timeout(90)


def test_local_job_meshes_calls_and_kill():
    with LocalJob(meshes={"a": 2, "b": 1}, progress=False) as job:
        state = job.state()
        assert set(state) == {"a", "b"} and state.a is state["a"]
        assert dict(state.a.sizes) == {"hosts": 2} and dict(state.b.sizes) == {"hosts": 1}
        assert job.key_file.stat().st_mode & 0o777 == 0o600
        assert job.workdir.stat().st_mode & 0o777 == 0o700
        procs = state.a.spawn_procs(per_host={"procs": 2})
        w = procs.spawn("w", Where)
        assert sorted(r["hosts"] * 2 + r["procs"] for _, (_, r) in w.where.call().get(timeout=30).items()) == [0, 1, 2, 3]
        pids = job.pids
        assert all(pid_alive(p) for p in pids)
        with pytest.raises(AttributeError, match="no mesh 'c'"):
            state.c
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in pids)
    with pytest.raises(JobError, match="killed"):
        job.apply()
    job.cleanup()
    assert not job.workdir.exists()


def test_local_job_agent_failure_is_reported(tmp_path):
    bad = tmp_path / "python"
    bad.write_text("#!/bin/sh\necho 'no runtime here' >&2; exit 3\n")
    bad.chmod(0o755)
    job = LocalJob(hosts=1, python=str(bad), progress=False, timeout=20)
    with pytest.raises(JobError, match="exited with 3(.|\n)*no runtime here"):
        job.state()
    job.cleanup()


def test_alloc_spec_runs_a_local_job():
    job, procs = parse_alloc("trainers --hosts 2 --per-host procs=2").run()
    try:
        assert dict(procs.sizes) == {"hosts": 2, "procs": 2}
        w = procs.spawn("w", Where)
        assert len(list(w.add.call(2, 3).get(timeout=30).items())) == 4
    finally:
        job.cleanup()


def test_a_tied_jobs_directory_is_named_for_this_process_under_the_runtime_root():
    import os

    from runtime import rundir

    job = LocalJob(hosts=1, progress=False)
    try:
        job.state()
        who = rundir.creator(job.workdir.name)
        assert who is not None and who[0] == "job" and who[1] == os.getpid()
        assert job.workdir.parent in rundir.roots()
    finally:
        job.cleanup()
    assert not job.workdir.exists()
