"""The I/O thread: one zmq poller loop that owns every socket of a process.

Other threads never touch a socket: they enqueue sends (`send`) and callbacks
(`call_soon`); the loop wakes through an eventfd. Incoming frame lists are checked
(token, header) before a handler sees them; bad ones are dropped with a log line.
"""

from __future__ import annotations

import collections
import heapq
import ipaddress
import itertools
import logging
import os
import threading
import time
from typing import Any, Callable, Optional
from urllib.parse import urlparse

import zmq

from . import framing
from .auth import CurveKeys

log = logging.getLogger("runtime.transport")

Handler = Callable[[framing.Header, Any, list], None]


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


class IOLoop:
    """A poller loop on its own daemon thread, with a bound inbox and outgoing PUSH sockets."""

    def __init__(self, name: str, token: bytes, on_message: Handler,
                 keys: Optional[CurveKeys] = None, max_message_bytes: int = 0) -> None:
        self.name = name
        self.token = token
        self.tokens: list[bytes] = [token]  # accepted session tokens
        self.on_message = on_message
        self.keys = keys
        self.max_message_bytes = max_message_bytes
        self.ctx = zmq.Context(io_threads=1)
        self.inbox = self.ctx.socket(zmq.PULL)
        self.inbox.setsockopt(zmq.RCVHWM, 0)
        self.inbox.setsockopt(zmq.LINGER, 0)
        self.address = ""
        self._extra: list = []
        self.peer_keys: dict[str, CurveKeys] = {}  # TCP peers of another cluster key
        self.allowed_keys: set[bytes] = set()  # CurveZMQ client keys accepted (z85)
        self._out: dict[str, zmq.Socket] = {}
        self._sendq: collections.deque = collections.deque()
        self._calls: collections.deque = collections.deque()
        self._timers: list = []
        self._timer_seq = itertools.count()
        self._readers: dict[int, Callable[[], None]] = {}
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._sleeping = False
        self._stopping = False
        self._thread: Optional[threading.Thread] = None
        self._auth = None
        self.poller = zmq.Poller()
        self.stats = {"sent": 0, "received": 0, "dropped": 0}
        self.thread_id: Optional[int] = None

    # -- set-up --------------------------------------------------------------------------
    def bind(self, addr: str) -> str:
        """Bind the inbox; returns the resolved address (ephemeral TCP ports filled in)."""
        if addr.startswith("tcp://"):
            if self.keys is not None:
                self.allowed_keys.add(self.keys.public)
                self._start_auth()
                self.inbox.curve_server = True
                self.inbox.curve_secretkey = self.keys.secret
                self.inbox.curve_publickey = self.keys.public
            elif not is_loopback_address(addr):
                raise PermissionError(
                    f"refusing to listen on non-loopback {addr} without CurveZMQ keys "
                    "(give a key file: python -m runtime.transport.auth keygen PATH)"
                )
        if self.max_message_bytes:
            self.inbox.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes + (1 << 20))
        self.inbox.bind(addr)
        self.address = self.inbox.getsockopt(zmq.LAST_ENDPOINT).decode()
        return self.address

    def bind_extra(self, addr: str, keys: Optional[CurveKeys] = None) -> str:
        """Listen on a second address too (e.g. TCP with CurveZMQ besides the ipc inbox)."""
        keys = keys or self.keys
        s = self.ctx.socket(zmq.PULL)
        s.setsockopt(zmq.RCVHWM, 0)
        s.setsockopt(zmq.LINGER, 0)
        if addr.startswith("tcp://"):
            if keys is not None:
                self.allowed_keys.add(keys.public)
                self._start_auth()
                s.curve_server = True
                s.curve_secretkey = keys.secret
                s.curve_publickey = keys.public
            elif not is_loopback_address(addr):
                s.close()
                raise PermissionError(
                    f"refusing to listen on non-loopback {addr} without CurveZMQ keys "
                    "(give a key file: python -m runtime.transport.auth keygen PATH)"
                )
        if self.max_message_bytes:
            s.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes + (1 << 20))
        s.bind(addr)
        self._extra.append(s)
        if self._thread is not None:
            self.call_soon(self.poller.register, s, zmq.POLLIN)
        return s.getsockopt(zmq.LAST_ENDPOINT).decode()

    def _start_auth(self) -> None:
        if self._auth is not None:
            return
        from zmq.auth.thread import ThreadAuthenticator

        allowed = self.allowed_keys

        class _Keys:
            def callback(self, domain: str, key: bytes) -> bool:
                import base64
                import zmq.utils.z85 as z85

                ok = (z85.encode(key) if len(key) == 32 else key) in allowed
                if not ok:
                    log.warning("rejected a CurveZMQ peer with an unknown key %r",
                                base64.b16encode(key[:8]))
                return ok

        self._auth = ThreadAuthenticator(self.ctx, log=logging.getLogger("runtime.auth"))
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=_Keys())

    def start(self) -> None:
        self.poller.register(self.inbox, zmq.POLLIN)
        self.poller.register(self._wake_fd, zmq.POLLIN)
        for s in self._extra:
            self.poller.register(s, zmq.POLLIN)
        self._thread = threading.Thread(target=self._run, name=f"monarch-io-{self.name}",
                                        daemon=True)
        self._thread.start()

    # -- thread-safe API ---------------------------------------------------------------------
    def in_loop(self) -> bool:
        return threading.get_ident() == self.thread_id

    def send(self, addr: str, frames: list) -> None:
        """Queue a frame list for `addr` (any thread)."""
        self._sendq.append((addr, frames))
        if self._sleeping:
            self._wake()

    def call_soon(self, fn: Callable, *args: Any) -> None:
        """Run `fn(*args)` on the loop thread (any thread)."""
        self._calls.append((fn, args))
        if self._sleeping:
            self._wake()

    def call_later(self, delay: float, fn: Callable, *args: Any) -> None:
        """Run `fn(*args)` on the loop thread after `delay` seconds (loop thread only)."""
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_seq), fn, args))

    def call_every(self, period: float, fn: Callable[[], Any]) -> None:
        """Run `fn()` every `period` seconds on the loop thread (loop thread only)."""
        def tick() -> None:
            try:
                fn()
            finally:
                if not self._stopping:
                    self.call_later(period, tick)

        self.call_later(period, tick)

    def add_reader(self, fd: int, fn: Callable[[], None]) -> None:
        """Call `fn()` when `fd` is readable (loop thread only)."""
        self._readers[fd] = fn
        self.poller.register(fd, zmq.POLLIN)

    def remove_reader(self, fd: int) -> None:
        if self._readers.pop(fd, None) is not None:
            try:
                self.poller.unregister(fd)
            except KeyError:
                pass

    def forget_peer(self, addr: str) -> None:
        """Close the socket to a peer that is gone, dropping what it had queued (loop thread)."""
        s = self._out.pop(addr, None)
        if s is not None:
            s.close(linger=0)

    def stop(self, timeout: float = 2.0) -> None:
        """Flush pending sends, stop the thread and close every socket."""
        if self._thread is None or self._stopping:
            return
        self._stopping = True
        self._wake()
        if threading.get_ident() != self.thread_id:
            self._thread.join(timeout)

    def _wake(self) -> None:
        try:
            os.eventfd_write(self._wake_fd, 1)
        except (BlockingIOError, OSError):
            pass

    # -- the loop ---------------------------------------------------------------------------
    def _socket_for(self, addr: str) -> zmq.Socket:
        s = self._out.get(addr)
        if s is None:
            s = self.ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.SNDHWM, 0)
            s.setsockopt(zmq.LINGER, 2000)
            s.setsockopt(zmq.RECONNECT_IVL, 10)
            s.setsockopt(zmq.RECONNECT_IVL_MAX, 0)  # constant 10 ms: procs bind soon after spawn
            keys = self.peer_keys.get(addr, self.keys)
            if addr.startswith("tcp://") and keys is not None:
                s.curve_serverkey = keys.public
                s.curve_publickey = keys.public
                s.curve_secretkey = keys.secret
            s.connect(addr)
            self._out[addr] = s
        return s

    def _flush(self) -> None:
        q = self._sendq
        while q:
            addr, frames = q.popleft()
            try:
                self._socket_for(addr).send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
                self.stats["sent"] += 1
            except zmq.Again:
                log.warning("send queue to %s is full; message dropped", addr)
            except zmq.ZMQError as e:
                log.warning("send to %s failed: %s", addr, e)

    def _drain_inbox(self, sock: zmq.Socket) -> None:
        for _ in range(1000):
            try:
                frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                header, body, buffers = framing.parse(frames, self.tokens)
            except framing.FrameError as e:
                self.stats["dropped"] += 1
                log.warning("%s: dropped a message that is not from this session (%s): %s",
                            self.name, e, framing.summarize(frames))
                continue
            self.stats["received"] += 1
            try:
                self.on_message(header, body, buffers)
            except Exception:
                log.exception("%s: handler failed for message kind %s", self.name, header.kind)

    def _run_calls(self) -> None:
        calls = self._calls
        n = len(calls)
        for _ in range(n):
            fn, args = calls.popleft()
            try:
                fn(*args)
            except Exception:
                log.exception("%s: callback %r failed", self.name, fn)

    def _run_timers(self) -> float:
        now = time.monotonic()
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, fn, args = heapq.heappop(timers)
            try:
                fn(*args)
            except Exception:
                log.exception("%s: timer %r failed", self.name, fn)
        if timers:
            return max(0.0, timers[0][0] - time.monotonic())
        return 1.0

    def _run(self) -> None:
        self.thread_id = threading.get_ident()
        wake_fd = self._wake_fd
        inbox = self.inbox
        try:
            while True:
                self._run_calls()
                self._flush()
                timeout = self._run_timers()
                if self._stopping:
                    self._run_calls()
                    self._flush()
                    break
                self._sleeping = True
                if self._sendq or self._calls:
                    self._sleeping = False
                    continue
                events = self.poller.poll(int(timeout * 1000) + 1)
                self._sleeping = False
                for what, _ in events:
                    if what is inbox:
                        self._drain_inbox(inbox)
                    elif isinstance(what, zmq.Socket):
                        self._drain_inbox(what)
                    elif what == wake_fd:
                        try:
                            os.eventfd_read(wake_fd)
                        except BlockingIOError:
                            pass
                    else:
                        fn = self._readers.get(what)
                        if fn is not None:
                            try:
                                fn()
                            except Exception:
                                log.exception("%s: reader for fd %s failed", self.name, what)
        finally:
            self._close()

    def _close(self) -> None:
        for s in self._out.values():
            try:
                s.close(linger=200)
            except zmq.ZMQError:
                pass
        self._out.clear()
        for s in self._extra:
            s.close(linger=0)
        try:
            self.inbox.close(linger=0)
        except zmq.ZMQError:
            pass
        if self._auth is not None:
            try:
                self._auth.stop()
            except Exception:
                pass
        try:
            self.ctx.term()
        except zmq.ZMQError:
            pass
        try:
            os.close(self._wake_fd)
        except OSError:
            pass
