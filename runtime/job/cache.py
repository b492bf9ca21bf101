"""Saved jobs: Monarch's `job_load` / `job_loads` and the reattach step of
`Job.state(cached_path=...)` (a second controller, or a re-run, reuses a running job).

A saved job is a pickle, so it is read only from a file this user owns and nobody else can
write (the same rule as ssh's private keys); anything else raises `JobError`.
"""
from __future__ import annotations

import logging
import os
import pickle
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from .base import JobError, adopt_saved

if TYPE_CHECKING:
    from .base import Job

__all__ = ["DEFAULT_JOB_PATH", "job_loads", "job_load", "adopt"]

log = logging.getLogger(__name__)

#: Monarch's default cache location (relative to the current directory).
DEFAULT_JOB_PATH = ".monarch/job_state.pkl"


def _check_private(path: Path) -> None:
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise JobError(f"refusing to load job file {str(path)!r}: it must belong to this user "
                       f"and not be writable by group or others (mode "
                       f"{stat.S_IMODE(st.st_mode):o})")


def job_loads(data: bytes) -> "Job":
    """A job from the bytes of `Job.dumps()`."""
    from .trait import JobTrait, restore_saved

    cls, fields = pickle.loads(data)
    if not (isinstance(cls, type) and issubclass(cls, JobTrait)):
        raise JobError(f"not a saved job: holds {cls!r}")
    return restore_saved(cls, fields)


def job_load(filename: str | os.PathLike = DEFAULT_JOB_PATH) -> "Job":
    """A job saved with `Job.dump(filename)` (default: Monarch's `.monarch/job_state.pkl`)."""
    path = Path(filename)
    _check_private(path)
    return job_loads(path.read_bytes())


def adopt(spec: "Job", path: str | os.PathLike) -> bool:
    """Make `spec` the running job saved at `path` when that job `can_run(spec)`; a saved job
    that cannot is killed and its file removed (as Monarch does). True when adopted."""
    try:
        cached = job_load(path)
    except FileNotFoundError:
        return False
    if not cached.can_run(spec):
        log.info("cached job at %s cannot run %r: replacing it", path, spec)
        try:
            cached.kill()
        except Exception as e:  # gone already: removing its file is what matters
            log.info("killing the cached job failed: %s", e)
        Path(path).unlink(missing_ok=True)
        return False
    adopt_saved(spec, cached)
    return True
