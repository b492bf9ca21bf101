"""SSHJob for real: sshd runs inside each namespaced node; the launcher starts a stand-in agent
over ssh, receives its address, and closing the session stops the agent."""
from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

from runtime.job import SSHJob

from .mhcluster import pid_alive

STANDIN = Path(__file__).parent / "fixtures" / "standin_agent.py"
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("runtime_ends_with_the_module")]


def test_ssh_job_starts_agents_on_nodes(cluster, sshd_nodes, tmp_path):
    opts, dests = sshd_nodes
    key = tmp_path / "cluster.key"
    key.write_bytes(b"x" * 64)
    key.chmod(0o600)
    job = SSHJob(dests, meshes={"a": 2, "b": 1}, python=str(STANDIN), ssh_options=opts,
                 key_file=key, progress=False, timeout=30)
    before = cluster.ns_pids()
    try:
        addrs = job.wait_addresses()
        names = []
        for addr in addrs.values():
            host, port = addr[len("tcp://"):].rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=5) as c:
                name, mode = c.recv(200).decode().split()
            assert mode == "0o600" and cluster.addr(name) == host
            names.append(name)
        assert sorted(names) == cluster.nodes
    finally:
        job.cleanup()  # kill, and remove the job's directory
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        new = [p for n, ps in cluster.ns_pids().items() for p in ps if p not in before[n]]
        if not new:
            break
        time.sleep(0.2)
    assert not new, f"left on nodes after kill: {new}"


@pytest.mark.timeout(90)
def test_ssh_job_real_agents_end_to_end(cluster, sshd_nodes):


    from .actors import Where
    from .agents import REPO

    opts, dests = sshd_nodes
    job = SSHJob(dests, python=sys.executable, chdir=str(REPO), ssh_options=opts,
                 progress=False, timeout=60)
    before = cluster.ns_pids()
    try:
        hosts = job.state().hosts
        assert sorted(hosts.hosts) == cluster.nodes
        w = hosts.spawn_procs(per_host={"procs": 1}).spawn("w", Where)
        assert sorted(v[0] for _, v in w.where.call().get(timeout=30).items()) == cluster.nodes
    finally:
        job.cleanup()  # kill, and remove the job's directory
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        new = [p for n, ps in cluster.ns_pids().items() for p in ps if p not in before[n]]
        if not new:
            break
        time.sleep(0.2)
    assert not new, f"left on nodes after kill: {new}"


def _key_file(tmp_path: Path) -> Path:
    import subprocess


    d = tmp_path / "key"
    d.mkdir(mode=0o700)
    subprocess.run([sys.executable, "-m", "runtime.transport.auth", "keygen", str(d / "k")],
                   check=True, capture_output=True)
    return d / "k"


@pytest.mark.timeout(150)
def test_ssh_job_through_its_gateway_over_ssh_only(cluster, sshd_nodes, tmp_path):
    """SSHJob(gateway=True) (issue 40) from a namespace that reaches the nodes' ssh port only: the
    agents start over ssh, and the job is driven through one `ssh -L` to its gateway."""
    from .actors import Where
    from .agents import REPO

    opts, dests = sshd_nodes
    cluster.fence_controller(*[(n, 22) for n in cluster.nodes])
    job = SSHJob(dests[:2], python=sys.executable, chdir=str(REPO), ssh_options=opts,
                 key_file=str(_key_file(tmp_path)), progress=False, timeout=60, gateway=True)
    try:
        hosts = job.state(cached_path=None).hosts
        assert job.tunnel is not None and job.tunnel.address.startswith("tcp://127.0.0.1:")
        assert sorted(hosts.hosts) == cluster.nodes[:2]
        where = hosts.spawn_procs(per_host={"procs": 1}).spawn("where", Where)
        got = where.where.call().get(timeout=60)
        assert sorted(v[0] for _, v in got.items()) == cluster.nodes[:2]
    finally:
        job.cleanup()  # kill, and remove the job's directory
        cluster.unfence_controller()
    assert job.tunnel.proc.poll() is not None  # kill() ended the tunnel
