"""The Job base class: start host agents somewhere, wait for them, attach, cancel.

A job owns a set of named meshes (name -> number of hosts). `state()` starts the job if
needed, waits (with a progress bar) until every agent has published its address, and
returns one `HostMesh` per mesh name. `kill()` stops the meshes and cancels the job.
"""
from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from pathlib import Path
from types import EllipsisType
from typing import Any

from .clients import register_owner
from .trait import JobError, JobState, JobTrait, job_load

__all__ = [
    "ADDRESS_RE", "JobError", "JobState", "check_meshes", "parse_address", "slots", "private_dir",
    "make_key_file", "read_address_files", "tail", "Job", "adopt_saved", "adopt", "admin_address",
    "TelemetryConfig",
]

log = logging.getLogger(__name__)

ADDRESS_RE = re.compile(r"^tcp://(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})$")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_meshes(meshes: dict[str, int]) -> dict[str, int]:
    """Validate a mesh spec (name -> positive host count) and return a copy."""
    if not isinstance(meshes, dict) or not meshes:
        raise ValueError(f"meshes must be a non-empty dict of name -> host count, got {meshes!r}")
    out = {}
    for name, n in meshes.items():
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise ValueError(f"mesh name {name!r} must be a Python identifier")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"mesh {name!r}: host count must be a positive int, got {n!r}")
        out[name] = n
    return out


def parse_address(text: str) -> str:
    """The agent address in `text`: 'tcp://HOST:PORT', or the agent's address-file JSON
    ({"address": "tcp://HOST:PORT", ...}); raise ValueError otherwise."""
    addr = text.strip()
    if addr.startswith("{"):
        try:
            addr = str(json.loads(addr)["address"])
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"not an agent address file: {text!r}") from None
    m = ADDRESS_RE.match(addr)
    if not m or not 0 < int(m.group(2)) < 65536:
        raise ValueError(f"not an agent address (tcp://HOST:PORT): {text!r}")
    return addr


def slots(meshes: dict[str, int]) -> list[tuple[str, int]]:
    """One (mesh, index) per host, in the order hosts are assigned to meshes."""
    return [(name, i) for name, n in meshes.items() for i in range(n)]


def private_dir(parent: str | os.PathLike | None, prefix: str) -> Path:
    """A new directory only the user can read (0700), under `parent` or the temp dir."""
    if parent is not None:
        Path(parent).mkdir(parents=True, exist_ok=True, mode=0o700)
    d = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    d.chmod(0o700)
    return d


