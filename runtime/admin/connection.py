"""Connection files of admin endpoints: where they live, how they are written and found.

Like Jupyter's connection files: a small JSON file (address, token, pid) readable only by
the user, in a 0700 directory, so only the user's own tools can attach to a controller.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from .. import rundir

__all__ = [
    "PREFIX", "SUFFIX", "ConnectionFileError", "ConnectionInfo", "runtime_dir",
    "write_connection_file", "remove_connection_file", "read_connection_file",
    "list_connection_files", "newest_connection_file",
]

PREFIX = "admin-"
SUFFIX = ".json"


class ConnectionFileError(ValueError):
    """A connection file is missing, malformed, or readable by other users."""


@dataclass(frozen=True)
class ConnectionInfo:
    """What a client needs to reach one admin endpoint."""

    address: str  # e.g. tcp://127.0.0.1:40123
    token: str  # hex; every request must carry it
    pid: int  # the controller's pid
    argv: list[str] = field(default_factory=list)
    started: float = 0.0


def runtime_dir(create: bool = True) -> Path:
    """The user-only directory holding connection files: the per-user runtime root
    (`runtime.rundir.root()`: `$MONARCH_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/monarch`,
    else `<tmp>/monarch-<uid>`), created with mode 0700."""
    if not create:
        return rundir.root(create=False)
    try:
        return rundir.root()
    except rundir.RuntimeRootError as e:
        raise ConnectionFileError(str(e)) from None


def write_connection_file(info: ConnectionInfo, directory: Optional[Path] = None) -> Path:
    """Write `info` atomically to `<dir>/admin-<pid>-<start>_<port>.json` with mode 0600,
    locked by this process while it lives (`runtime.rundir.write_file`): `sweep()` removes
    it once this process is gone; `remove_connection_file` removes it before."""
    d = Path(directory) if directory is not None else runtime_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    port = info.address.rsplit(":", 1)[-1]
    start = rundir.process_start_time(info.pid) or 0
    name = f"{PREFIX}{info.pid}-{start}_{port}{SUFFIX}"
    return rundir.write_file(d, name, json.dumps(asdict(info)).encode())


def remove_connection_file(path: str | os.PathLike[str]) -> None:
    """Remove a connection file this process wrote, and release its lock."""
    rundir.remove_file(path)


def read_connection_file(path: str | os.PathLike[str]) -> ConnectionInfo:
    """Read and check a connection file; refuse one that other users could read."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ConnectionFileError(f"connection file {p} does not exist") from None
    if st.st_uid != os.getuid():
        raise ConnectionFileError(f"connection file {p} is not owned by this user")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise ConnectionFileError(
            f"connection file {p} has mode {oct(stat.S_IMODE(st.st_mode))}; expected 0600")
    try:
        raw = json.loads(p.read_text())
        return ConnectionInfo(address=str(raw["address"]), token=str(raw["token"]),
                              pid=int(raw["pid"]), argv=list(raw.get("argv", [])),
                              started=float(raw.get("started", 0.0)))
    except (ValueError, KeyError, TypeError) as e:
        raise ConnectionFileError(f"connection file {p} is malformed: {e}") from None


def list_connection_files(directory: Optional[Path] = None) -> list[Path]:
    """Connection files of live controllers, newest first (stale ones are skipped)."""
    d = Path(directory) if directory is not None else runtime_dir(create=False)
    if not d.is_dir():
        return []
    out = []
    for p in d.glob(f"{PREFIX}*{SUFFIX}"):
        try:
            mtime = p.stat().st_mtime
        except OSError:
            continue
        if rundir.alive(p):  # its writer holds its lock (or, older files, its pid runs)
            out.append((mtime, p))
    return [p for _, p in sorted(out, reverse=True)]


def newest_connection_file(directory: Optional[Path] = None) -> Path:
    """The newest live controller's connection file, or a clear error if there is none."""
    files = list_connection_files(directory)
    if not files:
        d = Path(directory) if directory is not None else runtime_dir(create=False)
        raise ConnectionFileError(
            f"no connection file of a running controller in {d}; start one (import runtime"
            " and create a mesh, or call runtime.admin.serve()) or pass --connection-file")
    return files[0]
