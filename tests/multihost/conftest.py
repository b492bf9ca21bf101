"""Fixtures for the multi-host tests: one namespaced SLURM cluster per test session.

The cluster comes up once, the first time a test asks for it, and goes down at the end of
the session, also when tests fail. Without root, network namespaces or SLURM the tests skip
with the reason; set MONARCH_REQUIRE_MULTIHOST=1 (CI) to turn that skip into a failure.
"""
from __future__ import annotations

import os

import pytest

from .mhcluster import Cluster, unavailable


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("MONARCH_REQUIRE_MULTIHOST") == "1":
        pytest.fail(f"multihost tests required but cannot run: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def mh_cluster():
    """A running 3-node SLURM cluster of network namespaces (torn down after the session)."""
    reason = unavailable()
    if reason:
        _skip_or_fail(reason)
    cluster = Cluster(n=3)
    cluster.up()  # raises (test error) on failure, after tearing down what it started
    try:
        yield cluster
    finally:
        cluster.down(check=False)
        left = cluster.leftovers()
        assert not left, f"cluster teardown left: {left}"


@pytest.fixture
def cluster(mh_cluster):
    """The session cluster, with node links restored and partitions healed after each test."""
    yield mh_cluster
    if mh_cluster.dir.exists():
        for node in mh_cluster.nodes:
            mh_cluster.heal(node)
            mh_cluster.link(node, True)
