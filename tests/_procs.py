"""Helpers the tests share about processes and the runtime's own threads."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path


def _state(stat: str) -> str:
    """The state letter of a /proc .../stat file ("" when it is gone)."""
    try:
        return Path(stat).read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    """True when `pid` exists and is not a zombie."""
    return _state(f"/proc/{pid}/stat") not in ("", "Z")


def fault_hooks_done(timeout: float = 20.0) -> bool:
    """Wait until no `unhandled_fault_hook` call is running. The runtime runs the hook on a
    thread of its own, started when the failure report is read; what a proc sent is read
    before its end is known, so after a wait on a proc's end (a stop, a failed call) every
    report it sent has reached the hook once this returns True."""
    deadline = time.monotonic() + timeout
    while any(t.name == "monarch-fault-hook" for t in threading.enumerate()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def spawn_procs_fixture(per_host: dict, name: str | None = None, *, scope: str = "module",
                        stop_timeout: float = 30.0, ready_timeout: float | None = None):
    """A pytest fixture (assign it to the fixture's name in the test module) that spawns
    `this_host().spawn_procs(per_host=per_host, name=name)`, yields the proc mesh, and
    stops it (waiting `stop_timeout` seconds) after the last test of its `scope`, also when
    the set-up failed. With `ready_timeout`, the set-up waits that long for every proc to
    have started."""
    import pytest

    from runtime import this_host

    @pytest.fixture(scope=scope)
    def procs_fixture():
        pm = this_host().spawn_procs(per_host=per_host, name=name)
        try:
            if ready_timeout is not None:
                pm.initialized.get(timeout=ready_timeout)
            yield pm
        finally:
            pm.stop().get(timeout=stop_timeout)

    return procs_fixture


def wait_pids_gone(pids, timeout: float = 10.0, what: str = "processes end",
                   every: float = 0.05) -> None:
    """Wait until none of `pids` runs (`pid_alive`); AssertionError naming `what` and the
    pids still running once `timeout` seconds pass."""
    from _util import wait_until

    wait_until(lambda: not any(pid_alive(p) for p in pids), timeout,
               what=lambda: f"{what}: still running {[p for p in pids if pid_alive(p)]}",
               every=every)


def stop_all_threads(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP `pid` and wait until every one of its threads is stopped. The signal alone
    does not stop a multi-threaded process at once: one thread is woken to take it, and
    until it has run the others go on (an agent's I/O thread relayed a message 6 ms after
    the kill returned, on a loaded machine)."""
    from _util import wait_until

    os.kill(pid, signal.SIGSTOP)

    def states() -> list[str]:  # ("": a thread that ended meanwhile)
        return [_state(f"/proc/{pid}/task/{tid}/stat") for tid in os.listdir(f"/proc/{pid}/task")]

    wait_until(lambda: all(s in ("", "t", "T") for s in states()), timeout,
               what=lambda: f"every thread of {pid} stopped: states {states()}", every=0.005)


def end_popen(p: "subprocess.Popen", timeout: float = 10.0) -> None:
    """Kill `p` if it still runs, reap it, close our ends of its pipes (a test's finally)."""
    if p.poll() is None:
        p.kill()
        p.wait(timeout)
    for f in (p.stdin, p.stdout, p.stderr):
        if f is not None:
            f.close()
