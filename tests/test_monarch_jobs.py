"""Monarch's `monarch.job` API through `runtime.job`: ProcessJob, state(cached_path=...),
reattaching from a second controller, can_run, kill, LocalJob(hosts=(names)), Monarch's
SlurmJob keywords, and `%mesh alloc --job process`."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runtime.job import (DEFAULT_JOB_PATH, JobError, JobState, JobTrait, LocalJob, ProcessJob,
                         SlurmJob, job_load, job_loads)
from _procs import pid_alive, wait_pids_gone

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parent.parent


def _reap(pids) -> None:
    """Kill agents a failed test may have left (by pid)."""
    for p in pids:
        if pid_alive(p):
            os.kill(p, signal.SIGKILL)


@pytest.fixture
def patient():
    """What a job's state and meshes are is tested, not how fast a silent host is found: a
    host agent starved for 5 s by the other worker's burst of procs (a loaded run) is not
    one lost."""
    from runtime.config import configured

    with configured(heartbeat_timeout=15.0):
        yield


def test_process_job_meshes_call_and_kill(patient):
    from tests._actors import Echo

    job = ProcessJob({"trainers": 2, "dataloaders": 1})
    assert isinstance(job, JobTrait) and not job.active
    try:
        state = job.state(cached_path=None)
        assert isinstance(state, JobState)
        assert dict(state.trainers.sizes) == {"hosts": 2}
        assert dict(state.dataloaders.sizes) == {"hosts": 1}
        with pytest.raises(AttributeError, match="no mesh 'gpus'"):
            state.gpus
        # as in Monarch, each state() call gives its own HostMesh objects for the same hosts
        again = job.state(cached_path=None)
        assert job.active and again.trainers is not state.trainers
        assert again.trainers.hosts == state.trainers.hosts and set(again) == set(state)
        procs = state.trainers.spawn_procs(per_host={"gpus": 2})
        echo = procs.spawn("echo", Echo)
        ranks = sorted(v["rank"] for v in echo.whoami.call().get(timeout=60).values())
        assert ranks == [0, 1, 2, 3]
        pids = list(job.agent_pids.values())
        assert len(pids) == 3 and all(pid_alive(p) for p in pids)
        assert job.can_run(ProcessJob({"trainers": 2, "dataloaders": 1}))
        assert not job.can_run(ProcessJob({"trainers": 3, "dataloaders": 1}))
        workdir = job.workdir
    finally:
        job.kill()
    wait_pids_gone(pids, 10, what="the job's agents end")
    assert not workdir.exists()
    assert not job.active


def test_batch_mode_and_uncacheable_jobs_are_refused(tmp_path):
    with pytest.raises(JobError, match="batch mode"):
        ProcessJob({"hosts": 1}).apply(client_script="train.py")
    with pytest.raises(JobError, match="cannot be cached"):
        LocalJob(1, progress=False).state(cached_path=str(tmp_path / "j.pkl"))
    assert ProcessJob.default_cached_path == DEFAULT_JOB_PATH == ".monarch/job_state.pkl"


CONTROLLER = textwrap.dedent("""
    import json, sys
    from runtime.job import ProcessJob
    from tests._actors import Echo
    job = ProcessJob({"hosts": int(sys.argv[2])})
    hosts = job.state(cached_path=sys.argv[1]).hosts
    echo = hosts.spawn_procs(per_host={"procs": 1}).spawn("echo", Echo)
    n = len(echo.ping.call(7).get(timeout=60))
    print(json.dumps({"pids": sorted(job.agent_pids.values()), "calls": n}), flush=True)
    if sys.argv[3] == "kill":
        job.kill()
