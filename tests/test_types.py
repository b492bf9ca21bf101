"""The type checker passes on the parts whose invariants live in types: runtime's core, its
transport and the proc side (`[tool.mypy]` in pyproject.toml; mypy is pinned in the lock)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(300)


def test_mypy_is_clean_on_core_transport_and_proc():
    pytest.importorskip("mypy", reason="mypy is in the `test` extra (pip install -e .[test])")
    # the cache lives with the other test artifacts (ignored by git): a re-run is fast
    cache = ROOT / "test-artifacts" / "mypy-cache"
    out = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache),
                          "--show-error-codes"],
                         cwd=ROOT, capture_output=True, text=True, timeout=280,
                         env={**os.environ, "MYPY_FORCE_COLOR": "0"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success" in out.stdout, out.stdout
