"""`JobTrait`: Monarch's protocol for a job class of your own (`monarch.job.JobTrait`).

Subclass it and define `_create(client_script)` (bring the job into existence),
`_state() -> JobState` (its host meshes), `_kill()`, and `can_run(spec)` (whether this
running job can serve `spec`, so that `state(cached_path=...)` reuses a saved one). The
jobs of this package (`runtime.job.Job` and its kinds) are JobTraits with their own hooks.

Saved jobs are here too: `dump()` writes one, Monarch's `job_load` / `job_loads` read it
back. A saved job is a pickle, so it is read only from a file this user owns and nobody
else can write (the same rule as ssh's private keys); anything else raises `JobError`.
"""

from __future__ import annotations

import os
import pickle
import stat
from pathlib import Path
from typing import Any, Optional, TypeVar

__all__ = ["JobError", "JobState", "JobTrait", "restore_saved", "DEFAULT_JOB_PATH", "job_loads",
           "job_load"]


class JobError(RuntimeError):
    """A job could not start its agents, lost them before attaching, or was misconfigured."""


class JobState(dict):
    """Mesh name -> HostMesh; also readable as attributes (`state.trainers`), as Monarch's
    `monarch.job.JobState`. `admin_url` is the controller's admin endpoint once the job's
    `enable_admin()`/`enable_telemetry()` was called (else None); there is no telemetry
    service (`telemetry_url`, `query_engine` stay None)."""

    query_engine = None
    telemetry_url: Optional[str] = None
    admin_url: Optional[str] = None

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"job has no mesh {name!r}; meshes: {sorted(self)}") from None


class JobTrait:
    """Base of every job: `apply()`, `state(cached_path=...)`, `kill()`, `dump()`/`dumps()`;
    a Monarch-style subclass supplies `_create`, `_state`, `_kill` and `can_run`."""

    def __init__(self) -> None:
        self._created = False

    def _create(self, client_script: Optional[str]) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define _create(client_script)")

    def _state(self) -> "JobState":
        raise NotImplementedError(f"{type(self).__name__} must define _state()")

    def _kill(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define _kill()")

    def can_run(self, spec: Any) -> bool:
        """Whether this running job can serve `spec` (default: never)."""
        return False

    @property
    def active(self) -> bool:
        """True once applied and until killed."""
        return self.__dict__.get("_created", False)

    def apply(self, client_script: Optional[str] = None) -> Any:
        """Bring the job into existence (once; a second call does nothing)."""
        if not self.__dict__.get("_created", False):
            self._create(client_script)
            self._created = True
        return self

    def state(self, cached_path: Optional[str] = ".monarch/job_state.pkl") -> "JobState":
        """The job's host meshes. Not applied yet and `cached_path` given: a job saved there
        that `can_run(self)` is used instead (a saved job that cannot is killed, its file
        removed); else this job is applied and saved there."""
        if not self.active and cached_path is not None:
            try:
                cached = job_load(cached_path)
            except FileNotFoundError:
                cached = None
            if cached is not None:
                if cached.can_run(self):
                    return cached._state()
                cached.kill()
                Path(cached_path).unlink(missing_ok=True)
        if not self.active:
            self.apply()
            if cached_path is not None:
                self.dump(cached_path)
        return self._state()

    def kill(self) -> None:
        """End the job (`_kill()`)."""
        self._kill()
        self._created = False

    def dumps(self) -> bytes:
        """This job as bytes (`runtime.job.job_loads` reads them back)."""
        import cloudpickle

        return cloudpickle.dumps((type(self), dict(self.__dict__)))

    def dump(self, path: str | os.PathLike) -> Path:
        """Save this job to `path` (mode 0600; `runtime.job.job_load` reads it back)."""
        data = self.dumps()
        path = Path(path)
        if path.parent != Path(""):
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return path

    def _after_load(self) -> None:
        """Called on a job read back by `job_load`/`job_loads`."""


J = TypeVar("J", bound=JobTrait)


def restore_saved(cls: type[J], fields: dict) -> J:
    """A job of class `cls` (a JobTrait) with the saved `fields`, its `_after_load` run
    (`job_loads` reads saved jobs back)."""
    job = cls.__new__(cls)
    job.__dict__.update(fields)
    job._after_load()
    return job


#: Monarch's default cache location (relative to the current directory).
DEFAULT_JOB_PATH = ".monarch/job_state.pkl"


def _check_private(path: Path) -> None:
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise JobError(f"refusing to load job file {str(path)!r}: it must belong to this user "
                       f"and not be writable by group or others (mode "
                       f"{stat.S_IMODE(st.st_mode):o})")


def job_loads(data: bytes) -> "JobTrait":
    """A job from the bytes of `Job.dumps()`."""
    cls, fields = pickle.loads(data)
    if not (isinstance(cls, type) and issubclass(cls, JobTrait)):
        raise JobError(f"not a saved job: holds {cls!r}")
    return restore_saved(cls, fields)


def job_load(filename: str | os.PathLike = DEFAULT_JOB_PATH) -> "JobTrait":
    """A job saved with `Job.dump(filename)` (default: Monarch's `.monarch/job_state.pkl`)."""
    path = Path(filename)
    _check_private(path)
    return job_loads(path.read_bytes())
