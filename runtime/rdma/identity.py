"""Who this process is, as seen by the data plane: host id, pid start time, session secret."""

from __future__ import annotations

import functools
import os
import secrets
import socket
from typing import Optional

from ..config import config

__all__ = ["host_id", "process_start_time", "process_alive", "session_secret"]

@functools.lru_cache(maxsize=1)
def host_id() -> str:
    """Hostname + boot id + pid namespace: equal only when pids mean the same process."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "noboot"
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = "nopidns"
    return f"{socket.gethostname()}/{boot}/{pidns}"


def process_start_time(pid: int) -> Optional[int]:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = data[data.rindex(b")") + 2 :].split()
    return int(rest[19])


def process_alive(pid: int, start_time: Optional[int]) -> bool:
    """True if `pid` runs and is the same process (same start time) as when recorded."""
    now = process_start_time(pid)
    if now is None:
        return False
    if start_time is not None and now != start_time:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except OSError:
        return False


_process_secret: Optional[bytes] = None


def session_secret() -> tuple[bytes, bool]:
    """The data-plane secret and whether it comes from the environment (shared by the session).

    MONARCH_SESSION_TOKEN (hex) when set; else a random per-process secret that
    travels inside each handle."""
    global _process_secret
    env = config.rdma_session_token
    if env:
        try:
            return bytes.fromhex(env), True
        except ValueError:
            raise ValueError(f"MONARCH_SESSION_TOKEN must be hex, got {env[:8]!r}...") from None
    if _process_secret is None:
        _process_secret = secrets.token_bytes(32)
    return _process_secret, False


def _reset_after_fork() -> None:
    global _process_secret
    _process_secret = None
    host_id.cache_clear()


os.register_at_fork(after_in_child=_reset_after_fork)
