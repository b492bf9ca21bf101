"""Monarch's `run_worker_loop_forever`: serve this host to controllers that attach to it.

It runs the host agent of `python -m runtime.host --listen` in the calling process. Monarch's
`ca="trust_all_connections"` maps to this user's key file (`auth.user_keys`): a controller
attached with `attach_to_workers(..., ca="trust_all_connections")` by the same user (on this
machine, or on a host sharing the home directory) holds the same key; nobody else can talk
to the worker, since a host agent runs whatever code its controller sends.
"""

from __future__ import annotations

from typing import Any, Optional

from ..transport import auth

__all__ = ["worker_key_file", "split_address", "run_worker_loop_forever"]


def worker_key_file(ca: Any, private_key: Any, key_file: Optional[str], who: str) -> str:
    """The key file a worker or an attach uses for Monarch's `ca=`/`private_key=` (or ours)."""
    from ..config import config

    if isinstance(ca, str) and ca == auth.TRUST_ALL and private_key is None:
        if key_file:
            raise ValueError(f"{who}: give key_file= or ca='{auth.TRUST_ALL}' (this user's "
                             f"key, {auth.user_key_path()}), not both")
        return auth.user_keys()[0]
    if ca is not None or private_key is not None:
        raise ValueError(f"{who}(ca=..., private_key=...): TLS certificates are not used "
                         "here; agents and controllers authenticate with a CurveZMQ key file "
                         f"(key_file=, MONARCH_KEY_FILE, or ca='{auth.TRUST_ALL}' for this "
                         "user's own key)")
    path = key_file or config.key_file
    if not path:
        raise PermissionError(f"{who} needs a key: key_file= (or MONARCH_KEY_FILE), or "
                              f"ca='{auth.TRUST_ALL}' for this user's key file "
                              f"({auth.user_key_path()})")
    return str(path)


def split_address(address: str) -> tuple[str, str]:
    """(where to listen, what controllers dial) for Monarch's address forms: a channel URL,
    `dial_to@bind_to` (an alias), or `<proc-id>@<url>`."""
    if "@" in address:
        left, right = address.split("@", 1)
        if "://" in left:
            return right, left
        address = right
    return address, ""


def run_worker_loop_forever(address: str, *, ca: Any = None, private_key: Any = None,
                            key_file: Optional[str] = None) -> None:
    """Serve this host at `address` (`tcp://HOST:PORT`, `tcp://HOST:fdN` for an inherited
    bound socket, `ipc://PATH`, or `dial_to@bind_to`) until the attached controller shuts
    the host mesh down. `ca="trust_all_connections"` uses this user's key file; otherwise
    give key_file= (or MONARCH_KEY_FILE). Call it in a fresh process: it forks the zygote."""
    from . import main

    path = worker_key_file(ca, private_key, key_file, "run_worker_loop_forever")
    listen, dial = split_address(address)
    if not listen.startswith(("tcp://", "ipc://")):
        raise ValueError(f"worker address {address!r}: expected tcp://HOST:PORT, "
                         "tcp://HOST:fdN, ipc://PATH or dial_to@bind_to")
    # refused here, before anything is swept, made, forked or bound
    auth.check_key_file(path, "key file (key_file=)" if key_file else "key file")
    argv = ["--listen", listen, "--key-file", path, "--exit-on-shutdown"]
    main(argv + (["--advertise", dial] if dial else []))
