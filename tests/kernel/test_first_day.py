"""A new user's first day (issue 53), through the installed `monarch` kernel driven by
jupyter_client: what they meet with `%mesh sync`, a dead rank, `%mesh logs` and
`%mesh status`, in the mesh's words."""

from __future__ import annotations

import shutil

import pytest

from test_kernel_client import Kernel

pytestmark = pytest.mark.timeout(200)


@pytest.fixture(scope="module")
def kernel():
    k = Kernel()
    rundirs: list = []
    try:
        yield k
        rundirs.append(k.value("import runtime; runtime.get_runtime().rundir"))
    finally:
        k.close()
        for d in rundirs:  # the kernel is killed, so its runtime cannot remove it
            shutil.rmtree(d, ignore_errors=True)


def _ok(r: dict) -> dict:
    assert r["error"] is None, "\n".join(r["error"]["traceback"])
    return r


def _error_text(r: dict) -> str:
    assert r["error"] is not None, r
    return "\n".join(r["error"]["traceback"])


def test_sync_without_reload_makes_the_code_importable_and_keeps_earlier_dirs(
        kernel, tmp_path):
    a, b = tmp_path / "dir_a", tmp_path / "dir_b"
    a.mkdir()
    b.mkdir()
    (a / "remmod.py").write_text("X = 42\n")
    (a / "remlater.py").write_text("L = 'later'\n")
    (b / "bmod.py").write_text("Z = 7\n")
    _ok(kernel.execute("%mesh alloc p --per-host procs=2 --no-progress"))
    kernel.track_processes()
    _ok(kernel.execute("%%mesh p\n1\n"))  # the procs are live before the sync
    r = _ok(kernel.execute(f"%mesh sync p --dir {a}"))
    assert "2 live procs import from it now" in r["stdout"], r["stdout"]
    r = _ok(kernel.execute("%%mesh p\nimport remmod\nremmod.X\n"))
    assert r["results"] == ["ValueMesh({'procs': 2}, {{procs=0}: 42, {procs=1}: 42})"]
    # a second directory synced later: the first stays on the hosts
    r = _ok(kernel.execute(f"%mesh sync p --dir {b}"))
    assert "0 deleted" in r["stdout"], r["stdout"]
    r = _ok(kernel.execute("%%mesh p --ranks procs=0\n"
                           "import bmod, remlater\n(bmod.Z, remlater.L)\n"))
    assert r["results"] == ["ValueMesh({}, {{}: (7, 'later')})"]
