"""Connections between the processes of one host: one AF_UNIX stream per sender and peer.

Everything one process sends another on this host goes on one connection that the sender
dialed (`Outbound`), in the order its threads called `send`, whole messages, large bodies
included: the kernel keeps that order, keeps what a dead sender wrote, and ends the stream
with EOF after it. The receiving process reads each connection it accepted (`Inbound`) on
its I/O thread only. docs/transport.md states the rules and draws the states.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, Protocol

from ..config import config
from . import framing

__all__ = [
    "CONNECT_RETRY_S", "CONNECT_RETRY_MAX_S", "READS_PER_EVENT", "SNDBUF", "SendFailed",
    "ConnectionEvents", "LoopCounters", "ConnectionLoop", "path_of", "listen",
    "OutboundState", "Pending", "Outbound", "Inbound",
]

log = logging.getLogger("runtime.transport")

#: the first retry of a connect to a socket not listening yet (a proc starting), doubling
#: up to CONNECT_RETRY_MAX_S while the peer has not bound; the peer's death ends it, or
#: `connect_timeout` (a setting) without a listener
CONNECT_RETRY_S = 0.002
CONNECT_RETRY_MAX_S = 0.05
_IOV = framing.IOV_MAX
#: reads of one connection per readiness event before other connections get a turn
READS_PER_EVENT = 16
SNDBUF = 4 << 20  # fewer wake-ups for large messages (the kernel caps it at wmem_max)
_RETRY = (errno.ENOENT, errno.ECONNREFUSED, errno.EAGAIN)
#: errors that say the peer is gone (closed its end, exited), not a fault of this side
_GONE = (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ENOENT, errno.ECONNREFUSED)
_IN, _OUT = 1, 2  # zmq.POLLIN, zmq.POLLOUT (the loop polls with zmq.Poller)

#: fn(address, ports, error text, gone): a send failed; the calls on `ports` must fail (I/O
#: thread). `gone`: the peer closed its end or no longer listens (it exited or is exiting)
SendFailed = Callable[[str, list, str, bool], None]


class ConnectionEvents(Protocol):
    """What a connection tells the table of its process's connections (`peers.Peers`), on
    the I/O thread: a send failed, an outgoing connection broke, an incoming one named its
    sender or ended."""

    def send_failed(self, addr: str, ports: list, error: str, gone: bool = False) -> None: ...

    def dropped(self, peer: Any) -> None: ...

    def identified(self, inbound: "Inbound") -> None: ...

    def closed(self, inbound: "Inbound") -> None: ...


class LoopCounters(Protocol):
    """The loop's counter a connection adds to: messages dropped."""

    dropped: int


class ConnectionLoop(Protocol):
    """What a connection calls on the I/O loop it runs on (`loop.IOLoop`): run a call on
    the I/O thread (now, later), watch its socket, hand a message received to the process,
    and the process's name, session tokens, connections table and counters."""

    @property
    def name(self) -> str: ...

    @property
    def tokens(self) -> list[bytes]: ...

    @property
    def thread_id(self) -> Optional[int]: ...

    @property
    def peers(self) -> ConnectionEvents: ...

    @property
    def stats(self) -> LoopCounters: ...

    def schedule(self, fn: Callable, *args: Any) -> None: ...

    def call_later(self, delay: float, fn: Callable, *args: Any) -> None: ...

    def watch(self, fd: int, events: int, fn: Callable[[int], None]) -> None: ...

    def unwatch(self, fd: int) -> None: ...

    def dispatch(self, frames: list) -> None: ...


def path_of(addr: str) -> str:
    """The socket file of an `ipc://PATH` address."""
    return addr[6:]


def listen(addr: str) -> socket.socket:
    """A listening AF_UNIX stream socket at an `ipc://PATH` address, file mode 0600."""
    path = path_of(addr)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK |
                      socket.SOCK_CLOEXEC)
    try:
        s.bind(path)
        os.chmod(path, 0o600)
        s.listen(socket.SOMAXCONN)
    except BaseException:
        s.close()
        raise
    return s


