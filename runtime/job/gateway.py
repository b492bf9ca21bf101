"""`gateway=` of the jobs (SLURM, SSH): the job's first agent also runs a gateway
(runtime/transport/gateway.py), and the controller reaches the whole job through it, over
one connection it opens itself (docs/multihost.md, "A notebook outside the cluster")."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

__all__ = ["gateway_option", "gateway_address", "SSHTunnel"]


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


class SSHTunnel:
    """`ssh -N -L 127.0.0.1:LOCAL:GWHOST:GWPORT host`: this machine's end of the one
    connection to a job's gateway (SSHJob(gateway=True)); `address` is what to dial."""

    def __init__(self, host: str, gateway: str, ssh: tuple = ("ssh",),
                 options: tuple = ()) -> None:
        import socket
        import subprocess

        u = urlparse(gateway)
        if u.scheme != "tcp" or not u.hostname or not u.port:
            raise ValueError(f"gateway address {gateway!r} is not tcp://HOST:PORT")
        with socket.socket() as s:  # a free local port (ssh binds it right after)
            s.bind(("127.0.0.1", 0))
            local = s.getsockname()[1]
        opts = [o for o in options if o != "-T"]
        self.argv = [*ssh, *opts, "-N", "-o", "ExitOnForwardFailure=yes",
                     "-L", f"127.0.0.1:{local}:{u.hostname}:{u.port}", host]
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # zmq dials this address until ssh listens there: attaching waits for the tunnel
        # (a probe connection would reach the gateway as a client without the key)
        self.address = f"tcp://127.0.0.1:{local}"

    def close(self) -> None:
        """End the tunnel (by its pid) and reap it."""
        import subprocess

        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
