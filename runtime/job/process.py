"""Monarch's `ProcessJob`: N host agents on this machine that outlive the controller, so a
re-run reattaches (Monarch's other local job, `LocalJob(hosts=("a", "b"))`, whose every
named mesh is `this_host()`, is `local.ThisHostJob`).

    job = ProcessJob({"hosts": 2})
    hosts = job.state(cached_path=None).hosts        # HostMesh {hosts: 2}
"""
from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from .._base.process import start_time
from .base import Job, JobError, JobState, read_address_files, slots
from .trait import DEFAULT_JOB_PATH
from .local import LocalJob, ThisHostJob  # (ThisHostJob was defined here)

__all__ = ["ProcessJob", "ThisHostJob"]


class ProcessJob(LocalJob):
    """Monarch's `ProcessJob(meshes, env=None)`: one host agent per host on this machine
    (loopback TCP, CurveZMQ). `state()` caches the job at `.monarch/job_state.pkl` by default
    and its agents then outlive this process until `kill()`; with `cached_path=None` they
    exit with this process, like a `LocalJob`'s. With `keep=SECONDS` (default: the `keep`
    setting) the job is kept: its agents outlive this process, and keep the procs spawned
    on it and their actors that long after their controller goes away, for another
    controller to reattach (`Job.load(path).state()`, then `job.proc_mesh(name)`); past
    the lease with nobody attached they end the procs and themselves, and remove the job's
    directory."""

    kind = "process"
    cacheable = True
    default_cached_path = DEFAULT_JOB_PATH
    _transient = ("_job_state", "procs")

    def __init__(self, meshes: dict[str, int], env: dict[str, str] | None = None,
                 keep: float | None = None, **kw: Any) -> None:
        from ..config import config

        kw.setdefault("progress", False)
        super().__init__(meshes=meshes, env=env, **kw)
        keep = config.keep if keep is None else keep
        if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not keep >= 0:
            raise ValueError(f"keep={keep!r}: expected seconds >= 0")
        self.keep = float(keep)
        self.tied = False  # an explicit apply() starts a job that outlives this process
        self.agent_pids: dict[str, int] = {}
        self.agent_starts: dict[int, int | None] = {}

    def _apply_for_state(self, cached: bool) -> None:
        self.tied = not cached and not self.keep  # a kept job outlives this process
        self.apply()

    def _launch(self) -> None:
        super()._launch()
        self.agent_pids = {f"{m}.{i}": p.pid for (m, i), p in self.procs.items()}
        self.agent_starts = {pid: start_time(pid) for pid in self.agent_pids.values()}

    def _addresses(self) -> dict[tuple[str, int], str]:
        assert self.workdir is not None
        return read_address_files(self.workdir / "addrs", slots(self.meshes))

    def _after_load(self) -> None:
        super()._after_load()
        self.procs = {}

    def _agent_alive(self, pid: int) -> bool:
        return start_time(pid) is not None and start_time(pid) == self.agent_starts.get(pid)

    def _alive(self) -> bool:
        return bool(self.agent_pids) and all(self._agent_alive(p)
                                             for p in self.agent_pids.values())

    def _check(self) -> str:
        if self.procs:
            return super()._check()
        if not self._alive():
            if self.keep and self.workdir is not None and not self.workdir.exists():
                raise JobError(
                    f"process job {self.meshes} (directory {self.workdir}) has ended: it was "
                    f"kept for {self.keep:g} s after its controller went away, and its lease "
                    "ended with no controller attached; its agents, procs and files are "
                    "gone. Start a new job")
            raise JobError(f"process job: agents {self.agent_pids} are no longer running")
        return f"{len(self.agent_pids)} agents running"

    def _cancel(self) -> None:
        if self.procs:
            super()._cancel()
        else:  # reattached: the agents are not our children
            live = [p for p in self.agent_pids.values() if self._agent_alive(p)]
            for pid in live:
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while any(self._agent_alive(p) for p in live) and time.monotonic() < deadline:
                time.sleep(0.05)
            for pid in live:
                if self._agent_alive(pid):
                    os.kill(pid, signal.SIGKILL)
        if self.workdir is not None:  # Monarch's kill() leaves nothing behind
            shutil.rmtree(self.workdir, ignore_errors=True)

    dump = Job.dump  # unlike LocalJob, a ProcessJob can be saved and reattached