#: an outbound connection's states, in order (docs/transport.md): connecting (dialing, its
#: messages queued) -> open -> broken (final: what was not written fails its calls)
OutboundState = Literal["connecting", "open", "broken"]


@dataclass(slots=True)
class Pending:
    """A message of an `Outbound` that the kernel has not taken whole yet (under the
    connection's lock): what is left of its buffers, the reply port of the call it carries
    (0: none), and its bytes left. Written, `bufs` is emptied: its sender may go on."""

    bufs: list
    port: int
    left: int


class Outbound:
    """The connection this process dialed to one peer (any thread sends; whole messages in
    call order). States: connecting -> open -> broken (docs/transport.md). A message the
    kernel does not take at once waits in `queue`, written by the I/O thread when the
    socket is writable (the I/O thread never waits). A broken connection fails the calls
    of every message it had not written, and of every later one."""

    def __init__(self, loop: ConnectionLoop, addr: str, hello: list,
                 wait_for_listener: bool = True) -> None:
        self.loop = loop
        self.addr = addr
        #: a first dial waits for the peer to listen (it is starting); a dial after a
        #: broken connection does not (nobody listening: the peer is gone)
        self.wait_for_listener = wait_for_listener
        self.opened = False
        self.lock = threading.Lock()
        self.written = threading.Condition(self.lock)  # notified as the queue drains
        self.queue: collections.deque[Pending] = collections.deque()
        self.state: OutboundState = "connecting"
        self.error = ""
        self.gone = False  # broken because the peer went away (not an error of ours)
        self.sender: Optional[int] = None  # the thread inside send (a finalizer re-enters)
        self.watching = 0  # the events the I/O thread polls for
        self.retry = CONNECT_RETRY_S
        self.hello: Optional[Pending] = None  # the preamble while it waits for the connect
        self.sent = 0
        self.give_up_at = time.monotonic() + config.connect_timeout  # while connecting
        # set before the first connect: one that fails at once (a dead peer's path) reports
        # on the I/O thread, which may read it before _connect returns
        self.sock: Optional[socket.socket] = None
        self.sock = self._connect()
        if self.sock is not None:
            self.state, self.opened = "open", True
            self._write_now(hello, 0, sum(framing.nbytes(b) for b in hello))
        else:
            self.hello = Pending(hello, 0, sum(framing.nbytes(b) for b in hello))
            self.queue.append(self.hello)
        loop.schedule(self._watch)

    def send(self, frames: list, port: int = 0) -> None:
        """Send one message (any thread); `port`: the reply port of the call it carries.

        On an open connection a thread other than the I/O thread returns once the kernel
        holds the whole message, so it arrives even if this process dies right after (a
        proc killed after answering): a message the kernel does not take at once is
        written by the I/O thread while the sender waits. The I/O thread never waits."""
        me = threading.get_ident()
        if self.sender == me:  # a finalizer inside this thread's send
            self.loop.schedule(self.send, frames, port)
            return
        bufs, size = framing.stream_parts(frames)
        failed = ""
        item: Optional[Pending] = None
        with self.lock:
            self.sender = me
            self.sent += 1
            try:
                if self.state == "broken":
                    failed = self.error
                elif self.queue or self.state != "open":
                    item = Pending(bufs, port, size)
                    self.queue.append(item)
                else:
                    failed, item = self._write_now(bufs, port, size)
                if item is not None and self.state == "open" and me != self.loop.thread_id:
                    while item.bufs and self.state == "open":  # written: emptied by flush
                        self.written.wait()  # (broken: _report fails its port)
            finally:
                self.sender = None
        if failed and port:
            self.loop.schedule(self.loop.peers.send_failed, self.addr, [port], failed,
                               self.gone)

    def _write_now(self, bufs: list, port: int, size: int) -> tuple[str, Optional[Pending]]:
        """Write a message to the empty queue's socket (lock held); what the kernel did not
        take is queued for the I/O thread: (error text if the connection broke, the queued
        item or None)."""
        sock = self.sock
        assert sock is not None  # open: connected
        try:
            n = sock.sendmsg(bufs if len(bufs) <= _IOV else bufs[:_IOV])
        except BlockingIOError:
            n = 0
        except OSError as e:
            return self._break(f"send to {self.addr} failed: {e}", e.errno in _GONE), None
        if n < size:
            item = Pending(framing.advance(bufs, n), port, size - n)
            self.queue.append(item)
            self.loop.schedule(self._watch)
            return "", item
        return "", None

    # -- the I/O thread ------------------------------------------------------------------
    def _watch(self) -> None:
        """Poll for what this connection waits for: writable while messages wait, EOF."""
        if self.state == "broken":
            return
        if self.sock is None:
            self._connect_later()
            return
        want = _IN | (_OUT if self.queue else 0)
        if want != self.watching:
            self.watching = want
            self.loop.watch(self.sock.fileno(), want, self._ready)

    def _connect(self) -> Optional[socket.socket]:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK |
                          socket.SOCK_CLOEXEC)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
            s.connect(path_of(self.addr))
            return s
        except OSError as e:
            s.close()
            if e.errno not in _RETRY or not self.wait_for_listener:
                self._break(f"connect to {self.addr} failed: {e}", e.errno in _GONE)
            return None

    def _connect_later(self) -> None:
        def again() -> None:
            if self.state != "connecting":
                return
            s = self._connect()
            if s is None:
                if self.state == "connecting":
                    if time.monotonic() > self.give_up_at:  # nobody will listen there
                        self._break(f"nothing listens at {self.addr} (tried for "
                                    f"{config.connect_timeout:g} s: connect_timeout)")
                        return
                    self.retry = min(self.retry * 2, CONNECT_RETRY_MAX_S)
                    self.loop.call_later(self.retry, again)
                return
            with self.lock:
                self.sock, self.state, self.opened = s, "open", True
            self._watch()

        self.loop.call_later(self.retry, again)

    def _ready(self, events: int) -> None:
        sock = self.sock
        assert sock is not None  # watched only once connected
        if events & ~_OUT:  # readable: the peer closed (it never writes here), or an error
            try:
                data = sock.recv(1 << 16)
            except BlockingIOError:
                data = b"?"
            except OSError as e:
                data, reason = b"", f"{e}"
            else:
                reason = "it closed the connection"
            if not data:
                self._break(f"{self.addr}: {reason}", True)
                return
        if events & _OUT:
            self.flush()

    def flush(self) -> None:
        """Write what waits, as far as the socket takes it (I/O thread)."""
        with self.lock:
            queue = self.queue
            while queue and self.state == "open":
                bufs: list = []
                for item in queue:
                    if len(bufs) + len(item.bufs) > _IOV and bufs:
                        break
                    bufs += item.bufs
                assert self.sock is not None  # open: connected
                try:
                    n = self.sock.sendmsg(bufs if len(bufs) <= _IOV else bufs[:_IOV])
                except BlockingIOError:
                    break
                except OSError as e:
                    self._break(f"send to {self.addr} failed: {e}", e.errno in _GONE)
                    break
                while queue and n:
                    item = queue[0]
                    if n < item.left:
                        item.bufs = framing.advance(item.bufs, n)
                        item.left -= n
                        break
                    n -= item.left
                    queue.popleft().bufs = []  # written: its sender may go on
                self.written.notify_all()
            failed = self.error if self.state == "broken" else ""
        if failed:
            self._report()
        else:
            self._watch()

    def _break(self, why: str, gone: bool = False) -> str:
        """The connection is broken for good; the calls not written fail (lock held or
        not: the state only ever moves forward)."""
        if self.state != "broken":
            self.state, self.error, self.gone = "broken", why, gone
            self.loop.schedule(self._report)
        return why

    def _report(self) -> None:
        """Fail the calls whose messages were not written; stop watching (I/O thread)."""
        with self.lock:
            items, self.queue = list(self.queue), collections.deque()
            self.written.notify_all()
        ports = [it.port for it in items if it.port]
        if [it for it in items if it is not self.hello]:
            log.warning("%s: %d message(s) to %s not sent: %s", self.loop.name, len(items),
                        self.addr, self.error)
        if ports:
            self.loop.peers.send_failed(self.addr, ports, self.error, self.gone)
        if self.sock is not None:
            if self.watching:
                self.loop.unwatch(self.sock.fileno())
                self.watching = 0
            with self.lock:  # broken: no sender writes to it any more
                self.sock.close()  # now, not when the garbage collector gets to it
        self.loop.peers.dropped(self)  # the next send to this address dials anew

    def close(self, why: str = "", gone: bool = True) -> None:
        """Close for good (I/O thread): what waits is dropped and its calls fail."""
        with self.lock:  # no sender is inside sendmsg once we hold it
            self._break(why or f"{self.addr} is closed", gone)
            sock = self.sock
        self._report()
        if sock is not None:
            sock.close()

    def finish(self, timeout: float = 2.0) -> None:
        """The loop stops (I/O thread): what waits gets up to `timeout` to be written."""
        with self.lock:
            if self.state == "open" and self.queue and self.sock is not None:
                self.sock.settimeout(timeout)
                try:
                    for item in self.queue:
                        for b in item.bufs:
                            self.sock.sendall(b)
                    self.queue.clear()
                except OSError as e:
                    self.error = f"{self.addr}: not all sent before this process stopped: {e}"
        self.close("this process's runtime stopped", gone=False)

    def pending(self) -> int:
        """Messages waiting to be written."""
        return len(self.queue)


