"""The per-user runtime root: every file and directory the runtime creates lives here.

Each entry is named `<kind>-<pid>-<start>_<rest>`: the kind (run, agent, rdma, job,
collectives, admin), the pid of the process that created it and that process's start time
(clock ticks since boot), for people and tools to read. Whether an entry is still in use is
decided by a lock, not by its name: its creator takes an exclusive `flock` on it before
anything else is made (on the file `.lock` inside a directory, or on the file itself) and
holds it for its whole life; the kernel drops the lock when the last descriptor of it is
closed, so when the creator exits, is killed or is a zombie. `sweep()`, run when a
controller, a host agent or `monarch-admin` starts, removes an entry only when it can take
that lock. A lock is the same in every pid namespace sharing the directory, and a pid
reused by another process changes nothing.

The descriptor of a lock is close-on-exec, and a child forked without exec (the host
agent's zygote and its procs, `multiprocessing` workers) closes its copy at once
(`os.register_at_fork`): an entry lives exactly as long as the process that made it, not as
long as its orphans. The runtime's processes die with their owner, and a proc bound in a
dead controller's directory is unreachable anyway.

Entries of the older layout, `<kind>-<pid>-<start>-<rest>` (with a `-` where the new one has
`_`), keep the old rule: they are removed when that pid is not running or runs with another
start time. Never by name alone, never another user's.

The root is `MONARCH_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/monarch`, else
`<tmp>/monarch-<uid>`; it is created with mode 0700 and must be a directory (not a link)
owned by this user. Directories of ipc sockets go to `<tmp>/monarch-<uid>` instead when
the root's path is over 40 bytes (socket names are limited to 107); both are swept.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
from pathlib import Path
from typing import Optional, Union

from .config import config

__all__ = [
    "MAX_ROOT_LEN", "LOCK", "PathLike", "RuntimeRootError", "default_root", "short_root", "root",
    "socket_root", "roots", "process_start_time", "tag", "held", "make_dir", "remove_dir",
    "write_file", "remove_file", "creator", "creator_alive", "alive", "sweep", "count_files",
]

log = logging.getLogger("runtime")

# ipc socket paths are at most 107 bytes: a run directory's name takes about 32, which
# leaves a root of 40 bytes room for proc ids of 33 (the default ones take about 24)
MAX_ROOT_LEN = 40
LOCK = ".lock"  # inside a directory entry: the file its creator holds locked
_LOCKED = re.compile(r"^\.?([a-z]+)-(\d+)-(\d+)_")  # this layout: liveness by lock
_BY_PID = re.compile(r"^\.?([a-z]+)-(\d+)-(\d+)[-.]")  # the older layout: by pid
_TRASH = re.compile(r"^\.gone-[0-9a-f]{16}$")  # a swept directory being removed
_OPEN_FLAGS = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
_ATTEMPTS = 100

PathLike = Union[str, "os.PathLike[str]"]


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


# -- the locks this process holds: entry path -> descriptor of its locked file -------------
_held: dict[str, int] = {}
_held_mu = threading.Lock()


def _after_fork_in_child() -> None:
    """A child forked without exec does not own its parent's entries: close its copies of
    the locks (the parent's own descriptors keep them held for as long as it lives)."""
    global _held_mu
    _held_mu = threading.Lock()  # another thread may have held it at the fork
    for fd in list(_held.values()):
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _hold(path: str, fd: int) -> None:
    with _held_mu:
        old = _held.pop(path, None)
        _held[path] = fd
    if old is not None and old != fd:
        os.close(old)


def _release(path: str) -> None:
    with _held_mu:
        fd = _held.pop(str(path), None)
    if fd is not None:
        os.close(fd)


def _prune() -> None:
    """Close the locks of entries removed without `remove_dir`/`remove_file` (their locked
    file has no name left): a process that makes and drops entries all day keeps no fds."""
    with _held_mu:
        gone = []
        for path, fd in _held.items():
            try:
                if os.fstat(fd).st_nlink == 0:
                    gone.append(path)
            except OSError:
                gone.append(path)
        fds = [_held.pop(p) for p in gone]
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def held() -> list[str]:
    """The entries this process holds the lock of (made by `make_dir`/`write_file`)."""
    _prune()
    with _held_mu:
        return sorted(_held)


def _take(path: str, create: bool) -> Optional[int]:
    """A descriptor holding the exclusive lock of the regular file `path` (created 0600 if
    `create`), or None when it is held by someone else, is gone, or was replaced meanwhile."""
    try:
        fd = os.open(path, _OPEN_FLAGS | (os.O_CREAT if create else 0), 0o600)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        st, now = os.fstat(fd), os.lstat(path)
    except (BlockingIOError, FileNotFoundError):
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    if ((st.st_dev, st.st_ino) != (now.st_dev, now.st_ino) or not stat.S_ISREG(st.st_mode)
            or st.st_uid != os.getuid()):
        os.close(fd)  # removed and made again between our open and our lock
        return None
    return fd


def _probe(path: str) -> Optional[bool]:
    """True if someone holds the lock of the file `path`, False if not, None if it is gone."""
    fd = _take(path, create=False)
    if fd is not None:
        os.close(fd)
        return False
    return True if os.path.lexists(path) else None


# -- entries: made, removed, judged -----------------------------------------------------
def make_dir(kind: str) -> str:
    """A new 0700 directory `<socket root>/<kind>-<pid>-<start>_<random>` for this
    process's ipc sockets, owned through the lock of its `.lock` file, which this process
    holds until `remove_dir` or its exit."""
    parent = socket_root()
    _prune()
    for _ in range(_ATTEMPTS):
        d = tempfile.mkdtemp(prefix=f"{kind}-{tag()}_", dir=parent)  # mode 0700
        fd = _take(os.path.join(d, LOCK), create=True)
        if fd is not None:
            _hold(d, fd)
            return d
        # a sweep took the lock in the instant before us, and removes that directory
    raise OSError(errno.EAGAIN, f"could not lock a new directory in {parent}")


def remove_dir(path: PathLike) -> None:
    """Remove a directory made by `make_dir` in this process (what can be), then release
    its lock."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    finally:
        _release(str(path))


def write_file(directory: PathLike, name: str, data: bytes) -> Path:
    """Write `data` atomically to the new file `<directory>/<name>` (mode 0600; `name` is
    `<kind>-<pid>-<start>_<rest>`), owned through its own lock, which this process holds
    until `remove_file` or its exit."""
    if not _LOCKED.match(name):
        raise ValueError(f"{name!r} is not named <kind>-<pid>-<start>_<rest>")
    d = Path(directory)
    path = d / name
    kind = name.split("-", 1)[0]
    _prune()
    for _ in range(_ATTEMPTS):
        fd, tmp = tempfile.mkstemp(prefix=f".{kind}-{tag()}_", dir=d)  # 0600, O_EXCL
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            now = os.lstat(tmp)
        except (BlockingIOError, FileNotFoundError):
            os.close(fd)  # a sweep took it first, and removes it
            continue
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (now.st_dev, now.st_ino):
            os.close(fd)
            continue
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, 0o600)
            os.replace(tmp, path)  # the lock moves with the file
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            os.close(fd)
            raise
        _hold(str(path), fd)
        return path
    raise OSError(errno.EAGAIN, f"could not lock a new file in {d}")


def remove_file(path: PathLike) -> None:
    """Remove a file made by `write_file` in this process, then release its lock."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    finally:
        _release(str(path))


def creator(name: str) -> Optional[tuple[str, int, int]]:
    """(kind, pid, start) of an entry name made by this module (either layout), else None."""
    m = _LOCKED.match(name) or _BY_PID.match(name)
    if m is None:
        return None
    return m.group(1), int(m.group(2)), int(m.group(3))


def creator_alive(pid: int, start: int) -> bool:
    """True if `pid` runs and started at `start` (the older layout's rule)."""
    now = process_start_time(pid)
    if now is None:
        return False
    return start == 0 or now == start


def alive(path: PathLike) -> bool:
    """Whether the entry at `path` is still owned: its lock is held (or, for the older
    layout, its creator's pid runs with the same start time). False for other names."""
    p = Path(path)
    if _LOCKED.match(p.name):
        if os.path.isdir(p) and not os.path.islink(p):
            held_now = _probe(str(p / LOCK))
            return held_now is not False and os.path.isdir(p)  # no .lock yet: being made
        return bool(_probe(str(p)))
    who = creator(p.name)
    return who is not None and creator_alive(who[1], who[2])


def _sweep_locked(path: Path, st: os.stat_result) -> bool:
    """Remove one entry of this layout if its lock can be taken; True if removed."""
    if stat.S_ISDIR(st.st_mode):
        # create the lock file if it is missing: a creator that died (or is) between
        # making the directory and locking it then finds it taken and makes another
        fd = _take(str(path / LOCK), create=True)
        if fd is None:
            return False
        trash = path.parent / f".gone-{secrets.token_hex(8)}"
        try:
            os.rename(path, trash)  # atomic: nobody opens its .lock by name again
        finally:
            os.close(fd)
        shutil.rmtree(trash, ignore_errors=True)
        return True
    if not stat.S_ISREG(st.st_mode):
        return False
    fd = _take(str(path), create=False)
    if fd is None:
        return False
    try:
        os.unlink(path)
    finally:
        os.close(fd)
    return True


def _sweep_by_pid(path: Path, st: os.stat_result) -> bool:
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)
    return True


def sweep(directory: Optional[Path] = None) -> list[str]:
    """Remove the entries of the runtime root whose owner is gone; returns their names.

    Entries of this layout go when their lock can be taken; entries of the older layout
    when their creator's pid is gone or reused. Only entries named by this module and
    owned by this user are considered; anything else is left alone. Without `directory`,
    sweeps every root of `roots()`."""
    if directory is None:
        return [n for d in roots() for n in sweep(d)]
    d = Path(directory)
    try:
        names = os.listdir(d)
    except OSError:
        return []
    _prune()
    uid = os.getuid()
    removed = []
    for name in names:
        locked = _LOCKED.match(name) is not None
        trash = _TRASH.match(name) is not None
        if not locked and not trash:
            who = _BY_PID.match(name)
            if who is None or creator_alive(int(who.group(2)), int(who.group(3))):
                continue
        path = d / name
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid != uid:
            continue
        try:
            if trash:  # left by a sweep that was interrupted: nobody owns it
                shutil.rmtree(path, ignore_errors=True)
                continue
            if not (_sweep_locked(path, st) if locked else _sweep_by_pid(path, st)):
                continue
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("runtime root: could not remove %s: %s", path, e)
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
