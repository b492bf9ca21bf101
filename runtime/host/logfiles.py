"""Per-proc log files on each host: the host agent, which reads every proc's stdout and
stderr pipe, also appends what it reads to one file per proc, so a proc's output outlives
the controller (a kernel restart, `Job.load()`) and the proc itself.

Layout: `<log dir>/agent-<pid>-<start>/<mesh>.<rank>.<pid>.<start>.log` (the agent's pid and
start time, then the proc's mesh, rank, pid and start time as `YYYYmmddTHHMMSS`), each
directory mode 0700 and owned by the user, each file 0600. stdout and stderr go to the
same file in the order the agent reads them (as `2>&1`). A file over the size cap is
rotated: `.log` becomes `.log.1`, `.log.1` becomes `.log.2`, up to the number of backups
kept. Files are written with `os.write` as the bytes arrive (no buffer in the agent), so
what a proc wrote before it was killed is there, C-level writes to fds 1 and 2 included.

`read()` answers the agent's "logs" query (`runtime.read_logs`, `Job.logs`).
"""

from __future__ import annotations

import os
import re
import socket
import stat
import time
from pathlib import Path
from typing import Any, Mapping, Optional

__all__ = [
    "SUFFIX", "MAX_REPLY_BYTES", "stamp", "file_name", "parse_name", "private_dir",
    "capture_wanted", "LogFile", "AgentLogs", "read",
]

SUFFIX = ".log"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_NAME = re.compile(r"^(?P<mesh>[A-Za-z0-9_-]*)\.(?P<rank>\d+)\.(?P<pid>\d+)\."
                   r"(?P<start>\d{8}T\d{6})\.log(?:\.(?P<gen>\d+))?$")
#: the most bytes of lines one query returns (its newest lines are kept)
MAX_REPLY_BYTES = 8 << 20


def stamp(t: float) -> str:
    """`t` (seconds since the epoch) as the local `YYYYmmddTHHMMSS` used in file names."""
    return time.strftime("%Y%m%dT%H%M%S", time.localtime(t))


def file_name(mesh: str, rank: int, pid: int, started: float) -> str:
    """The log file name of one proc (characters other than letters, digits, `_`, `-` in
    the mesh name become `_`)."""
    return f"{_UNSAFE.sub('_', mesh)}.{int(rank)}.{int(pid)}.{stamp(started)}{SUFFIX}"


def parse_name(name: str) -> Optional[dict[str, Any]]:
    """mesh, rank, pid, start and rotation generation (0: the current file) of a log file
    name; None for a name this module did not make."""
    m = _NAME.match(name)
    if m is None:
        return None
    return {"mesh": m["mesh"], "rank": int(m["rank"]), "pid": int(m["pid"]),
            "start": m["start"], "gen": int(m["gen"] or 0)}


