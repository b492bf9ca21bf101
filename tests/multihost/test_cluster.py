"""The namespaced SLURM cluster itself: routing, srun on every node, link cuts, partitions."""
from __future__ import annotations

import subprocess

import pytest

pytestmark = pytest.mark.timeout(90)


def test_route_goes_via_bridge(cluster):
    for node in cluster.nodes:
        out = subprocess.run(["ip", "route", "get", cluster.addr(node)], capture_output=True,
                             text=True, check=True).stdout
        assert f"dev {cluster.bridge} " in out and f"src {cluster.controller_addr}" in out


def test_srun_hostname_on_all_nodes(cluster):
    # srun runs in the slurmctld namespace so its own listening sockets stay off this one.
    r = cluster.run("srun", "-N3", "-l", "sh", "-c", "echo $(hostname) $(hostname -I)",
                    node=f"{cluster.prefix}ctl", timeout=30)
    seen = {tuple(line.split(": ", 1)[1].split()) for line in r.stdout.strip().splitlines()}
    assert seen == {(n, cluster.addr(n)) for n in cluster.nodes}


def _ping(cluster, src: str, dst_addr: str) -> bool:
    """Can `src` open a TCP connection to `dst_addr` (slurmd's port 6818, slurmctld's 6817)?"""
    port = 6817 if dst_addr.endswith(".250") else 6818
    r = cluster.run("timeout", "2", "bash", "-c", f"exec 3<>/dev/tcp/{dst_addr}/{port}",
                    node=src, check=False, timeout=10)
    return r.returncode == 0


def test_link_down_cuts_host_and_recovers(cluster):
    a, b = cluster.nodes[0], cluster.nodes[1]
    assert _ping(cluster, a, cluster.addr(b))
    cluster.link(b, False)
    assert not _ping(cluster, a, cluster.addr(b))
    cluster.link(b, True)
    assert _ping(cluster, a, cluster.addr(b))


def test_partition_between_two_nodes_keeps_others(cluster):
    a, b, c = cluster.nodes
    cluster.partition(a, b)
    try:
        assert not _ping(cluster, a, cluster.addr(b))
        assert not _ping(cluster, b, cluster.addr(a))
        assert _ping(cluster, a, cluster.addr(c))
        assert _ping(cluster, a, f"{cluster.net}.250")  # slurmctld stays reachable
    finally:
        cluster.heal(a)
    assert _ping(cluster, a, cluster.addr(b))
