"""Listening sockets: the checks and CurveZMQ set-up shared by a loop's inbox and its extra
listeners. Nothing listens off loopback without CurveZMQ keys; a CurveZMQ peer whose key is
not one of ours is refused (zmq's authenticator runs on its own thread, which owns the ZAP
socket) and logged."""

from __future__ import annotations

import base64
import ipaddress
import logging
from typing import Any, Optional
from urllib.parse import urlparse

import zmq

from .auth import CurveKeys

__all__ = ["HANDSHAKE_MS", "is_loopback_address", "Listener"]

HANDSHAKE_MS = 5000  # unauthenticated peers are bounded in time (zmq drops them)

log = logging.getLogger("runtime.transport")


def is_loopback_address(addr: str) -> bool:
    """True for ipc:// and inproc:// addresses and TCP on a loopback interface."""
    if addr.startswith(("ipc://", "inproc://")):
        return True
    host = urlparse(addr).hostname or ""
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _adopt_fd(sock: zmq.Socket, addr: str) -> str:
    """`tcp://HOST:fdN` (Monarch's form): listen on the inherited bound socket N; returns
    the address zmq binds (its real port)."""
    import re
    import socket

    m = re.fullmatch(r"tcp://(.+):fd(\d+)", addr)
    if m is None:
        return addr
    fd = int(m.group(2))
    s = socket.socket(fileno=fd)
    try:
        host, port = s.getsockname()[:2]
        s.listen(128)
    finally:
        s.detach()  # zmq owns the descriptor now
    sock.setsockopt(zmq.USE_FD, fd)
    return f"tcp://{m.group(1)}:{port}"


class Listener:
    """Prepares PULL sockets to listen, and authenticates CurveZMQ peers."""

    def __init__(self, ctx: zmq.Context, max_message_bytes: int = 0) -> None:
        self.ctx = ctx
        self.max_message_bytes = max_message_bytes
        self.allowed_keys: set[bytes] = set()  # CurveZMQ client keys accepted (z85)
        self._auth: Any = None

    def bind(self, sock: zmq.Socket, addr: str, keys: Optional[CurveKeys]) -> str:
        """Bind `sock` to `addr` (CurveZMQ server with `keys` for TCP); returns the address
        with an ephemeral port filled in. Raises PermissionError off loopback without keys."""
        if addr.startswith("tcp://"):
            if keys is not None:
                self.allowed_keys.add(keys.public)
                self._start_auth()
                sock.curve_server = True
                sock.curve_secretkey = keys.secret
                sock.curve_publickey = keys.public
            elif not is_loopback_address(addr):
                raise PermissionError(
                    f"refusing to listen on non-loopback {addr} without CurveZMQ keys "
                    "(give a key file: python -m runtime.transport.auth keygen PATH)")
        if self.max_message_bytes:
            sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes + (1 << 20))
        # a peer that does not finish the (CurveZMQ) handshake within 5 s is disconnected
        sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
        addr = _adopt_fd(sock, addr)
        sock.bind(addr)
        return sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def _start_auth(self) -> None:
        if self._auth is not None:
            return
        from zmq.auth.thread import ThreadAuthenticator

        allowed = self.allowed_keys

        class _Keys:
            def callback(self, domain: str, key: bytes) -> bool:
                import zmq.utils.z85 as z85

                ok = (z85.encode(key) if len(key) == 32 else key) in allowed
                if not ok:
                    log.warning("rejected a CurveZMQ peer with an unknown key %r",
                                base64.b16encode(key[:8]))
                return ok

        self._auth = ThreadAuthenticator(self.ctx, log=logging.getLogger("runtime.auth"))
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=_Keys())

    def close(self) -> None:
        if self._auth is not None:
            try:
                self._auth.stop()
            except Exception:
                pass
