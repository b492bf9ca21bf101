"""SlurmJob's launcher on the namespaced cluster, with a stand-in agent (no runtime needed):
one batch job, one srun per node, addresses published from each node, scancel stops all."""
from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from runtime.job import JobError, SlurmJob

from .mhcluster import pid_alive

STANDIN = Path(__file__).parent / "fixtures" / "standin_agent.py"
pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def slurm_env(cluster, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(cluster.dir / "slurm.conf"))
    return cluster


def _key(tmp_path: Path) -> Path:
    k = tmp_path / "cluster.key"
    k.write_bytes(b"not a real key: the stand-in only checks the file mode")
    k.chmod(0o600)
    return k


def test_slurm_job_starts_one_agent_per_node(slurm_env, tmp_path):
    cluster = slurm_env
    job = SlurmJob({"trainers": 2, "gen": 1}, python=str(STANDIN), key_file=_key(tmp_path),
                   workdir=tmp_path / "jobs", progress=False, timeout=60)
    try:
        addrs = job.wait_addresses()
        assert job.slurm_state() == "RUNNING"
        hosts = {}
        for slot, addr in addrs.items():
            host, port = addr[len("tcp://"):].rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=5) as c:
                name, mode = c.recv(200).decode().split()
            assert mode == "0o600" and cluster.addr(name) == host
            hosts[slot] = name
        assert sorted(hosts.values()) == cluster.nodes  # every node, each once
        agents = {n: [p for p in ps] for n, ps in cluster.ns_pids().items()}
        assert all(agents[n] for n in cluster.nodes)
    finally:
        job.kill()
    assert job.slurm_state() not in ("RUNNING", "PENDING")
    deadline = time.monotonic() + 15
    stray = []
    while time.monotonic() < deadline:  # only slurmd itself may stay in a node's namespace
        daemons = set(cluster.pids)
        stray = [p for n in cluster.nodes for p in cluster.ns_pids()[n] if p not in daemons]
        if not stray:
            break
        time.sleep(0.2)
    assert not stray, f"processes left on nodes after kill: {stray}"


def test_slurm_job_reports_agents_that_fail(slurm_env, tmp_path):
    job = SlurmJob({"m": 1}, python="/nonexistent/python", key_file=_key(tmp_path),
                   workdir=tmp_path / "jobs", progress=False, timeout=30)
    with pytest.raises(JobError, match="ended|did not start") as e:  # within timeout=30
        try:
            job.wait_addresses()
        finally:
            job.kill()
    assert "nonexistent" in str(e.value)  # the agent's own error is in the report


def test_slurm_job_needs_enough_nodes(slurm_env, tmp_path):
    job = SlurmJob({"m": 4}, python=str(STANDIN), key_file=_key(tmp_path),
                   workdir=tmp_path / "jobs", progress=False, timeout=2)
    with pytest.raises(JobError, match="PENDING \\(.+\\)|sbatch failed"):
        try:
            job.wait_addresses()
        finally:
            job.kill()


def test_a_queued_job_is_waited_for_beyond_its_start_timeout(slurm_env, tmp_path):
    """A held job (PENDING, JobHeldUser) outwaits timeout=2 and starts once released: the
    start deadline runs from when the allocation runs (issue 40, Monarch's #2159)."""
    import threading

    cluster = slurm_env
    job = SlurmJob({"m": 1}, python=str(STANDIN), key_file=_key(tmp_path), sbatch_args=["--hold"],
                   workdir=tmp_path / "jobs", progress=False, timeout=2)
    out: dict = {}

    def wait() -> None:
        try:
            out["addrs"] = job.wait_addresses()
        except BaseException as e:  # reported below
            out["error"] = e

    t = threading.Thread(target=wait, daemon=True)
    try:
        t.start()
        deadline = time.monotonic() + 20
        while "queued" not in (status := job._check() if job.job_id else ""):
            assert time.monotonic() < deadline, "the job was never reported queued"
            time.sleep(0.1)
        assert "PENDING (JobHeldUser)" in status
        time.sleep(3)  # longer than timeout=2, spent in the queue
        assert t.is_alive() and not out, out
        cluster.run("scontrol", "release", job.job_id)
        t.join(60)
        assert not t.is_alive() and "addrs" in out, out
    finally:
        job.kill()
        t.join(10)


def _node_state(cluster, node: str) -> str:
    return cluster.run("sinfo", "-h", "-n", node, "-o", "%T").stdout.strip()


def test_lost_node_shrinks_job_instead_of_killing_it(slurm_env, tmp_path, record_detection):
    """--no-kill + one srun per host: SLURM drops the lost node, the other agents run on."""
    cluster = slurm_env
    lost = cluster.nodes[2]
    job = SlurmJob({"m": 3}, python=str(STANDIN), key_file=_key(tmp_path),
                   workdir=tmp_path / "jobs", progress=False, timeout=60)
    try:
        addrs = job.wait_addresses()
        cluster.link(lost, False)
        t0 = time.monotonic()
        deadline = t0 + 40
        while "down" not in _node_state(cluster, lost):  # SlurmdTimeout=5 in the test cluster
            assert time.monotonic() < deadline, "SLURM never noticed the lost node"
            time.sleep(0.5)
        record_detection(f"multihost: SLURM marks a lost node ({lost}) down, SlurmdTimeout=5",
                         time.monotonic() - t0)

        def left() -> list[str]:
            nodelist = cluster.run("squeue", "-h", "-j", job.job_id, "-o", "%N").stdout.strip()
            return cluster.run("scontrol", "show", "hostnames", nodelist).stdout.split()

        deadline = time.monotonic() + 30
        while left() != cluster.nodes[:2]:  # the job shrinks to the surviving nodes
            assert time.monotonic() < deadline, left()
            time.sleep(0.2)
        assert job.slurm_state() == "RUNNING"  # and runs on
        for (_, i), addr in addrs.items():
            if i == 2:
                continue
            host, port = addr[len("tcp://"):].rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=5) as c:
                assert c.recv(200).decode().split()[0] == cluster.nodes[i]
    finally:
        cluster.link(lost, True)
        job.kill()
        cluster.run("scontrol", "update", f"nodename={lost}", "state=resume", check=False)
        deadline = time.monotonic() + 30
        while _node_state(cluster, lost) != "idle" and time.monotonic() < deadline:
            time.sleep(0.5)
    assert _node_state(cluster, lost) == "idle"


def test_dump_and_load_reattaches_to_running_job(slurm_env, tmp_path):
    """A new process (e.g. a restarted kernel) loads the job and finds the same agents."""
    import subprocess
    import sys

    job = SlurmJob({"m": 2}, python=str(STANDIN), key_file=_key(tmp_path),
                   workdir=tmp_path / "jobs", progress=False, timeout=60)
    try:
        addrs = job.wait_addresses()
        path = job.dump(tmp_path / "job.pkl")
        assert path.stat().st_mode & 0o777 == 0o600
        code = ("import sys; from runtime.job import Job; j = Job.load(sys.argv[1]); "
                "print(j.job_id, j.slurm_state(), sorted(j.wait_addresses().values()))")
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                             text=True, timeout=30, check=True).stdout.split(" ", 2)
        assert out[0] == job.job_id and out[1] == "RUNNING"
        assert out[2].strip() == str(sorted(addrs.values()))
    finally:
        job.kill()
    with pytest.raises(JobError, match="running"):
        job.dump(tmp_path / "again.pkl")
