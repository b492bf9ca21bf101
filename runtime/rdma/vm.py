"""Same-host copies between processes with process_vm_readv / process_vm_writev (one copy, no socket)."""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Optional

__all__ = ["VMError", "available", "copy", "ptrace_scope"]

_libc = ctypes.CDLL(None, use_errno=True)


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_SIG = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.POINTER(_IOVec),
        ctypes.c_ulong, ctypes.c_ulong]
_readv = getattr(_libc, "process_vm_readv", None)
_writev = getattr(_libc, "process_vm_writev", None)
for _f in (_readv, _writev):
    if _f is not None:
        _f.argtypes = _SIG
        _f.restype = ctypes.c_ssize_t


class VMError(OSError):
    """process_vm_readv/writev failed; `errno` says why (EPERM: not allowed, ESRCH: no such pid)."""


def available() -> bool:
    """True if libc exposes the calls (the kernel may still refuse them: see `probe`)."""
    return _readv is not None and _writev is not None


def copy(pid: int, local_addr: int, remote_addr: int, nbytes: int, *, write: bool) -> None:
    """Copy nbytes between our memory and process `pid`'s; loops over partial transfers.

    Raises VMError. The GIL is released during each call (ctypes), so threads run in parallel."""
    fn = _writev if write else _readv
    if fn is None:
        raise VMError(errno.ENOSYS, "process_vm_readv/writev not available in libc")
    local = _IOVec()
    remote = _IOVec()
    done = 0
    while done < nbytes:
        local.iov_base = local_addr + done
        local.iov_len = nbytes - done
        remote.iov_base = remote_addr + done
        remote.iov_len = nbytes - done
        n = fn(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if n < 0:
            err = ctypes.get_errno()
            raise VMError(err, f"process_vm_{'writev' if write else 'readv'}(pid {pid}): {os.strerror(err)}")
        if n == 0:
            raise VMError(errno.EFAULT, f"process_vm copy with pid {pid} made no progress at byte {done}")
        done += n


def ptrace_scope() -> Optional[int]:
    """Yama's ptrace_scope (0..3), or None when Yama is absent (then only uid/caps matter)."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None