def make_key_file(path: Path) -> Path:
    """Create the cluster's CurveZMQ key file (mode 0600) with the runtime's keygen."""
    r = subprocess.run([sys.executable, "-m", "runtime.transport.auth", "keygen", str(path)],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0 or not path.exists():
        raise JobError(f"keygen failed ({r.returncode}): {r.stderr.strip()[-1000:]}")
    path.chmod(0o600)
    return path


def read_address_files(directory: Path, wanted: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """Addresses published so far as `<mesh>.<index>.addr` files; half-written ones are skipped."""
    found = {}
    for mesh, i in wanted:
        p = directory / f"{mesh}.{i}.addr"
        try:
            found[(mesh, i)] = parse_address(p.read_text())
        except (OSError, ValueError):
            continue
    return found


def tail(path: Path, n: int = 20) -> str:
    """Last n lines of a text file, or '' when it does not exist."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class Job(JobTrait, ABC):
    """Start host agents through some launcher and attach to them as named HostMeshes."""

    kind = "job"
    #: where `state()` caches the running job when no `cached_path` is given (None: nowhere)
    default_cached_path: str | None = None
    #: whether a running job of this kind can be saved and reattached from another process
    cacheable = True
    #: where `AllocSpec.run` saved a kept job (set only then)
    saved_path: str

    def __init__(self, meshes: dict[str, int], *, key_file: str | os.PathLike | None = None,
                 workdir: str | os.PathLike | None = None, timeout: float = 300.0,
                 progress: bool = True) -> None:
        self.meshes = check_meshes(meshes)
        if timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self.progress = progress
        self._workdir_arg = workdir
        self._key_file_arg = Path(key_file) if key_file is not None else None
        if self._key_file_arg is not None:
            if not self._key_file_arg.is_file():
                raise ValueError(f"key_file {str(self._key_file_arg)!r} does not exist")
            from ..transport import auth

            auth.check_key_file(str(self._key_file_arg), "key file (key_file=)")
        self.workdir: Path | None = None
        self.key_file: Path | None = None
        self._job_state: JobState | None = None  # (JobTrait's hook is the method `_state`)
        self._launched = False
        self._killed = False

    # --- subclass hooks -----------------------------------------------------------------
    @abstractmethod
    def _launch(self) -> None:
        """Start the agents (or submit the job that starts them)."""

    @abstractmethod
    def _addresses(self) -> dict[tuple[str, int], str]:
        """Addresses of the agents that have published one so far."""

    @abstractmethod
    def _check(self) -> str:
        """Raise JobError if the job can no longer bring its agents up; else a short status."""

    @abstractmethod
    def _cancel(self) -> None:
        """Stop the agents / cancel the job; must be safe to call more than once."""

    # --- public API ---------------------------------------------------------------------
    @property
    def hosts(self) -> int:
        """Total number of hosts across all meshes."""
        return sum(self.meshes.values())

    def _prepare(self) -> None:
        if self.workdir is None:
            if self._workdir_arg is None and getattr(self, "tied", False):
                # agents that end with this process: their directory is under the runtime
                # root, named for this process, so a controller killed before cleanup()
                # leaves nothing once the next one has swept (runtime/rundir.py)
                from .. import rundir

                self.workdir = Path(rundir.make_dir("job"))
            else:  # a job that may outlive this process: kill() removes its directory
                self.workdir = private_dir(self._workdir_arg, f"monarch-{self.kind}-")
        if self.key_file is None:
            self.key_file = self._key_file_arg or make_key_file(self.workdir / "cluster.key")

    def apply(self, client_script: str | None = None) -> "Job":
        """Start the job if it is not started yet; returns self. Monarch's batch mode
        (`client_script=...`, the controller runs inside the job) is not provided."""
        if client_script is not None:
            raise JobError("apply(client_script=...) (batch mode) is not provided: run the "
                           "script as the controller and call job.state() in it")
        if self._killed:
            raise JobError(f"{self.kind} job was killed; create a new one")
        if not self._launched:
            self._prepare()
            self._launched = True
            try:
                self._launch()
            except BaseException:
                self._cancel()
                raise
        return self

    def wait_addresses(self, timeout: float | None = None) -> dict[tuple[str, int], str]:
        """Block until every agent published its address; a progress bar shows how many did."""
        self.apply()
        from tqdm.auto import tqdm

        wanted = slots(self.meshes)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        with tqdm(total=len(wanted), desc=f"{self.kind} agents", unit="host",
                  disable=not self.progress, leave=False) as bar:
            while True:
                found = self._addresses()
                if len(found) > bar.n:
                    bar.update(len(found) - bar.n)
                if len(found) == len(wanted):
                    return found
                status = self._check()
                bar.set_postfix_str(status, refresh=False)
                if self._queued():  # the start deadline runs from when the job runs
                    deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
                if time.monotonic() > deadline:
                    missing = [f"{m}[{i}]" for m, i in wanted if (m, i) not in found]
                    raise JobError(f"{self.kind} job: agents {missing} did not start within "
                                   f"{self.timeout if timeout is None else timeout:.0f} s "
                                   f"(status: {status}){self._diagnostics()}")
                time.sleep(0.1)

    @property
    def active(self) -> bool:
        """True once applied and until killed."""
        return self._launched and not self._killed

    def can_run(self, spec: "Job") -> bool:
        """True when this running job can serve `spec` (same kind, same specification, agents
        alive): `state(cached_path=...)` then reuses it instead of starting a new one."""
        return (type(spec) is type(self) and spec._spec() == self._spec() and self.active
                and self._alive())

    def enable_telemetry(self, config: Any = None, **kwargs: Any) -> "Job":
        """Accepted so Monarch programs run; there is no telemetry service here
        (`state().telemetry_url` stays None), and as in Monarch it enables the admin
        endpoint (see `enable_admin`). Returns self."""
        return self.enable_admin()

    def enable_admin(self, config: Any = None, **kwargs: Any) -> "Job":
        """The controller's loopback admin endpoint (`runtime.admin`, where `monarch-admin`
        attaches) plays the part of Monarch's mesh admin: `state().admin_url` is its
        address (`tcp://127.0.0.1:PORT`). Returns self."""
        self._admin = True
        if self._job_state is not None:
            self._job_state.admin_url = admin_address()
        return self

    def _with_admin(self, state: JobState) -> JobState:
        """`state` with its admin_url set when the admin endpoint was asked for."""
        if getattr(self, "_admin", False):
            state.admin_url = admin_address()
        return state

    def _spec(self) -> dict[str, Any]:
        """What must match for a running job to serve another spec (see `can_run`)."""
        return {"meshes": self.meshes}

    def _alive(self) -> bool:
        """Whether the job's agents can still be reached (overridden where it can be checked)."""
        return True

    def _gateway_address(self) -> str | None:
        """The address this controller dials to reach the job through its gateway (None:
        it dials the agents)."""
        return None

    def _queued(self) -> bool:
        """Whether the job still waits in its scheduler's queue (as of the last `_check`):
        `wait_addresses` then waits without spending its start timeout."""
        return False

    def _apply_for_state(self, cached: bool) -> None:
        """Start the job from `state()`; `cached` says the job will be saved for reattaching."""
        self.apply()

    def state(self, cached_path: str | os.PathLike | None | EllipsisType = ...,
              timeout: float | None = None, takeover: bool = False) -> JobState:
        """Start if needed, wait for every agent, and return mesh name -> HostMesh.

        With a `cached_path` (default: the class's `default_cached_path`), a job saved there
        that `can_run` this spec is reattached instead of starting a new one; a job started
        here is saved there (Monarch's `job.state(cached_path=...)`). Agents that serve
        another live controller refuse (`AttachRefusedError`) unless `takeover=True`;
        meshes they kept for a next controller are then reached with `proc_mesh(name)`."""
        if self._job_state is not None:  # as in Monarch, each call its own HostMesh objects
            again = JobState()     # (same hosts): stop() on one leaves the others' procs
            for name, hm in self._job_state.items():
                again[name] = hm.slice()  # a new view, the same shape
            return again
        path = self.default_cached_path if cached_path is ... else cached_path
        started_here = False
        if path is not None and not self.cacheable:
            raise JobError(f"a {type(self).__name__}'s agents exit with this process, so it "
                           f"cannot be cached; pass cached_path=None (or use ProcessJob)")
        if not self._launched:
            if path is None or not adopt(self, path):
                self._apply_for_state(cached=path is not None)
                started_here = True
        found = self.wait_addresses(timeout)
        from .._meshes import attach_to_workers
        from ..errors import AttachRefusedError

        state = JobState()
        try:
            for name, n in self.meshes.items():
                addrs = [found[(name, i)] for i in range(n)]
                state[name] = attach_to_workers(addrs, key_file=str(self.key_file),
                                                gateway=self._gateway_address(),
                                                takeover=takeover)
                state[name].keep = getattr(self, "keep", 0.0) or None
        except AttachRefusedError:  # another controller owns the job: it stays as it is
            raise
        except BaseException:
            self.kill()
            raise
        self._job_state = self._with_admin(state)
        if path is not None and started_here:
            self.dump(path)
        register_owner(self)  # its terminal clients ask through this controller's endpoint
        return state

    def proc_mesh(self, name: str, timeout: float = 30.0) -> Any:
        """The live proc mesh `name` on this job's hosts: spawned by this controller, or
        kept by the agents after the controller before it went away (a restarted kernel
        reattaching with `Job.load(path).state()`), its actors reached with
        `.actor_mesh(actor_name)`. KeyError naming the proc meshes there are."""
        state = self._job_state if self._job_state is not None else self.state()
        names: list[str] = []
        for hm in state.values():
            try:
                return hm.proc_mesh(name, timeout)
            except KeyError:
                names += hm.proc_mesh_names()
        raise KeyError(f"{self.kind} job {self.meshes} has no live proc mesh {name!r}; "
                       f"there are: {sorted(set(names)) or 'none'}")

    def proc_mesh_names(self, timeout: float = 30.0) -> list[str]:
        """The names of the live proc meshes on this job's hosts: spawned by this controller,
        or kept for it (adopted here)."""
        state = self._job_state if self._job_state is not None else self.state()
        names: set[str] = set()
        for hm in state.values():
            hm.kept_meshes(timeout)
            names.update(hm.proc_mesh_names())
        return sorted(names)

    def ensure_running(self) -> None:
        """JobError saying why when the job can no longer serve (its agents are gone: killed,
        or a kept job's lease ended with no controller attached)."""
        self._check()

    def kept_meshes(self, timeout: float = 30.0) -> dict[str, Any]:
        """Proc mesh name -> ProcMesh of every mesh the job's agents kept for this
        controller (after the one before it went away); empty when none."""
        state = self._job_state if self._job_state is not None else self.state()
        out: dict[str, Any] = {}
        for hm in state.values():
            out.update(hm.kept_meshes(timeout))
        return out

    def logs(self, mesh: Any, rank: int | None = None, tail: int | None = None,
             grep: str | None = None, timeout: float = 10.0) -> Any:
        """What the procs of proc mesh `mesh` (a ProcMesh or its name) wrote, read from the
        log files on the job's hosts by their agents (`runtime.read_logs`): a `ProcLogs`
        list, one `ProcLog` per proc (rank `rank`, or all), each with its last `tail`
        lines matching `grep`. Works for procs that have exited and after `Job.load()`."""
        from .._meshes import read_logs

        state = self._job_state if self._job_state is not None else self.state()
        name = mesh if isinstance(mesh, str) else getattr(mesh, "name", None)
        return read_logs(list(state.values()), name, rank=rank, tail=tail, grep=grep,
                         timeout=timeout)

    def kill(self) -> None:
        """Shut the attached meshes down and cancel the job (idempotent)."""
        if self._killed:
            return
        self._killed = True
        for mesh in (self._job_state or {}).values():
            try:
                mesh.shutdown()
            except Exception:  # the agents may already be gone; cancelling follows anyway
                pass
        if self._launched:
            self._cancel()

    def cleanup(self) -> None:
        """Kill, then remove the job's private directory (keys, logs, address files)."""
        self.kill()
        if self.workdir is not None:  # always a fresh directory of ours (private_dir)
            from .. import rundir

            rundir.remove_dir(self.workdir)  # and its lock, if it is in the runtime root

    def _diagnostics(self) -> str:
        return ""

    # --- persistence: reattach from a new kernel ------------------------------------------
    _transient: tuple[str, ...] = ("_job_state",)

    def dumps(self) -> bytes:
        """What `dump()` writes, as bytes (`runtime.job.job_loads` reads them back)."""
        import cloudpickle

        if not self._launched or self._killed:
            raise JobError(f"only a running job can be dumped ({self!r})")
        data = {k: v for k, v in self.__dict__.items() if k not in self._transient}
        return cloudpickle.dumps((type(self), data))

    @staticmethod
    def load(path: str | os.PathLike) -> "Job":
        """A job saved with `dump()`; its agents must still be running. The file must be
        ours and not writable by others (it is unpickled)."""
        job = job_load(path)
        if not isinstance(job, Job):
            raise JobError(f"{str(path)!r} holds a {type(job).__name__}, not a runtime Job")
        return job

    def _after_load(self) -> None:
        """Reset what `_transient` left out of a saved job."""
        self._job_state = None

    def __enter__(self) -> "Job":
        return self.apply()

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def __repr__(self) -> str:
        state = "killed" if self._killed else "running" if self._launched else "not started"
        return f"{type(self).__name__}(meshes={self.meshes}, {state})"


def adopt_saved(spec: "Job", saved: "Job") -> None:
    """Make `spec` the job `saved` (read back from its file): its fields, less what `spec`
    keeps out of a saved job (`_transient`), then reset those."""
    spec.__dict__.update({k: v for k, v in saved.__dict__.items() if k not in spec._transient})
    spec._after_load()


def adopt(spec: "Job", path: str | os.PathLike) -> bool:
    """Make `spec` the running job saved at `path` when that job `can_run(spec)`; a saved job
    that cannot is killed and its file removed (as Monarch does). True when adopted."""
    try:
        cached = job_load(path)
    except FileNotFoundError:
        return False
    if not isinstance(cached, Job) or not cached.can_run(spec):
        log.info("cached job at %s cannot run %r: replacing it", path, spec)
        try:
            cached.kill()
        except Exception as e:  # gone already: removing its file is what matters
            log.info("killing the cached job failed: %s", e)
        Path(path).unlink(missing_ok=True)
        return False
    adopt_saved(spec, cached)
    return True


def admin_address() -> str:
    """The address of this controller's admin endpoint (started if it is not running)."""
    from ..admin import serve

    return serve().address


class TelemetryConfig:
    """Monarch's `monarch.job.TelemetryConfig` (dashboard, ports, batch sizes ...), accepted by
    `Job.enable_telemetry(config)` so Monarch programs run; there is no telemetry service
    here, so its settings change nothing (they are kept as attributes)."""

    def __init__(self, **settings: Any) -> None:
        self.__dict__.update(settings)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items())
        return f"TelemetryConfig({inner})"