def private_dir(path: Path) -> Path:
    """`path` as a directory of mode 0700 owned by this user (made if missing); a link or
    another user's directory raises PermissionError."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise PermissionError(f"log directory {path} is not a directory owned by this user")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def capture_wanted(spawn_env: Optional[Mapping[str, str]], default: bool) -> bool:
    """Whether a proc's output goes to a file: its spawn's `MONARCH_FILE_CAPTURE` (the
    controller's setting), else this agent's own setting, else `default` (on for the
    agents of jobs, off for a controller's local agent)."""
    from ..config import SETTINGS, config

    raw = (spawn_env or {}).get(SETTINGS["file_capture"].env)
    if raw is not None and raw.strip():
        return bool(SETTINGS["file_capture"].parse(raw))
    own = config.file_capture
    return default if own is None else bool(own)


class LogFile:
    """One proc's log file: append-only, rotated when it would pass `max_bytes`."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        self.path = path
        self.max_bytes = max(1, int(max_bytes))
        self.backups = max(0, int(backups))
        self.fd = -1
        self.size = 0
        self._open()

    def _open(self, truncate: bool = False) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        self.fd = os.open(self.path, flags | (os.O_TRUNC if truncate else 0), 0o600)
        self.size = os.fstat(self.fd).st_size

    def write(self, data: bytes) -> None:
        """Append `data`; the file is rotated at a line end before it would pass the cap (a
        line longer than the cap is cut). Errors (a full disk) are swallowed: the output
        still reaches the controller."""
        if self.fd < 0 or not data:
            return
        view = memoryview(data)
        try:
            while view:
                room = self.max_bytes - self.size
                if len(view) <= room:
                    self._put(view)
                    return
                cut = bytes(view[:room]).rfind(b"\n") + 1 if room > 0 else 0
                if cut == 0 and self.size == 0:
                    cut = room  # one line longer than the cap: cut it
                if cut:
                    self._put(view[:cut])
                    view = view[cut:]
                self.rotate()
        except OSError:
            pass

    def _put(self, view: memoryview) -> None:
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
            self.size += n

    def rotate(self) -> None:
        """`.log` -> `.log.1` -> ... -> `.log.<backups>` (the oldest is dropped)."""
        os.close(self.fd)
        self.fd = -1
        if self.backups == 0:
            self._open(truncate=True)
            return
        base = str(self.path)
        for gen in range(self.backups - 1, 0, -1):
            if os.path.exists(f"{base}.{gen}"):
                os.replace(f"{base}.{gen}", f"{base}.{gen + 1}")
        os.replace(base, f"{base}.1")
        self._open()

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1


class AgentLogs:
    """The log directory of one host agent: opens a file per proc on first use."""

    def __init__(self, base: Optional[str], agent_pid: int, agent_start: float) -> None:
        self.base = base
        self.name = f"agent-{agent_pid}-{stamp(agent_start)}"
        self.dir: Optional[Path] = None
        self.announced: set[str] = set()

    def directory(self) -> Path:
        """This agent's directory (made, mode 0700, on first use)."""
        if self.dir is None:
            from .. import rundir
            from ..config import config

            base = Path(self.base or config.log_dir or rundir.root() / "logs")
            private_dir(base)
            self.dir = private_dir(base / self.name)
        return self.dir

    def open(self, mesh: str, rank: int, pid: int) -> Optional[LogFile]:
        """A new log file for a proc that just started; None when it cannot be made."""
        from ..config import config

        try:
            path = self.directory() / file_name(mesh, rank, pid, time.time())
            return LogFile(path, config.log_file_max_bytes, config.log_file_backups)
        except OSError:
            return None

    def for_proc(self, info: Mapping[str, Any], pid: int, forward: Any) -> Optional[LogFile]:
        """The log file of a proc just spawned (`info`: the agent's mesh, rank, owner and
        capture decision), or None; the first file of each controller is announced to it
        once, through `forward(owner, proc_id, stream, label, text)`."""
        if not info.get("capture"):
            return None
        f = self.open(info["mesh"], info.get("rank", 0), pid)
        owner = info.get("owner", "")
        if f is not None and owner and owner not in self.announced:
            self.announced.add(owner)
            forward(owner, "", "stderr", "monarch",
                    f"proc output files: {socket.gethostname()}:{f.path.parent}/\n")
        return f


def _lines_of(paths: list[Path]) -> list[str]:
    out: list[str] = []
    for p in paths:
        try:
            out.extend(p.read_bytes().decode("utf-8", "replace").splitlines())
        except OSError:
            continue
    return out


def read(directory: Path, mesh: str, rank: Optional[int] = None, tail: Optional[int] = None,
         grep: Optional[str] = None) -> list[dict[str, Any]]:
    """The log files of `mesh` (rank `rank`, or every rank) in `directory`: one dict per
    proc (mesh, rank, pid, start, lines, truncated, left_out: the lines `tail` dropped), by
    rank then start; lines of rotated files first, filtered by regular expression `grep`,
    then the last `tail` of them."""
    want = _UNSAFE.sub("_", mesh)
    pattern = re.compile(grep) if grep else None
    procs: dict[str, dict[str, Any]] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        info = parse_name(name)
        if info is None or info["mesh"] != want or (rank is not None and info["rank"] != rank):
            continue
        key = name.split(SUFFIX, 1)[0]
        entry = procs.setdefault(key, {k: info[k] for k in ("mesh", "rank", "pid", "start")})
        entry.setdefault("files", []).append((info["gen"], directory / name))
    out = sorted(procs.values(), key=lambda e: (e["rank"], e["start"], e["pid"]))
    budget = MAX_REPLY_BYTES
    for e in out:
        files = [p for _, p in sorted(e.pop("files"), key=lambda f: -f[0])]
        lines = _lines_of(files)
        if pattern is not None:
            lines = [ln for ln in lines if pattern.search(ln)]
        e["left_out"] = max(0, len(lines) - tail) if tail is not None else 0
        if tail is not None:
            lines = lines[-tail:] if tail > 0 else []
        kept, size = len(lines), 0
        while kept and size + len(lines[kept - 1]) + 1 <= budget:
            kept -= 1
            size += len(lines[kept]) + 1
        e["truncated"] = kept > 0
        e["lines"] = lines[kept:]
        budget -= size
    return out