class Inbound:
    """A connection a peer dialed to this process (I/O thread only): read, cut into
    messages, handed on in order. Its first message names the sender (`peer`)."""

    def __init__(self, loop: ConnectionLoop, sock: socket.socket) -> None:
        self.loop = loop
        self.sock = sock
        self.fd = sock.fileno()
        # after the preamble, frames of any size: the peer is known (the token), and the
        # limit on what it sends is the sender's to check (`max_message_bytes`), so a
        # receiver started under another limit never drops a connection for one message
        self.decoder = framing.StreamDecoder(framing.NO_LIMIT, first_max=framing.PREAMBLE_MAX)
        self.peer = ""  # set by the preamble
        self.closed = False
        #: when bytes last came (time.monotonic()): a sign of life even in the middle of a
        #: large message, whose heartbeats queue behind it
        self.last_read = 0.0

    def readable(self, events: int = _IN) -> None:
        self.read(READS_PER_EVENT)

    def read(self, limit: int = 0) -> None:
        """Read and dispatch what has come, up to `limit` reads (0: until none waits)."""
        n_reads = 0
        while not self.closed:
            try:
                n = self.sock.recv_into(self.decoder.buffer())
            except BlockingIOError:
                return
            except ConnectionResetError:
                continue  # the peer died with unread data of its own: read on to EOF
            except OSError as e:
                self.close(f"read failed: {e}")
                return
            if n == 0:
                self.close("")
                return
            self.last_read = time.monotonic()
            try:
                messages = self.decoder.feed(n)
            except framing.FrameError as e:
                self.close(f"not a stream of this runtime ({e}); connection dropped")
                return
            for frames in messages:
                if not self.peer:
                    try:
                        self.peer = framing.parse_preamble(frames, self.loop.tokens)
                    except framing.FrameError as e:
                        self.close(f"{e}; connection dropped")
                        return
                    self.loop.peers.identified(self)
                    continue
                self.loop.dispatch(frames)
            n_reads += 1
            if limit and n_reads >= limit:
                return

    def close(self, why: str) -> None:
        if self.closed:
            return
        self.closed = True
        if not why and not self.peer and self.decoder.mid_message():
            why = "it ended before its preamble; connection dropped"
        if why:
            self.loop.stats.dropped += 1
            log.warning("%s: connection from %s: %s", self.loop.name, self.peer or "?", why)
        elif self.decoder.mid_message():
            log.warning("%s: %s ended in the middle of a message (it died while sending); "
                        "that message is dropped", self.loop.name, self.peer)
        self.loop.peers.closed(self)
        self.sock.close()
