"""Authentication material: session tokens, the private run directory, CurveZMQ key files.

Local meshes use ipc sockets in a directory only the user can read, plus a random session
token in every message. Anything on TCP uses CurveZMQ with a keypair stored in a key file;
only peers holding that keypair are accepted. Monarch's `ca="trust_all_connections"` uses the
per-user key file (`user_keys`): every process of this user that can read it is trusted,
other users are not.

Every key file is checked the same way wherever it comes from (`--key-file`, `key_file=`,
MONARCH_KEY_FILE, the per-user key): it must be a regular file (not a link) owned by this
user (the effective uid) with no group or other permission bits, in a directory (not a
link) with the same properties; otherwise it is refused with a `PermissionError` that names
the file and the reason (`check_key_file`).
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
import sys
from dataclasses import dataclass
from typing import Optional

import zmq

from ..config import config

__all__ = [
    "TOKEN_BYTES", "new_token", "private_dir", "CurveKeys", "generate_keys", "write_key_file",
    "check_key_dir", "check_key_file", "read_key_file", "cluster_token", "keys_from_env",
    "TRUST_ALL", "user_key_path", "user_keys", "main",
]

TOKEN_BYTES = 16


def new_token() -> bytes:
    return secrets.token_bytes(TOKEN_BYTES)


def private_dir(kind: str = "run") -> str:
    """A fresh directory of mode 0700 for this process's ipc sockets, in the per-user
    runtime root (`runtime.rundir`), named after this process (swept once it is gone)."""
    from .. import rundir

    return rundir.make_dir(kind)


@dataclass(frozen=True)
class CurveKeys:
    """One keypair shared by every member of a cluster: holding it is the credential."""

    public: bytes
    secret: bytes

    def to_json(self) -> str:
        return json.dumps({"public": self.public.decode(), "secret": self.secret.decode()})


def generate_keys() -> CurveKeys:
    pub, sec = zmq.curve_keypair()
    return CurveKeys(pub, sec)


def write_key_file(path: str, keys: Optional[CurveKeys] = None) -> CurveKeys:
    """Write a key file readable only by its owner (mode 0600)."""
    keys = keys or generate_keys()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(keys.to_json())
    os.chmod(path, 0o600)
    return keys


def _check_private(path: str, st: os.stat_result, what: str, kind: int) -> None:
    """Refuse a key file or its directory that is not this user's and private."""
    uid, is_dir = os.geteuid(), kind == stat.S_IFDIR
    if stat.S_IFMT(st.st_mode) != kind:
        raise PermissionError(f"{what} {path} is not a {'directory' if is_dir else 'regular file'}"
                              " (a link or other file): refusing to trust it")
    if st.st_uid != uid:
        raise PermissionError(f"{what} {path} belongs to uid {st.st_uid}, not to this user "
                              f"(uid {uid}): refusing to trust it")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PermissionError(f"{what} {path} has mode {oct(st.st_mode & 0o777)}, so it is "
                              f"readable by others; chmod {'700' if is_dir else '600'} it")


def _key_dir(path: str) -> str:
    return os.path.dirname(os.path.abspath(path))


def check_key_dir(path: str, what: str = "key file") -> None:
    """Refuse (PermissionError) the directory of key file `path` unless it is a directory,
    not a link, owned by this user, with no group or other permission bits."""
    d = _key_dir(path)
    _check_private(d, os.lstat(d), f"the directory of {what} {path},", stat.S_IFDIR)


def _open_key_file(path: str, what: str) -> int:
    """An fd of key file `path`, once it and its directory have passed the checks."""
    check_key_dir(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise PermissionError(f"{what} {path} is not a regular file (a symbolic link): "
                              "refusing to trust it") from None
    try:
        _check_private(path, os.fstat(fd), what, stat.S_IFREG)  # the file that was opened
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_key_file(path: str, what: str = "key file") -> None:
    """Refuse (PermissionError naming `path` and why) a key file that is not a regular
    file owned by this user with no group or other bits, in a directory that is the same."""
    os.close(_open_key_file(os.fspath(path), what))


def read_key_file(path: str, what: str = "key file") -> CurveKeys:
    """Load a key file, after the checks of `check_key_file` (PermissionError if refused)."""
    path = os.fspath(path)
    fd = _open_key_file(path, what)
    with os.fdopen(fd) as f:
        d = json.load(f)
    return CurveKeys(d["public"].encode(), d["secret"].encode())


def cluster_token(keys: CurveKeys) -> bytes:
    """The session token shared by every holder of a cluster key file (computed once per
    key: it is needed for every message to a TCP peer)."""
    tok = _cluster_tokens.get(keys.secret)
    if tok is None:
        import hashlib
        import hmac

        tok = hmac.new(keys.secret, b"monarch-cluster-token", hashlib.sha256).digest()
        tok = _cluster_tokens[keys.secret] = tok[:TOKEN_BYTES]
    return tok


_cluster_tokens: dict[bytes, bytes] = {}


def keys_from_env() -> Optional[CurveKeys]:
    """The keys of the cluster key file named by config.key_file (MONARCH_KEY_FILE), if any."""
    path = config.key_file
    if path:
        return read_key_file(str(path), "key file (MONARCH_KEY_FILE)")
    return None


TRUST_ALL = "trust_all_connections"  # Monarch's `ca=` value: mapped to the user's key


def user_key_path() -> str:
    """Where this user's key file is (config.user_key_file, else the user's cache dir)."""
    if config.user_key_file:
        return os.path.abspath(os.path.expanduser(str(config.user_key_file)))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "monarch", "user.key")


def user_keys() -> tuple[str, CurveKeys]:
    """This user's key file and its keys, made on first use (mode 0600 in a 0700 directory):
    `ca="trust_all_connections"` trusts every process that can read it, so it is refused
    (PermissionError naming the path) unless it and its directory are private to this user."""
    path = user_key_path()
    d = os.path.dirname(path)
    os.makedirs(d, mode=0o700, exist_ok=True)
    _check_private(d, os.lstat(d), "the user key directory", stat.S_IFDIR)
    if not os.path.lexists(path):
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            write_key_file(tmp)
            try:
                os.link(tmp, path)  # atomic: concurrent first users agree on one key
            except FileExistsError:
                pass
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return path, read_key_file(path, "the user key file")


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m runtime.transport.auth keygen PATH`: write a new cluster key file (its
    directory is made 0700 if missing; a directory others can reach is refused)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "keygen":
        print("usage: python -m runtime.transport.auth keygen PATH", file=sys.stderr)
        return 2
    path = argv[1]
    try:
        os.makedirs(_key_dir(path), mode=0o700, exist_ok=True)
        check_key_dir(path)
        write_key_file(path)
        check_key_file(path)
    except PermissionError as e:
        print(f"keygen: {e}", file=sys.stderr)
        return 1
    print(f"wrote {path} (mode 600)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
