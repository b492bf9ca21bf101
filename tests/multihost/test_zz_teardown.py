"""Runs last in this directory: tearing the session cluster down leaves nothing behind."""
from __future__ import annotations

import subprocess
import time

import pytest


@pytest.mark.timeout(90)
def test_teardown_leaves_nothing(mh_cluster):
    # A stray process on a node that the cluster object does not know: down.sh must find it
    # through the namespace, by pid.
    extra = subprocess.Popen(mh_cluster.in_node(mh_cluster.nodes[0], ["sleep", "300"]),
                             start_new_session=True)
    for _ in range(50):
        if extra.pid in mh_cluster.ns_pids()[mh_cluster.nodes[0]]:
            break
        time.sleep(0.05)
    assert extra.pid in mh_cluster.ns_pids()[mh_cluster.nodes[0]]
    daemons = list(mh_cluster.pids)
    assert len(daemons) == 2 + mh_cluster.n  # munged, slurmctld, one slurmd per node
    left = mh_cluster.down(check=False)
    assert left == [], left
    assert extra.wait(timeout=5) == -9 or extra.returncode == -15