""")


def _controller(path: Path, hosts: int, then: str) -> dict:
    r = subprocess.run([sys.executable, "-c", CONTROLLER, str(path), str(hosts), then],
                       cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_second_controller_reattaches_from_the_cached_path(tmp_path):
    path = tmp_path / "state" / "job.pkl"
    seen: list[int] = []
    try:
        first = _controller(path, 2, "leave")  # exits without kill: the agents stay up
        seen += first["pids"]
        assert first["calls"] == 2 and path.exists()
        assert path.stat().st_mode & 0o777 == 0o600
        assert all(pid_alive(p) for p in first["pids"])
        again = _controller(path, 2, "leave")  # a re-run reuses the running job
        assert again["pids"] == first["pids"] and again["calls"] == 2
        # a different spec cannot run on the cached job: it is killed and replaced
        other = _controller(path, 1, "kill")
        seen += other["pids"]
        assert other["pids"] != first["pids"] and other["calls"] == 1
        wait_pids_gone(first["pids"], 10, what="the replaced job's agents end")
        wait_pids_gone(other["pids"], 10, what="the other controller's agents end")
        # a killed job in the cache is not reused either
        job = job_load(path)
        assert isinstance(job, ProcessJob) and not job.can_run(ProcessJob({"hosts": 1}))
    finally:
        _reap(seen)


def test_saved_job_round_trip_and_private_file_check(tmp_path):
    job = ProcessJob({"hosts": 1})
    try:
        job.apply()  # explicit apply: agents outlive this process until kill()
        pids = list(job.agent_pids.values())
        again = job_loads(job.dumps())
        assert type(again) is ProcessJob and again.agent_pids == job.agent_pids
        assert again.can_run(ProcessJob({"hosts": 1}))
        reused = job_loads(job.dumps())  # the same pid, another process (pid reuse)
        reused.agent_starts = {p: 1 for p in reused.agent_starts}
        assert not reused.can_run(ProcessJob({"hosts": 1}))
        path = job.dump(tmp_path / "j.pkl")
        path.chmod(0o666)
        with pytest.raises(JobError, match="not be writable"):
            job_load(path)
        hosts = again.state(cached_path=None).hosts  # attach with the loaded copy
        assert dict(hosts.sizes) == {"hosts": 1}
        again.kill()  # not our child in that copy: killed by pid
        wait_pids_gone(pids, 10, what="the killed job's agents end")
    finally:
        job.kill()


def test_monarch_local_job_names_this_host():
    import runtime

    job = LocalJob(hosts=("trainers", "dataloaders"))
    state = job.state()
    assert state.trainers is runtime.this_host() and state.dataloaders is runtime.this_host()
    assert not job.can_run(LocalJob(("trainers",)))
    job.kill()  # leaves this host's agent alone
    assert job.state().trainers is runtime.this_host()
    with pytest.raises(ValueError, match="mesh names"):
        LocalJob(hosts=("1x",))
    assert LocalJob(2).meshes == {"hosts": 2}  # ours still takes a host count


def test_slurm_job_takes_monarch_keywords(tmp_path):
    job = SlurmJob(meshes={"trainers": 2}, gpus_per_node=8, cpus_per_task=4, mem="64G",
                   exclusive=True, python_exe="/opt/py/bin/python", monarch_port=22222,
                   slurm_args=["--constraint=h100", "ignored"], job_name="train",
                   time_limit="1:00:00", partition="gpu", account="a", qos="high",
                   job_start_timeout=600, log_dir=str(tmp_path))
    text = job.render_script(tmp_path / "j", tmp_path / "j" / "k")
    for line in ["--gpus-per-node=8", "--cpus-per-task=4", "--mem=64G", "--exclusive",
                 "--constraint=h100", "--partition=gpu", "--time=1:00:00", "--job-name=train",
                 "--account=a", "--qos=high"]:
        assert f"#SBATCH {line}\n" in text, line
    assert "ignored" not in text and "tcp://$ADDR:22222" in text and "/opt/py/bin/python" in text
    assert job.timeout == 600 and job.python == "/opt/py/bin/python"
    with pytest.raises(ValueError, match="ntasks_per_node"):
        SlurmJob({"a": 1}, ntasks_per_node=2, workdir=tmp_path)
    with pytest.raises(ValueError, match="gpus_per_node"):
        SlurmJob({"a": 1}, gpus_per_node=0, workdir=tmp_path)
    assert job.can_run(job) is False  # never submitted: not active


def test_mesh_alloc_accepts_a_process_job():
    from monarch_kernel.args import parse_alloc

    slurm = parse_alloc("t --job slurm --hosts 2 --gpus-per-node 8 --partition gpu")
    assert slurm.options == {"gpus_per_node": 8, "partition": "gpu"}
    assert slurm.make_job().gpus_per_node == 8
    with pytest.raises(Exception, match="--gpus-per-node does not apply to --job process"):
        parse_alloc("t --job process --hosts 1 --gpus-per-node 8")
    spec = parse_alloc("trainers --job process --hosts 2 --per-host gpus=2")
    assert spec.kind == "process" and isinstance(spec.make_job(), ProcessJob)
    job, procs = spec.run()
    try:
        assert dict(procs.sizes) == {"hosts": 2, "gpus": 2}
        pids = list(job.agent_pids.values())
    finally:
        job.kill()
    wait_pids_gone(pids, 10, what="the job's agents end")


def test_telemetry_and_admin_are_accepted():
    job = ProcessJob({"hosts": 1})
    assert job.enable_telemetry() is job and job.enable_admin(admin_addr=None) is job
    assert JobState().admin_url is None and JobState().telemetry_url is None


class _RecordingJob(JobTrait):
    """A Monarch-style job of one's own: only Monarch's hooks are defined."""

    def __init__(self, names=("default",), serves=True):
        super().__init__()
        self.names, self.serves, self.created, self.killed = list(names), serves, 0, 0

    def _create(self, client_script):
        self.created += 1

    def _state(self):
        return JobState({n: f"hosts of {n}" for n in self.names})

    def _kill(self):
        self.killed += 1

    def can_run(self, spec):
        return self.serves


def test_a_jobtrait_subclass_with_monarchs_hooks(tmp_path):
    job = _RecordingJob(["trainers"])
    assert isinstance(ProcessJob({"hosts": 1}), JobTrait) and not job.active
    job.apply()
    job.apply()
    assert job.created == 1 and job.active and job.state().trainers == "hosts of trainers"
    path = tmp_path / "job.pkl"
    job.dump(path)
    # a new spec reuses the saved running job when it can_run the spec ...
    fresh = _RecordingJob(["other"])
    assert set(fresh.state(cached_path=str(path))) == {"trainers"} and fresh.created == 0
    assert set(job_loads(job.dumps()).state()) == {"trainers"}
    # ... and else is applied itself and saved in its place
    _RecordingJob(["old"], serves=False).apply().dump(path)
    new = _RecordingJob(["workers"])
    assert set(new.state(cached_path=str(path))) == {"workers"} and new.created == 1
    assert set(job_load(path).state(cached_path=None)) == {"workers"}
    new.kill()
    assert new.killed == 1 and not new.active
