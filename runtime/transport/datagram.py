"""The datagram lane: messages between the processes of one host skip zmq's I/O threads.

Every ipc inbox (a process's, a thread's) is a zmq PULL socket *and* an AF_UNIX datagram
socket beside it (`lane_path`). zmq moves each message through an I/O thread of its own
on both sides (a wake-up and a hand-over per message, each way); a datagram goes from the
sending thread's `send(2)` to the reading thread's `recv(2)`.

- A message of one frame up to `MAX_DATAGRAM` bytes (nearly all: calls, replies, control)
  is one datagram. Anything else (several frames, large bodies, out-of-band buffers) goes by
  zmq, prefixed with a key (sender id, sequence number), and a *pointer* datagram carrying
  that key follows it on the lane: the receiver reads the zmq socket only when it meets a
  pointer, so one sender's messages arrive in the order they were sent, whatever the lane.
- Nothing blocks a sender. A datagram the receiver has no room for yet (its queue is full,
  or its socket is not bound yet) waits in the sender's backlog; the sender's I/O loop sends
  the backlog when the socket turns writable (or retries the connection), the sending
  thread on its next send, and while it is not empty every later message of that sender
  joins it, in order. Queues are unbounded, as zmq's without a high-water mark.
- Strays (a zmq message no pointer names, without a key or a token, or whose pointer never
  comes) are swept off the zmq socket by the I/O loop every `SWEEP_S` and dropped with a
  log line: nothing piles up unread.

`LaneInbox` and `LaneSender` offer the part of `zmq.Socket`'s API their users call, so the
readers (transport/inbox.py, transport/receive.py) and senders (transport/senders.py) do
not change. A datagram is checked like any message (token, header) before it is used; a
pointer only names a zmq message, which is then checked the same way.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import hmac
import logging
import os
import socket
import struct
import threading
import time
import weakref
from typing import Any, Optional

import zmq

log = logging.getLogger("runtime.transport")

#: the lane's socket is the inbox's ipc path with this suffix
SUFFIX = ".dg"
#: one-frame messages up to this size go as one datagram; larger ones by zmq
MAX_DATAGRAM = 64 << 10
#: a pointer datagram: BULK, the key of the zmq message it stands for, the session token
BULK = b"\x00MNBULK\x00"
_KEY = struct.Struct("<8sQ")  # sender id, sequence number
_BLEN, _KLEN = len(BULK), _KEY.size
#: how long a reader waits for a pointer's zmq message before it gives it up (logged)
BULK_WAIT_S = 30.0
#: a sender retries the connection to an inbox not bound yet this often (doubling up to MAX)
RETRY_S = 0.01
RETRY_MAX_S = 0.1
#: a sender still without a lane this long after its first try, while the inbox's zmq
#: socket is bound, says so once in the log (the receiver runs with the lane off)
NO_LANE_WARN_S = 5.0
#: how often the I/O loop takes stray zmq messages off its process's lane inboxes
SWEEP_S = 1.0
#: bytes a sender may have in the receiver's queue (the kernel caps it at wmem_max)
SNDBUF = 1 << 20
_MAX_PATH = 107  # sun_path holds 108 bytes with the terminating NUL

_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS, _POLLIN, _RCVMORE, _FD, _RCVTIMEO = (int(zmq.EVENTS), int(zmq.POLLIN),
                                              int(zmq.RCVMORE), int(zmq.FD), int(zmq.RCVTIMEO))
_DONTWAIT = socket.MSG_DONTWAIT
_GONE = (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTCONN, errno.EDESTADDRREQ)


def lane_path(address: str) -> Optional[str]:
    """The datagram socket beside the inbox at `address`; None off ipc (TCP peers use zmq)."""
    if address[:6] == "ipc://":
        return address[6:] + SUFFIX
    return None


def pointer(key: bytes, token: bytes) -> bytes:
    """The datagram that stands for the zmq message sent with `key`."""
    return BULK + key + token


def is_pointer(data: bytes) -> bool:
    """Whether `data` is a pointer datagram (a message's head frame starts with its random
    session token, so it cannot start with BULK)."""
    return data[:_BLEN] == BULK


def pointer_key(data: bytes, tokens: list) -> Optional[bytes]:
    """The key a pointer carries, if it carries one of `tokens` too; else None."""
    key, token = data[_BLEN:_BLEN + _KLEN], data[_BLEN + _KLEN:]
    if len(key) == _KLEN and any(hmac.compare_digest(token, t) for t in tokens):
        return key
    return None


def _timeval(ms: int) -> bytes:
    if ms < 0:
        return struct.pack("ll", 0, 0)  # no timeout
    ms = max(ms, 1)
    return struct.pack("ll", ms // 1000, (ms % 1000) * 1000)


class LaneInbox:
    """An ipc inbox read as one socket: datagrams, and the zmq messages their pointers name.
    One reading thread at a time (the owner rules of transport/inbox.py)."""

    __slots__ = ("zsock", "dg", "path", "fd", "more", "peeked", "stash", "closing", "tokens",
                 "stats")

    def __init__(self, zsock: zmq.Socket, address: str, tokens: list,
                 stats: Any = None) -> None:
        path = lane_path(address)
        if path is None:
            raise ValueError(f"no datagram lane for {address!r}: only ipc inboxes have one")
        if len(os.fsencode(path)) > _MAX_PATH:
            raise OSError(errno.ENAMETOOLONG,
                          f"the datagram socket's path {path!r} is over {_MAX_PATH} bytes "
                          "(set MONARCH_RUNTIME_DIR to a shorter directory)")
        self.zsock = zsock  # bound by the caller; read only for pointers
        self.zsock.setsockopt(zmq.RCVTIMEO, 100)  # a wait for bulk looks at `closing`
        try:
            os.unlink(path)  # a socket left by a process that died (zmq does the same)
        except FileNotFoundError:
            pass
        dg = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            dg.bind(path)
        except BaseException:
            dg.close()
            raise
        self.dg = dg
        self.path = path
        self.fd: int = dg.fileno()
        self.more: list = []  # the frames after the head of the bulk message being read
        self.peeked: Optional[bytes] = None  # a datagram received by getsockopt(EVENTS)
        #: bulk messages whose pointer has not come yet: key -> (when, frames)
        self.stash: dict[bytes, tuple[float, list]] = {}
        self.closing = False
        self.tokens = tokens  # accepted session tokens (the loop's list, shared)
        self.stats = stats  # the loop's LoopStats: `dropped` counts what is refused here

    # -- the zmq.Socket subset the readers use ----------------------------------------------
    def recv(self, flags: int = 0) -> bytes:
        """The next message's head frame (its other frames: `recv_multipart`); zmq.Again
        when none waits (NOBLOCK) or none came within RCVTIMEO."""
        data = self.peeked
        if data is None:
            try:
                data = self.dg.recv(MAX_DATAGRAM, _DONTWAIT if flags & _NOBLOCK else 0)
            except BlockingIOError:
                raise zmq.Again() from None
            except OSError as e:
                raise zmq.ZMQError(e.errno or errno.EIO, str(e)) from None
        else:
            self.peeked = None
        if data[:_BLEN] == BULK:
            key = pointer_key(data, self.tokens)
            if key is None:
                self._drop("a pointer without the session's token")
                return b""
            return self._bulk(key)
        return data

    def recv_multipart(self, flags: int = 0, copy: bool = False) -> list:
        """The rest of the frames of the message whose head `recv` returned."""
        more, self.more = self.more, []
        return more

    def getsockopt(self, option: int) -> Any:
        if option == _EVENTS:
            return _POLLIN if self.more or self._peek() else 0
        if option == _RCVMORE:
            return 1 if self.more else 0
        if option == _FD:
            return self.fd
        return self.zsock.getsockopt(option)

    def setsockopt(self, option: int, value: Any) -> None:
        if option == _RCVTIMEO:
            self.dg.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(int(value)))
        else:
            self.zsock.setsockopt(option, value)

    def fileno(self) -> int:
        """The lane's descriptor (readable when a datagram waits), for pollers."""
        return self.fd

    def close(self, linger: int = 0) -> None:
        self.closing = True
        try:
            self.dg.close()
        finally:
            try:
                os.unlink(self.path)
            except OSError:
                pass
            self.zsock.close(linger=linger)

    # -- internals ----------------------------------------------------------------------------
    def _peek(self) -> bool:
        if self.peeked is not None:
            return True
        try:
            self.peeked = self.dg.recv(MAX_DATAGRAM, _DONTWAIT)
        except (BlockingIOError, OSError):
            return False
        return True

    def _bulk(self, key: bytes) -> bytes:
        """The head frame of the zmq message `key` names (its other frames go to `more`);
        b"" (ignored by every reader, as a wake-up) if it does not come."""
        got = self.stash.pop(key, None)
        deadline = time.monotonic() + BULK_WAIT_S
        while got is None:
            if self.closing or time.monotonic() > deadline:
                log.error("%s: a large message announced by its sender did not come within "
                          "%g s; dropped", self.path, BULK_WAIT_S)
                return b""
            try:
                parts = self.zsock.recv_multipart(copy=False)
            except zmq.Again:
                continue
            except zmq.ZMQError:
                return b""
            k = self._stash(parts)
            if k == key:
                got = self.stash.pop(key)
        parts = got[1]
        self.more = parts[1:]
        return parts[0].bytes

    def sweep(self) -> None:
        """Take what waits on the zmq socket into the stash, checked, and drop what waited
        there too long (its pointer never came): nothing piles up unread (lock held)."""
        while not self.closing:
            try:
                parts = self.zsock.recv_multipart(flags=_NOBLOCK, copy=False)
            except zmq.ZMQError:
                break
            self._stash(parts)
        old = time.monotonic() - BULK_WAIT_S
        for k in [k for k, (t, _) in self.stash.items() if t < old]:
            del self.stash[k]
            self._drop("a large message whose pointer never came")

    def _stash(self, parts: list) -> Optional[bytes]:
        """Keep a zmq message by its key, if it has one and its head carries a session
        token (else it is dropped, with a log line); returns the key."""
        key = parts[0].bytes
        head = parts[1].bytes[:64] if len(parts) > 1 else b""
        if len(key) != _KEY.size or not any(head[:len(t)] == t for t in self.tokens):
            if any(key[:len(t)] == t for t in self.tokens):  # ours, sent without a lane
                self._drop(f"a message of this session sent by zmq alone ({len(parts)} "
                           "frames): its sender runs with datagram_lane off, this process "
                           "with it on (MONARCH_DATAGRAM_LANE must agree)")
            else:
                self._drop(f"a zmq message that is not a lane's ({len(parts)} frames)")
            return None
        self.stash[key] = (time.monotonic(), parts[1:])
        return key

    def _drop(self, what: str) -> None:
        if self.stats is not None:
            self.stats.dropped += 1
        log.warning("%s: dropped %s", self.path, what)


