"""The per-user runtime root: every file and directory the runtime creates lives here.

Each entry is named `<kind>-<pid>-<start>-<rest>`: the kind (run, agent, rdma, admin), the
pid of the process that created it and that process's start time (clock ticks since boot,
field 22 of /proc/PID/stat). A controller, a host agent or `monarch-admin` that starts
calls `sweep()`, which removes the entries whose creator is gone: the pid is not running,
or runs with another start time (a reused pid). Never by name alone, never another user's.

The root is `MONARCH_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/monarch`, else
`<tmp>/monarch-<uid>`; it is created with mode 0700 and must be a directory (not a link)
owned by this user. Directories of ipc sockets go to `<tmp>/monarch-<uid>` instead when
the root's path is over 40 bytes (socket names are limited to 107); both are swept.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Optional

from .config import config

log = logging.getLogger("runtime")

# ipc socket paths are at most 107 bytes: a run directory's name takes about 32, which
# leaves a root of 40 bytes room for proc ids of 33 (the default ones take about 24)
MAX_ROOT_LEN = 40
_NAME = re.compile(r"^\.?([a-z]+)-(\d+)-(\d+)[-.]")


class RuntimeRootError(PermissionError):
    """The runtime root is not a private directory of this user."""


def default_root() -> Path:
    """Where the runtime root is, before it is created or checked."""
    if config.runtime_dir:
        return Path(config.runtime_dir)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg) and os.access(xdg, os.W_OK):
        return Path(xdg) / "monarch"
    return short_root()


def short_root() -> Path:
    """`<tmp>/monarch-<uid>`: the default root, and where sockets go under a long one."""
    return Path(tempfile.gettempdir()) / f"monarch-{os.getuid()}"


def root(create: bool = True) -> Path:
    """The per-user runtime root (created 0700 when `create`; its ownership is checked)."""
    return _checked(default_root(), create)


def socket_root(create: bool = True) -> Path:
    """Where directories of ipc sockets go: the runtime root, unless its path is too long
    for socket names (107 bytes), then `<tmp>/monarch-<uid>` (swept the same way)."""
    d = default_root()
    if len(str(d)) > MAX_ROOT_LEN:
        d = short_root()
    return _checked(d, create)


def roots() -> list[Path]:
    """The runtime root and, if it differs, the socket root (what `sweep()` looks at)."""
    out = [root(create=False)]
    if socket_root(create=False) != out[0]:
        out.append(socket_root(create=False))
    return out


def _checked(d: Path, create: bool) -> Path:
    if not create:
        return d
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode):
        raise RuntimeRootError(f"runtime root {d} is not a directory (a link?)")
    if st.st_uid != os.getuid():
        raise RuntimeRootError(f"runtime root {d} is owned by uid {st.st_uid}, not us "
                               f"({os.getuid()}); set MONARCH_RUNTIME_DIR")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(d, 0o700)
    return d


def process_start_time(pid: int) -> Optional[int]:
    """Start time of `pid` in clock ticks since boot, None if no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        return int(data[data.rindex(b")") + 2:].split()[19])
    except (ValueError, IndexError):
        return None


_tag: Optional[tuple[int, str]] = None


def tag() -> str:
    """`<pid>-<start>` of this process (what its entries are named with)."""
    global _tag
    pid = os.getpid()
    if _tag is None or _tag[0] != pid:
        _tag = (pid, f"{pid}-{process_start_time(pid) or 0}")
    return _tag[1]


def make_dir(kind: str) -> str:
    """A new 0700 directory `<socket root>/<kind>-<pid>-<start>-<random>` owned by this
    process, for its ipc sockets."""
    d = tempfile.mkdtemp(prefix=f"{kind}-{tag()}-", dir=socket_root())
    os.chmod(d, 0o700)
    return d


def creator(name: str) -> Optional[tuple[str, int, int]]:
    """(kind, pid, start) of an entry name made by this module, else None."""
    m = _NAME.match(name)
    if m is None:
        return None
    return m.group(1), int(m.group(2)), int(m.group(3))


def creator_alive(pid: int, start: int) -> bool:
    """True if `pid` runs and started at `start` (the process that made the entry)."""
    now = process_start_time(pid)
    if now is None:
        return False
    return start == 0 or now == start


def sweep(directory: Optional[Path] = None) -> list[str]:
    """Remove the entries of the runtime root whose creator is gone; returns their names.

    Only entries named by this module and owned by this user are considered; anything else
    is left alone. Without `directory`, sweeps every root of `roots()`."""
    if directory is None:
        return [n for d in roots() for n in sweep(d)]
    d = Path(directory)
    try:
        names = os.listdir(d)
    except OSError:
        return []
    uid = os.getuid()
    removed = []
    for name in names:
        who = creator(name)
        if who is None or creator_alive(who[1], who[2]):
            continue
        path = d / name
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid != uid:
            continue
        try:
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("runtime root: could not remove %s left by pid %d: %s", path, who[1], e)
            continue
        removed.append(name)
    if removed:
        log.info("runtime root %s: removed %d entries of processes that are gone", d,
                 len(removed))
    return removed


def count_files(directory: Optional[Path] = None) -> int:
    """Files, sockets and directories under the runtime root (for soak tests)."""
    n = 0
    if directory is None:
        return sum(count_files(d) for d in roots() if d.is_dir())
    d = Path(directory)
    for _, dirs, files in os.walk(d):
        n += len(dirs) + len(files)
    return n
