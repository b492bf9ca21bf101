"""LocalJob: N host agents on this machine, on loopback TCP with CurveZMQ.

For development and scale tests: every agent is a real `python -m runtime.host` process
listening on 127.0.0.1, so the multi-host code paths run without a cluster.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from ..config import config
from .base import Job, JobError, JobState, read_address_files, slots, tail

__all__ = ["agent_argv", "LocalJob", "ThisHostJob"]


def agent_argv(python: str, listen: str, key_file: Path, address_file: Path,
               tied: bool = True, log_dir: Path | None = None, keep: float = 0.0,
               job_dir: Path | None = None) -> list[str]:
    """The command line of one host agent; when `tied`, it exits when this process dies;
    its procs' log files go under `log_dir` when given; with `keep`, it keeps its procs
    that long after their controller goes away and then ends, the last of the job's
    agents removing `job_dir`."""
    argv = [python, "-m", "runtime.host", "--listen", listen, "--key-file", str(key_file),
            "--address-file", str(address_file)]
    argv += ["--log-dir", str(log_dir)] if log_dir is not None else []
    if keep:
        argv += ["--keep", repr(float(keep))]
        argv += ["--job-dir", str(job_dir)] if job_dir is not None else []
    return argv + (["--parent-pid", str(os.getpid())] if tied else [])


class LocalJob(Job):
    """Start `hosts` agents (or `meshes={name: hosts}`) as child processes on 127.0.0.1."""

    kind = "local"
    cacheable = False
    #: agents exit with this process (False: they outlive it, see ProcessJob)
    tied = True

    def __new__(cls, hosts: object = None, **kw: object) -> "LocalJob":
        if cls is LocalJob and isinstance(hosts, (list, tuple)):
            return super().__new__(ThisHostJob)  # Monarch's LocalJob(hosts=("a", "b"))
        return super().__new__(cls)

    def __init__(self, hosts: int | None = None, *, meshes: dict[str, int] | None = None,
                 python: str = sys.executable, env: dict[str, str] | None = None,
                 **kw) -> None:
        if meshes is None:
            if hosts is None:
                raise ValueError("give exactly one of hosts=N or meshes={name: N}")
            meshes = {"hosts": hosts}
        elif hosts is not None:
            raise ValueError("give exactly one of hosts=N or meshes={name: N}")
        super().__init__(meshes, **kw)
        self.python = python
        self.env = env
        self.procs: dict[tuple[str, int], subprocess.Popen] = {}

    def _launch(self) -> None:
        assert self.workdir is not None and self.key_file is not None
        (self.workdir / "addrs").mkdir(mode=0o700)
        env = {**os.environ, **config.to_env(), **(self.env or {})}  # configure() reaches agents
        for mesh, i in slots(self.meshes):
            log = open(self.workdir / f"agent-{mesh}.{i}.log", "wb")
            argv = agent_argv(self.python, "tcp://127.0.0.1:0", self.key_file,
                              self.workdir / "addrs" / f"{mesh}.{i}.addr", self.tied,
                              None if config.log_dir else self.workdir / "logs",
                              getattr(self, "keep", 0.0), self.workdir)
            self.procs[(mesh, i)] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                     stdin=subprocess.DEVNULL, env=env,
                                                     start_new_session=not self.tied)
            log.close()

    def _spec(self) -> dict:
        return {"meshes": self.meshes, "python": self.python, "env": self.env}

    def _addresses(self) -> dict[tuple[str, int], str]:
        assert self.workdir is not None
        return read_address_files(self.workdir / "addrs", list(self.procs))

    def _check(self) -> str:
        assert self.workdir is not None  # checked only once applied (wait_addresses)
        for (mesh, i), p in self.procs.items():
            if p.poll() is not None:
                raise JobError(f"local agent {mesh}[{i}] (pid {p.pid}) exited with {p.returncode}:\n"
                               + tail(self.workdir / f"agent-{mesh}.{i}.log"))
        return f"{len(self.procs)} agents running"

    def _cancel(self) -> None:
        live = [p for p in self.procs.values() if p.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in live:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)

    def dump(self, path: str | os.PathLike) -> Path:
        """Not supported: local agents exit with the process that started them."""
        raise JobError("a LocalJob's agents exit with this process; it cannot be dumped")

    @property
    def pids(self) -> list[int]:
        """Process ids of the agents (for tests and admin views)."""
        return [p.pid for p in self.procs.values()]


class ThisHostJob(LocalJob):
    """Monarch's `LocalJob(hosts=("trainers", ...))`: each named mesh is `this_host()`,
    whose procs run on this machine under this controller's own host agent."""

    kind = "this_host"

    def __init__(self, hosts: Sequence[str] = ("hosts",), **kw: Any) -> None:
        if not hosts or not all(isinstance(h, str) and h.isidentifier() for h in hosts):
            raise ValueError(f"hosts must be mesh names (identifiers), got {hosts!r}")
        Job.__init__(self, {h: 1 for h in hosts}, progress=False, **kw)
        self.python, self.env, self.procs = "", None, {}

    def _prepare(self) -> None:
        pass  # no agents to start, no keys

    def _launch(self) -> None:
        pass

    def _addresses(self) -> dict[tuple[str, int], str]:
        return {}

    def _cancel(self) -> None:
        pass

    def kill(self) -> None:
        """Forget the meshes; this host's agent keeps running (it is the controller's own)."""
        self._job_state = None

    def can_run(self, spec: Job) -> bool:
        """Never: like Monarch's LocalJob, the spec itself is always used."""
        return False

    def state(self, cached_path: Any = None, timeout: float | None = None,
              takeover: bool = False) -> JobState:
        """Every named mesh as `this_host()`; `cached_path` is ignored (nothing to cache),
        and so is `takeover` (this host's agent is this controller's own)."""
        from .._meshes import this_host

        self.apply()
        if self._job_state is None:
            self._job_state = self._with_admin(
                JobState({name: this_host() for name in self.meshes}))
        return self._job_state