class LaneSender:
    """One owner's sends to one ipc inbox: datagrams, and zmq (with a pointer) for what does
    not fit one. The owner is a thread holding `lock` (its ThreadSenders' lock) or, when
    `lock` is None, the I/O loop itself; the loop sends the backlog under the same lock."""

    __slots__ = ("loop", "address", "path", "dg", "zsock", "backlog", "sid", "seq", "lock",
                 "connected", "armed", "closed", "linger_until", "retry_s", "since",
                 "__weakref__")

    def __init__(self, loop: Any, address: str, lock: Optional[threading.Lock]) -> None:
        self.loop = loop  # transport.loop.IOLoop
        self.address = address
        self.path = lane_path(address)
        self.lock = lock
        self.dg = socket.socket(socket.AF_UNIX,
                                socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        self.dg.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
        self.zsock: Optional[zmq.Socket] = None  # for bulk, made on first use
        self.backlog: Any = collections.deque()  # datagrams not sent yet, in order
        self.sid = os.urandom(8)
        self.seq = 0
        self.armed = False  # the loop will send the backlog (owner's lock held to change)
        self.closed = False
        self.linger_until = 0.0
        self.retry_s = RETRY_S
        self.since = 0.0  # when the connection was first refused (-1: that was logged)
        self.connected = self._connect()
        loop.lanes.senders.add(self)

    # -- the owner (lock held) ------------------------------------------------------------------
    def send(self, frame: Any, flags: int = 0) -> None:
        """Send one frame: a datagram, or by zmq with a pointer when it is too large."""
        if len(frame) > MAX_DATAGRAM:
            self._send_bulk([frame])
            return
        if self.backlog or not self.connected:
            if self.connected:  # what the receiver made room for goes now, from here
                self._send_backlog()
            if self.backlog or not self.connected:
                self._defer(frame)
                return
        try:
            self.dg.send(frame)
        except BlockingIOError:
            self._defer(frame)
        except OSError as e:
            if e.errno not in _GONE:
                raise zmq.ZMQError(e.errno or errno.EIO, str(e)) from None
            self.connected = False  # the inbox went away (a new one may bind it)
            self._defer(frame)

    def send_multipart(self, frames: list, copy: bool = False, flags: int = 0) -> None:
        if len(frames) == 1:
            self.send(frames[0])
        else:
            self._send_bulk(frames)

    def close(self, linger: int = 0) -> None:
        """Close (owner, or the loop as it stops). What the backlog holds is still sent,
        by the loop, for up to `linger` ms (0: dropped, for a peer that is gone)."""
        if self.closed:
            return
        self.closed = True
        self.linger_until = time.monotonic() + linger / 1000
        if self.zsock is not None:
            self.zsock.close(linger=linger)
        if not self.armed:  # else the loop closes it when the backlog is out
            self.dg.close()

    # -- internals --------------------------------------------------------------------------------
    def _connect(self) -> bool:
        try:
            self.dg.connect(self.path)
            return True
        except OSError as e:
            if e.errno in _GONE:
                return False
            raise

    def _send_bulk(self, frames: list) -> None:
        self.seq += 1
        key = _KEY.pack(self.sid, self.seq)
        if self.zsock is None:
            self.zsock = self.loop.new_push_socket(self.address)
        self.zsock.send_multipart([key, *frames], copy=False, flags=_NOBLOCK)
        self.send(pointer(key, self.loop.token))

    def _send_backlog(self) -> None:
        """Send from the backlog while the receiver has room (the owner, on its next send:
        the loop may not get a core soon on a busy machine; it stays armed meanwhile)."""
        backlog, dg = self.backlog, self.dg
        try:
            while backlog:
                dg.send(backlog[0])
                backlog.popleft()
        except OSError:  # no room, or gone: the loop's flush sees to it
            pass

    def _defer(self, frame: bytes) -> None:
        self.backlog.append(bytes(frame) if type(frame) is not bytes else frame)
        if not self.armed:
            self.armed = True
            loop = self.loop
            if loop.in_loop():
                self._arm()
            else:
                loop.schedule(self._arm)

    def _locked(self) -> Any:
        return self.lock if self.lock is not None else contextlib.nullcontext()

    # -- the loop thread --------------------------------------------------------------------------
    def _arm(self) -> None:
        if self.connected:
            self.loop.add_writer(self.dg.fileno(), self._flush)
        else:
            self.loop.call_later(self.retry_s, self._reconnect)

    def _given_up(self) -> bool:
        """Closed, and its linger is over: drop what is left (lock held)."""
        if self.closed and time.monotonic() >= self.linger_until:
            self._report_undelivered()
            self._retire()
            return True
        return False

    def _report_undelivered(self) -> None:
        if self.backlog:
            log.warning("%s: %d messages not delivered before the socket closed",
                        self.address, len(self.backlog))

    def _reconnect(self) -> None:
        with self._locked():
            if self._given_up():
                return
            self.connected = self._connect()
            if not self.connected:
                self._no_lane_yet()
                self.retry_s = min(self.retry_s * 2, RETRY_MAX_S)
                self.loop.call_later(self.retry_s, self._reconnect)
                return
            self.retry_s = RETRY_S
            self.since = 0.0
        self._flush()

    def _no_lane_yet(self) -> None:
        """The inbox has no lane yet: after `NO_LANE_WARN_S`, if its zmq socket is bound,
        say once that the receiver seems to run with the lane off (its messages wait)."""
        now = time.monotonic()
        if self.since == 0.0:
            self.since = now
        elif 0 < self.since < now - NO_LANE_WARN_S and os.path.exists(self.address[6:]):
            self.since = -1.0
            log.warning("%s: bound, but without a datagram socket after %g s: does that "
                        "process run with datagram_lane off? (MONARCH_DATAGRAM_LANE must "
                        "agree) %d messages wait", self.address, NO_LANE_WARN_S,
                        len(self.backlog))

    def _flush(self) -> None:
        """Send what the backlog holds while there is room (loop thread, socket writable)."""
        with self._locked():
            if self._given_up():
                return
            backlog, dg = self.backlog, self.dg
            while backlog:
                try:
                    dg.send(backlog[0])
                except BlockingIOError:
                    self.loop.add_writer(dg.fileno(), self._flush)
                    return  # called again when there is room
                except OSError as e:
                    self.loop.remove_writer(dg.fileno())
                    if e.errno not in _GONE:
                        log.warning("send to %s failed: %s; %d messages dropped",
                                    self.address, e, len(backlog))
                        self._retire()
                        return
                    self.connected = False
                    self.loop.call_later(self.retry_s, self._reconnect)
                    return
                backlog.popleft()
            self.loop.remove_writer(dg.fileno())
            self.armed = False
            if self.closed:
                self.dg.close()

    def _retire(self) -> None:
        """Stop watching, drop the backlog and close the socket (loop thread, lock held)."""
        if self.dg.fileno() >= 0:
            self.loop.remove_writer(self.dg.fileno())
        self.armed = False
        self.backlog.clear()
        self.dg.close()

    def finish(self) -> None:
        """The loop stops: send the backlog, waiting for room until the linger is over
        (blocking), then close."""
        with self._locked():
            dg = self.dg
            while self.backlog and time.monotonic() < self.linger_until and dg.fileno() >= 0:
                if not self.connected:
                    self.connected = self._connect()
                    if not self.connected:
                        time.sleep(RETRY_S)
                        continue
                try:
                    dg.send(self.backlog[0])
                except BlockingIOError:
                    time.sleep(0.001)
                    continue
                except OSError:
                    break
                self.backlog.popleft()
            self._report_undelivered()
            self._retire()


class Lanes:
    """One process's lane inboxes (each with the lock its readers hold; None: the I/O
    loop's own) and senders, for its I/O loop: strays swept every `SWEEP_S`, backlogs sent
    before the loop's sockets close."""

    def __init__(self) -> None:
        self.senders: "weakref.WeakSet[LaneSender]" = weakref.WeakSet()
        self.inboxes: list[tuple[LaneInbox, Any]] = []

    def add_inbox(self, inbox: LaneInbox, lock: Any) -> None:
        self.inboxes.append((inbox, lock))

    def set_lock(self, inbox: LaneInbox, lock: Any) -> None:
        """Its readers hold `lock` from now on (a shared inbox, before the loop starts)."""
        self.inboxes = [(i, lock if i is inbox else lk) for i, lk in self.inboxes]

    def sweep(self) -> None:
        """`LaneInbox.sweep` each inbox whose lock is free (loop thread)."""
        for inbox, lock in list(self.inboxes):
            if inbox.closing:
                self.inboxes.remove((inbox, lock))
            elif lock is None:
                inbox.sweep()
            elif lock.acquire(False):  # else its reader is at it: next time
                try:
                    inbox.sweep()
                finally:
                    lock.release()

    def finish(self) -> None:
        """The loop stops: every backlog out within its linger, or dropped (loop thread)."""
        for sender in list(self.senders):
            if sender.armed:
                sender.finish()


