"""Authentication material: session tokens, the private run directory, CurveZMQ key files.

Local meshes use ipc sockets in a directory only the user can read, plus a random session
token in every message. Anything on TCP uses CurveZMQ with a keypair stored in a file of
mode 0600 (or in MONARCH_KEY_FILE); only peers holding that keypair are accepted.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import sys
from dataclasses import dataclass
from typing import Optional

import zmq

from ..config import config

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


def read_key_file(path: str) -> CurveKeys:
    """Load a key file; refuses one that others can read."""
    st = os.stat(path)
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PermissionError(
            f"key file {path} is readable by others (mode {oct(st.st_mode & 0o777)}); "
            "chmod 600 it"
        )
    with open(path) as f:
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
        return read_key_file(path)
    return None


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m runtime.transport.auth keygen PATH`: write a new cluster key file."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "keygen":
        print("usage: python -m runtime.transport.auth keygen PATH", file=sys.stderr)
        return 2
    write_key_file(argv[1])
    print(f"wrote {argv[1]} (mode 600)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
