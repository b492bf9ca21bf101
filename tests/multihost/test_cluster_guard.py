"""When the machine cannot host the namespaced cluster, the tests say why (no cluster needed)."""
from __future__ import annotations

import pytest

from . import conftest, mhcluster


def test_reason_without_root(monkeypatch):
    monkeypatch.setattr(mhcluster.os, "geteuid", lambda: 1000)
    assert "root" in mhcluster.unavailable()


def test_reason_without_slurm(monkeypatch):
    if mhcluster.os.geteuid() != 0:
        pytest.skip("the root check comes first")
    real = mhcluster.shutil.which
    monkeypatch.setattr(mhcluster.shutil, "which", lambda c: None if c == "slurmd" else real(c))
    assert "slurmd" in mhcluster.unavailable()


def test_required_turns_skip_into_failure(monkeypatch):
    monkeypatch.setenv("MONARCH_REQUIRE_MULTIHOST", "1")
    with pytest.raises(pytest.fail.Exception, match="required"):
        conftest._skip_or_fail("no namespaces")
    monkeypatch.delenv("MONARCH_REQUIRE_MULTIHOST")
    with pytest.raises(pytest.skip.Exception, match="no namespaces"):
        conftest._skip_or_fail("no namespaces")
