"""`gateway=` of the jobs (SLURM, SSH): the job's first agent also runs a gateway
(runtime/transport/gateway.py), and the controller reaches the whole job through it, over
one connection it opens itself (docs/multihost.md, "A notebook outside the cluster")."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse


def gateway_option(gateway: bool | str | None) -> tuple[bool | str, int]:
    """Check a job's `gateway=`: False/None (none), True (the gateway listens on a free port,
    the controller dials the address it publishes) or "tcp://HOST:PORT" (it listens on PORT
    on its node, the controller dials HOST:PORT: the local end of an `ssh -L PORT:NODE:PORT`).
    Returns (the option, the port the gateway listens on)."""
    if gateway is None or gateway is False:
        return False, 0
    if gateway is True:
        return True, 0
    if isinstance(gateway, str):
        u = urlparse(gateway)
        try:
            port = u.port
        except ValueError:
            port = None
        if u.scheme == "tcp" and u.hostname and port:
            return gateway, port
    raise ValueError(f"gateway={gateway!r}: expected True, False or 'tcp://HOST:PORT'")


def gateway_address(gateway: bool | str, addrs: Path, first: tuple[str, int]) -> str | None:
    """What the controller dials: the given address, or the one the first agent published
    in its address file (`gateway=True`); None without a gateway."""
    if not gateway:
        return None
    if isinstance(gateway, str):
        return gateway
    p = addrs / f"{first[0]}.{first[1]}.addr"
    try:
        published = json.loads(p.read_text()).get("gateway", "")
    except (OSError, ValueError):
        published = ""
    if not published:
        from .base import JobError

        raise JobError(f"the job's first agent published no gateway address in {p}")
    return published
