"""Fixtures for the multi-host tests: one namespaced SLURM cluster for this package.

The cluster comes up once, the first time a test asks for it, and goes down after the
package's last test, also when tests fail (its tear-down is checked). Without root, network
namespaces or SLURM the tests skip with the reason; set MONARCH_REQUIRE_MULTIHOST=1 (CI) to
turn that skip into a failure.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .agents import Agents
from .mhcluster import Cluster, pid_alive, unavailable


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("MONARCH_REQUIRE_MULTIHOST") == "1":
        pytest.fail(f"multihost tests required but cannot run: {reason}")
    pytest.skip(reason)


_summary: list[str] = []


def pytest_terminal_summary(terminalreporter):
    """Show in CI's log that the namespaced cluster really ran (or why it did not)."""
    if _summary:
        terminalreporter.section("multihost cluster")
        for line in _summary:
            terminalreporter.write_line(line)


def pytest_sessionfinish(session):
    out = getattr(session.config, "workeroutput", None)
    if out is not None and _summary:  # a worker of a parallel run: tests/conftest.py prints it
        out.setdefault("monarch_sections", {})["multihost cluster"] = list(_summary)


@pytest.fixture(scope="package")
def mh_cluster():
    """A running 3-node SLURM cluster of network namespaces, for the tests of this package
    (tests/test_debugging_multihost.py, after them, starts one of its own). Torn down after
    their last test, also when tests fail, and the tear-down checked: nothing is left, not
    even a process in a node that the cluster object does not know."""
    reason = unavailable()
    if reason:
        _summary.append(f"not run: {reason}")
        _skip_or_fail(reason)
    cluster = Cluster(n=3)
    cluster.up()  # raises (test error) on failure, after tearing down what it started
    _summary.append(f"up in {cluster.up_seconds:.1f} s: SLURM nodes {', '.join(cluster.nodes)} "
                    f"as network namespaces on {cluster.bridge} ({cluster.net}.0/24)")
    try:
        yield cluster
    finally:
        _down_leaves_nothing(cluster)


def _down_leaves_nothing(cluster: Cluster) -> None:
    """Tear the cluster down; assert that it left nothing, and that down.sh found by pid,
    through its namespace, a stray process on a node that the cluster object does not know."""
    import time

    extra = None
    try:
        if any(pid_alive(p) for p in cluster.pids):  # it is up (a test may have ended it)
            node = cluster.nodes[0]
            extra = subprocess.Popen(cluster.in_node(node, ["sleep", "300"]),
                                     start_new_session=True)
            for _ in range(50):
                if extra.pid in cluster.ns_pids()[node]:
                    break
                time.sleep(0.05)
            assert extra.pid in cluster.ns_pids()[node]
            # munged, slurmctld, one slurmd per node
            assert len(cluster.pids) == 2 + cluster.n, cluster.pids
    finally:
        cluster.down(check=False)
        left = cluster.leftovers()
        _summary.append(f"torn down; left behind: {left or 'nothing'}")
        if extra is not None and extra.poll() is None:
            extra.kill()
            extra.wait(5)
            left.append(f"stray pid {extra.pid} in {cluster.nodes[0]} (not found by down.sh)")
    assert not left, f"cluster teardown left: {left}"
    assert extra is None or extra.wait(timeout=5) in (-9, -15), extra.returncode


@pytest.fixture
def cluster(mh_cluster):
    """The session cluster, with node links restored and partitions healed after each test."""
    yield mh_cluster
    mh_cluster.unfence_controller()
    if mh_cluster.dir.exists():
        for node in mh_cluster.nodes:
            mh_cluster.heal(node)
            mh_cluster.link(node, True)


@pytest.fixture(scope="package")
def sshd_nodes(mh_cluster, tmp_path_factory):
    """An sshd inside every node namespace (port 22 on the node's address, key login only).

    Yields (ssh options, user@address per node). Skips when openssh-server is missing."""
    import shutil
    import subprocess
    import time

    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not Path(sshd).exists() or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("openssh-server / openssh-client not installed (apt-get install openssh-server)")
    d = tmp_path_factory.mktemp("sshd")
    d.chmod(0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host")], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "user")], check=True)
    (d / "authorized_keys").write_bytes((d / "user.pub").read_bytes())
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    procs = []
    for node in mh_cluster.nodes:
        conf = d / f"sshd_{node}.conf"
        conf.write_text(
            f"ListenAddress {mh_cluster.addr(node)}:22\nHostKey {d}/host\n"
            f"AuthorizedKeysFile {d}/authorized_keys\nPidFile {d}/sshd_{node}.pid\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nX11Forwarding no\n"
            "AllowTcpForwarding local\nLogLevel ERROR\n")
        procs.append(mh_cluster.popen(node, [sshd, "-D", "-e", "-f", str(conf)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    opts = ("-i", str(d / "user"), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={d}/known_hosts", "-o", "StrictHostKeyChecking=no",
            "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5", "-T")
    dests = [f"root@{mh_cluster.addr(n)}" for n in mh_cluster.nodes]
    deadline = time.monotonic() + 15
    for dest in dests:
        while subprocess.run(["ssh", *opts, dest, "true"], capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd on {dest} did not come up")
            time.sleep(0.2)
    try:
        yield opts, dests
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


@pytest.fixture
def key_file(tmp_path):
    """A fresh cluster key (0600 in a 0700 directory) for one test."""
    d = tmp_path / "key"
    d.mkdir(mode=0o700)
    k = d / "cluster.key"
    subprocess.run([sys.executable, "-m", "runtime.transport.auth", "keygen", str(k)],
                   check=True, capture_output=True)
    return k


@pytest.fixture
def agents(cluster, key_file, tmp_path):
    """Host agents started in the node namespaces on demand (`agents.start(node)`), stopped
    after the test."""
    a = Agents(cluster, key_file, tmp_path)
    yield a
    a.stop()
