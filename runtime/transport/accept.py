"""Accept loops that survive resource exhaustion, with bounded unauthenticated connections.

`AcceptGuard` is what a plain-socket server (the RDMA data server) runs its accept loop
with: `accept()` returns the next connection, or None when the server closed. Errors such
as EMFILE/ENFILE (no descriptors left), ENOBUFS/ENOMEM or ECONNABORTED never end the loop:
it backs off (10 ms doubling to 0.5 s), logs once per episode, and accepts again when
descriptors free up. Connections that have not authenticated yet are bounded in number
(the oldest is shut down to make room for a new one) and in time (shut down after
`handshake_timeout`), so one local user cannot hold them all.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from typing import Optional

__all__ = ["AcceptGuard"]

log = logging.getLogger("runtime.transport")

_QUIET_ERRORS = {errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN}


class AcceptGuard:
    """Accepts from one listening socket, surviving errors; tracks pending handshakes."""

    def __init__(self, lsock: socket.socket, name: str, max_pending: int,
                 handshake_timeout: float) -> None:
        self.lsock = lsock
        self.name = name
        self.max_pending = max(1, max_pending)
        self.handshake_timeout = handshake_timeout
        self.closed = False
        self.episodes = 0  # resource-exhaustion episodes seen (tests read it)
        self.evicted = 0  # pending connections shut down (full, or too slow)
        self._pending: dict[socket.socket, float] = {}  # insertion order = age
        self._lock = threading.Lock()
        self._failing_since: Optional[float] = None
        lsock.settimeout(0.25)  # wake up to reap slow handshakes

    def accept(self) -> Optional[tuple[socket.socket, object]]:
        """The next connection (registered as pending), or None once the server closed."""
        delay = 0.01
        while not self.closed:
            self._reap()
            try:
                conn, peer = self.lsock.accept()
            except socket.timeout:
                continue
            except OSError as e:
                if self.closed or e.errno in (errno.EBADF, errno.EINVAL, errno.ENOTSOCK):
                    return None
                if e.errno not in _QUIET_ERRORS:
                    if self._failing_since is None:
                        self._failing_since = time.monotonic()
                        self.episodes += 1
                        log.warning("%s: accept failed (%s); backing off until it works "
                                    "again", self.name, e)
                    self._shed_oldest()  # a stuck handshake gives its descriptor back
                time.sleep(delay)
                delay = min(0.5, delay * 2)
                continue
            if self._failing_since is not None:
                log.warning("%s: accepting again after %.1f s", self.name,
                            time.monotonic() - self._failing_since)
                self._failing_since = None
            delay = 0.01
            conn.settimeout(None)
            self._add_pending(conn)
            return conn, peer
        return None

    def authenticated(self, conn: socket.socket) -> bool:
        """The connection passed its handshake: no longer bounded. False if it was shut down
        meanwhile (evicted)."""
        with self._lock:
            return self._pending.pop(conn, None) is not None

    def done(self, conn: socket.socket) -> None:
        """The connection ended before authenticating."""
        with self._lock:
            self._pending.pop(conn, None)

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def close(self) -> None:
        self.closed = True
        with self._lock:
            for c in self._pending:
                _shutdown(c)
            self._pending = {}

    def _add_pending(self, conn: socket.socket) -> None:
        with self._lock:
            self._pending[conn] = time.monotonic()
            while len(self._pending) > self.max_pending:
                old = next(iter(self._pending))
                del self._pending[old]
                self.evicted += 1
                _shutdown(old)

    def _shed_oldest(self) -> None:
        with self._lock:
            if self._pending:
                old = next(iter(self._pending))
                del self._pending[old]
                self.evicted += 1
                _shutdown(old)

    def _reap(self) -> None:
        limit = time.monotonic() - self.handshake_timeout
        with self._lock:  # under the lock: a served connection is closed only after done()
            slow = [c for c, t in self._pending.items() if t < limit]
            for c in slow:
                del self._pending[c]
                self.evicted += 1
                _shutdown(c)


def _shutdown(conn: socket.socket) -> None:
    """Make the thread serving `conn` see EOF (it closes the socket itself)."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
