"""Helpers for kernel tests: the Monarch kernelspec installed into a temporary prefix
(never the user's ~/.local), found through JUPYTER_PATH, and process bookkeeping."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Iterable

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PREFIX: str | None = None


def install_kernelspec() -> str:
    """Install the `monarch` kernelspec once per session into a temp prefix; put it first
    on JUPYTER_PATH. The kernel imports this checkout (PYTHONPATH in the spec's env)."""
    global _PREFIX
    if _PREFIX is None:
        prefix = tempfile.mkdtemp(prefix="monarch-kernelspec-")
        atexit.register(shutil.rmtree, prefix, True)  # nothing of the tests stays in /tmp
        pypath = os.pathsep.join(p for p in [ROOT, os.environ.get("PYTHONPATH", "")] if p)
        subprocess.run([sys.executable, "-m", "monarch_kernel", "install", "--prefix", prefix,
                        "--env", f"PYTHONPATH={pypath}"],
                       check=True, capture_output=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": pypath}, timeout=60)
        _PREFIX = prefix
    data = os.path.join(_PREFIX, "share", "jupyter")
    paths = os.environ.get("JUPYTER_PATH", "").split(os.pathsep)
    if data not in paths:
        os.environ["JUPYTER_PATH"] = os.pathsep.join([data] + [p for p in paths if p])
    return data


def snapshot(pids: Iterable[int]) -> dict[int, float]:
    """pid -> create_time for the pids alive now (to tell them from reused pids later)."""
    out = {}
    for pid in pids:
        try:
            out[pid] = psutil.Process(pid).create_time()
        except psutil.Error:
            pass
    return out


def alive(snap: dict[int, float]) -> list[int]:
    """The pids of `snap` that still run (same process, not a zombie)."""
    left = []
    for pid, created in snap.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.Error:
            pass
    return left


def wait_gone(snap: dict[int, float], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = alive(snap)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = alive(snap)
    return left


def kill_all(snap: dict[int, float]) -> None:
    """Kill, by pid, whatever of `snap` is still running (test clean-up)."""
    for pid in alive(snap):
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


def ipython_shell():
    """The process's IPython test shell (IPython makes one per process: a second
    `start_ipython()` returns None, so a test module after another gets the same shell).
    Its history file, a NamedTemporaryFile(delete=False) in /tmp, is removed at its exit."""
    from pathlib import Path

    from IPython.testing.globalipapp import get_ipython, start_ipython

    shell = start_ipython()
    if shell is None:
        return get_ipython()
    shell.tempfiles.append(Path(shell.history_manager.hist_file))
    return shell


@contextlib.contextmanager
def ipython_with_extension():
    """The IPython test shell with `%load_ext monarch_kernel` for a test module; afterwards
    every mesh is stopped, the extension unloaded and the runtime shut down."""
    import runtime

    shell = ipython_shell()
    shell.run_line_magic("load_ext", "monarch_kernel")
    try:
        yield shell
    finally:
        try:
            shell.run_line_magic("mesh", "stop --all")
        finally:
            shell.run_line_magic("unload_ext", "monarch_kernel")
            runtime.shutdown()
