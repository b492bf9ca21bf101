"""Which saved job is current: Monarch's `set_current_job` / `load_current_job`, so a terminal
(`python -m runtime.cli`), a script and a notebook in one directory find the same job.

Monarch keeps, under `.monarch/` in the working directory, a spec (`module.attr` naming a
job object) per context; here a job is reattached from the file `Job.dump()` wrote, so
the current context is that file's path, written to `.monarch/current`. With none set,
Monarch's default cache `.monarch/job_state.pkl` is current when it exists.
"""
from __future__ import annotations

import os
from pathlib import Path

from .trait import DEFAULT_JOB_PATH, JobError, JobTrait

__all__ = [
    "CURRENT_FILE", "SAVED_JOBS_DIR", "set_current_job", "current_job_path", "clear_current_job",
    "load_current_job", "saved_jobs",
]

#: the file naming the current job (relative to the working directory, like Monarch's)
CURRENT_FILE = ".monarch/current"
#: where `%mesh alloc NAME --job process --keep ...` saves its jobs
SAVED_JOBS_DIR = ".monarch/jobs"


def set_current_job(path: str | os.PathLike) -> Path:
    """Make the job saved at `path` (by `Job.dump`, `state(cached_path=...)` or `%mesh alloc
    ... --keep`) the current one for this directory; returns its absolute path. JobError
    when `path` holds no saved job this user may load."""
    from .trait import job_load

    p = Path(path).expanduser().resolve()
    try:
        job_load(p)
    except FileNotFoundError:
        raise JobError(f"no saved job at {str(path)!r}") from None
    except JobError:
        raise
    except Exception as e:  # not a pickle of a job
        raise JobError(f"{str(path)!r} is not a saved job: {e}") from None
    cur = Path(CURRENT_FILE)
    cur.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = cur.with_name(f".current.{os.getpid()}")
    tmp.write_text(str(p) + "\n")
    os.replace(tmp, cur)
    return p


def current_job_path() -> Path | None:
    """The current job's file: the one `set_current_job` named, else Monarch's
    `.monarch/job_state.pkl` if it exists, else None."""
    try:
        text = Path(CURRENT_FILE).read_text().strip()
    except FileNotFoundError:
        text = ""
    if text:
        return Path(text)
    default = Path(DEFAULT_JOB_PATH)
    return default.resolve() if default.exists() else None


def clear_current_job() -> None:
    """No job is current any more (the job itself is left alone)."""
    Path(CURRENT_FILE).unlink(missing_ok=True)


def load_current_job() -> JobTrait:
    """The current job, loaded from its file (not attached yet: call `.state()`, as with
    Monarch's). JobError saying what to do when there is none or its file is gone."""
    from .trait import job_load

    path = current_job_path()
    if path is None:
        raise JobError("no current job: allocate a kept one (%mesh alloc NAME --job process "
                       "--keep 30m) or choose a saved one with `python -m runtime.cli context "
                       "set PATH` (runtime.job.set_current_job)")
    try:
        return job_load(path)
    except FileNotFoundError:
        raise JobError(f"the current job's file {str(path)!r} is gone (the job was killed "
                       "or removed); choose another with `context set PATH`") from None


def saved_jobs() -> list[Path]:
    """Saved jobs of this directory: `.monarch/jobs/*.pkl`, Monarch's default cache, and
    the current one, each once."""
    found = sorted(Path(SAVED_JOBS_DIR).glob("*.pkl")) if Path(SAVED_JOBS_DIR).is_dir() else []
    out = [p.resolve() for p in found]
    default = Path(DEFAULT_JOB_PATH)
    if default.exists():
        out.append(default.resolve())
    cur = current_job_path()
    if cur is not None and cur not in out:
        out.append(cur)
    return out
