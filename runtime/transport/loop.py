"""The I/O thread: one poller loop per process that reads every connection and runs timers.

Receiving is this thread's alone: it reads each inbound stream connection (peers on this
host, runtime/transport/stream.py) and the TCP inbox (zmq PULL with CurveZMQ, peers on other
hosts), checks each message (token, header) and hands it to the process's handler, which
resolves futures or fills actor mailboxes. Sending is any thread's: a message goes on the
one connection this process has to that peer (`Outbound` for ipc:// addresses, a locked
zmq PUSH socket for tcp://), at once and without blocking. docs/transport.md has the rules.
"""

from __future__ import annotations

import collections
import functools
import heapq
import itertools
import logging
import os
import threading
import time
from typing import Any, Callable, Optional

import zmq

from . import framing, stream
from .auth import CurveKeys
from .listen import Listener
from .peers import Peers

__all__ = ["Handler", "IOLoop", "Timers", "LoopStats"]

log = logging.getLogger("runtime.transport")

Handler = Callable[[framing.Header, Any, list], None]
_NOBLOCK = int(zmq.NOBLOCK)
_RCVMORE = int(zmq.RCVMORE)
_POLLIN = int(zmq.POLLIN)
#: messages taken from the TCP inbox per readiness event before other sockets get a turn
_BATCH = 256


class IOLoop:
    """A poller loop on its own daemon thread: listeners, connections, timers."""

    def __init__(self, name: str, token: bytes, on_message: Handler,
                 keys: Optional[CurveKeys] = None, max_message_bytes: int = 0) -> None:
        self.name = name
        self.token = token
        self.tokens: list[bytes] = [token]  # accepted session tokens
        self.on_message = on_message
        self.keys = keys
        self.max_message_bytes = max_message_bytes
        self.address = ""
        self.peer_keys: dict[str, CurveKeys] = {}  # TCP peers of another cluster key
        #: a proc's host agent (its ipc address): what this process sends to other hosts
        #: goes through it (`peers.relay_peer`), so that it leaves on one path and the
        #: agent's report of this process's death follows it there
        self.relay = ""
        self.peers = Peers(self)  # the connections (runtime/transport/peers.py)
        self._ctx: Optional[zmq.Context] = None  # made for the first TCP socket
        self._listener: Optional[Listener] = None
        self._zmq_inboxes: list[zmq.Socket] = []
        self._zmq_readers: dict[zmq.Socket, Callable[[zmq.Socket], None]] = {}
        #: cluster public key -> gateway link (runtime/transport/gateway.py): TCP peers of
        #: that cluster are reached through it
        self.gateways: dict[bytes, Any] = {}
        self._unix: list[Any] = []  # listening AF_UNIX sockets
        self._calls: collections.deque = collections.deque()
        self.timers = Timers(name)
        self._fds: dict[int, Callable[[int], None]] = {}
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._sleeping = False
        self.stopping = False
        self._thread: Optional[threading.Thread] = None
        self.poller = zmq.Poller()
        self.stats = LoopStats(self)
        self.thread_id: Optional[int] = None
        self.on_close: list[Callable[[], None]] = []  # run on the loop thread as it stops

    # -- set-up --------------------------------------------------------------------------
    @property
    def ctx(self) -> zmq.Context:
        if self._ctx is None:
            self._ctx = zmq.Context(io_threads=1)
        return self._ctx

    @property
    def listener(self) -> Listener:
        """Checks and CurveZMQ set-up for TCP inboxes (made on first use)."""
        if self._listener is None:
            self._listener = Listener(self.ctx, self.max_message_bytes)
        return self._listener

    def bind(self, addr: str) -> str:
        """Listen at this process's address; returns it (an ephemeral TCP port filled in)."""
        self.address = self.bind_extra(addr)
        return self.address

    def bind_extra(self, addr: str, keys: Optional[CurveKeys] = None) -> str:
        """Listen at `addr`: an AF_UNIX stream socket for ipc://PATH, else a zmq PULL
        socket (CurveZMQ with `keys` or the loop's for TCP)."""
        if addr.startswith("ipc://"):
            s = stream.listen(addr)
            self._unix.append(s)
            self._watch_soon(s.fileno(), functools.partial(self._accept_on, s))
            return addr
        z = self.ctx.socket(zmq.PULL)
        z.setsockopt(zmq.RCVHWM, 0)
        z.setsockopt(zmq.LINGER, 0)
        try:
            addr = self.listener.bind(z, addr, keys or self.keys)
        except BaseException:
            z.close()
            raise
        self._zmq_inboxes.append(z)
        if self._thread is not None:
            self.call_soon(self.poller.register, z, zmq.POLLIN)
        return addr

    def watch_zmq(self, sock: zmq.Socket, fn: Callable[[zmq.Socket], None]) -> None:
        """Have the I/O thread call fn(sock) when a zmq socket (not an inbox) is readable."""
        def add() -> None:
            self._zmq_readers[sock] = fn
            self.poller.register(sock, zmq.POLLIN)
        self.call_soon(add) if self._thread is not None else add()

    def unwatch_zmq(self, sock: zmq.Socket) -> None:
        """Stop reading a socket given to `watch_zmq` (on the I/O thread)."""
        if self._zmq_readers.pop(sock, None) is not None:
            self.poller.unregister(sock)

    def _watch_soon(self, fd: int, fn: Callable[[int], None]) -> None:
        if self._thread is None:
            self._fds[fd] = fn
            self.poller.register(fd, _POLLIN)
        else:
            self.call_soon(self.watch, fd, _POLLIN, fn)

    def start(self) -> None:
        for z in self._zmq_inboxes:
            self.poller.register(z, zmq.POLLIN)
        self.poller.register(self._wake_fd, zmq.POLLIN)
        self._thread = threading.Thread(target=self._run, name=f"monarch-io-{self.name}",
                                        daemon=True)
        self._thread.start()

    # -- thread-safe API ---------------------------------------------------------------------
    def in_loop(self) -> bool:
        return threading.get_ident() == self.thread_id

    def send(self, addr: str, frames: list, port: int = 0) -> None:
        """Send a frame list to `addr` from the calling thread (`Peers.send`): in order per
        peer; if it cannot be sent, the call waiting on `port` fails."""
        if self.stopping:
            log.debug("%s: loop stopped; message to %s dropped", self.name, addr)
            if port:
                self.peers.send_failed(addr, [port], "this process's runtime is stopping",
                                       False)
            return
        self.peers.send(addr, frames, port)

    def forget_peer(self, addr: str) -> None:
        """A peer is gone (loop thread): `Peers.forget`."""
        self.peers.forget(addr)

    def drain_from(self, sender: str) -> None:
        """Everything `sender` sent so far, dispatched now (loop thread): connections still
        in a listening socket's backlog are accepted first, then `Peers.drain_from` reads
        the ones not yet identified and the sender's."""
        self.accept_pending()
        self.peers.drain_from(sender)

    def _accept_on(self, lsock: Any, events: int) -> None:
        self.peers.accept(lsock)

    def accept_pending(self) -> None:
        """Accept the connections waiting on this process's listening sockets (loop thread)."""
        for s in list(self._unix):
            self.peers.accept(s)

    def last_heard(self, sender: str) -> float:
        """When bytes last came from `sender` on a stream (`Peers.last_heard`)."""
        return self.peers.last_heard(sender)

    def read_pending(self) -> None:
        """Read and dispatch everything that waits on this process's connections and inboxes
        now (loop thread): judged after a busy spell, silence is measured on what came."""
        self.accept_pending()
        self.peers.read_pending()
        for z in list(self._zmq_inboxes) + list(self._zmq_readers):
            reader = self._zmq_readers.get(z) or self._drain_zmq
            for _ in range(64):  # a bound: a peer that never pauses cannot hold the loop
                if not int(z.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                    break
                reader(z)

    def call_soon(self, fn: Callable, *args: Any) -> None:
        """Run `fn(*args)` on the loop thread (any thread)."""
        self.schedule(fn, *args)

    def schedule(self, fn: Callable, *args: Any) -> None:
        """Run `fn(*args)` on the loop thread (any thread, finalizers included: no lock)."""
        self._calls.append((fn, args))
        if self._sleeping:
            self._wake()

    def run_sync(self, fn: Callable, *args: Any, timeout: float = 30.0) -> Any:
        """Run `fn(*args)` on the loop thread and return its result (any thread). Before
        the loop starts or after it stopped, runs it in the calling thread."""
        if self._thread is None or self.stopping or self.in_loop():
            return fn(*args)
        return _run_on_loop(self, fn, args, timeout)

    def call_later(self, delay: float, fn: Callable, *args: Any) -> None:
        """Run `fn(*args)` on the loop thread after `delay` seconds (loop thread only)."""
        self.timers.later(delay, fn, *args)

    def call_every(self, period: float, fn: Callable[[], Any]) -> None:
        """Run `fn()` every `period` seconds on the loop thread (loop thread only)."""
        self.timers.every(period, fn, lambda: self.stopping)

    def watch(self, fd: int, events: int, fn: Callable[[int], None]) -> None:
        """Call `fn(events)` when `fd` is ready for `events` (zmq.POLLIN/POLLOUT; loop
        thread only); watching it again changes the events."""
        self._fds[fd] = fn
        self.poller.register(fd, events)

    def unwatch(self, fd: int) -> None:
        """Stop watching `fd` (loop thread only)."""
        if self._fds.pop(fd, None) is not None:
            try:
                self.poller.unregister(fd)
            except KeyError:
                pass

    def add_reader(self, fd: int, fn: Callable[[], None]) -> None:
        """Call `fn()` when `fd` is readable (loop thread only)."""
        self.watch(fd, _POLLIN, lambda events: fn())

    remove_reader = unwatch

    def stop(self, timeout: float = 2.0) -> None:
        """Write what waits, stop the thread and close every socket."""
        if self._thread is None or self.stopping:
            return
        self.stopping = True
        self._wake()
        if threading.get_ident() != self.thread_id:
            self._thread.join(timeout)

    def _wake(self) -> None:
        try:
            os.eventfd_write(self._wake_fd, 1)
        except (BlockingIOError, OSError):
            pass

    def dispatch(self, frames: list) -> None:
        """Check one received message and hand it to `on_message`."""
        try:
            header, body, buffers = framing.parse(frames, self.tokens)
        except framing.FrameError as e:
            self.stats.dropped += 1
            n = self.stats.dropped
            if n <= 10 or n & (n - 1) == 0:  # the first ten, then at powers of two
                log.warning("%s: dropped a message that is not from this session (%s): %s"
                            " [%d dropped so far]", self.name, e, framing.summarize(frames), n)
            return
        self.stats.received += 1
        self.stats.by_kind[header.kind] += 1
        try:
            self.on_message(header, body, buffers)
        except Exception:
            log.exception("%s: handler failed for message kind %s", self.name, header.kind)

    def _drain_zmq(self, sock: zmq.Socket) -> None:
        for _ in range(_BATCH):
            try:
                frames: list = [sock.recv(_NOBLOCK)]
            except zmq.Again:
                return
            if sock.getsockopt(_RCVMORE):
                frames += sock.recv_multipart(flags=_NOBLOCK, copy=False)
            self.dispatch(frames)

    # -- the loop -----------------------------------------------------------------------------
    def _run_calls(self) -> None:
        calls = self._calls
        for _ in range(len(calls)):
            fn, args = calls.popleft()
            try:
                fn(*args)
            except Exception:
                log.exception("%s: callback %r failed", self.name, fn)

    def _run(self) -> None:
        self.thread_id = threading.get_ident()
        wake_fd = self._wake_fd
        fds = self._fds
        try:
            while True:
                self._run_calls()
                timeout = self.timers.run_due()
                if self.stopping:
                    self._run_calls()
                    break
                self._sleeping = True
                if self._calls:
                    self._sleeping = False
                    continue
                events = self.poller.poll(int(timeout * 1000) + 1)
                self._sleeping = False
                for what, ev in events:
                    if what == wake_fd:
                        try:
                            os.eventfd_read(wake_fd)
                        except BlockingIOError:
                            pass
                    elif isinstance(what, zmq.Socket):
                        try:
                            (self._zmq_readers.get(what) or self._drain_zmq)(what)
                        except Exception:  # one bad message must not end the loop
                            log.exception("%s: reading a zmq socket failed", self.name)
                    else:
                        fn = fds.get(what)
                        if fn is not None:
                            try:
                                fn(ev)
                            except Exception:
                                log.exception("%s: handler for fd %s failed", self.name, what)
        finally:
            self._close()

    def _close(self) -> None:
        for fn in self.on_close:
            try:
                fn()
            except Exception:
                log.exception("%s: close hook %r failed", self.name, fn)
        self.peers.finish()
        for s in self._unix:
            try:
                os.unlink(s.getsockname())
            except (OSError, TypeError):
                pass
            s.close()
        for z in self._zmq_inboxes:
            z.close(linger=0)
        if self._listener is not None:
            self._listener.close()
        if self._ctx is not None:
            try:
                self._ctx.term()
            except zmq.ZMQError:
                pass
        try:
            os.close(self._wake_fd)
        except OSError:
            pass


def _run_on_loop(loop: IOLoop, fn: Callable, args: tuple, timeout: float) -> Any:
    box: list = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append((True, fn(*args)))
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            box.append((False, e))
        finally:
            done.set()

    loop.call_soon(run)
    if not done.wait(timeout):
        raise TimeoutError(f"{loop.name}: the I/O thread did not run {fn!r} within "
                           f"{timeout:g} s")
    ok, value = box[0]
    if ok:
        return value
    raise value


class Timers:
    """An I/O loop's timers (loop thread only): a heap of (when, sequence, fn, args)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.heap: list = []
        self.seq = itertools.count()

    def later(self, delay: float, fn: Callable, *args: Any) -> None:
        heapq.heappush(self.heap, (time.monotonic() + delay, next(self.seq), fn, args))

    def every(self, period: float, fn: Callable[[], Any], stopping: Callable[[], bool]) -> None:
        def tick() -> None:
            try:
                fn()
            finally:
                if not stopping():
                    self.later(period, tick)

        self.later(period, tick)

    def run_due(self) -> float:
        """Run what is due; returns the seconds until the next timer (60 s when none)."""
        now = time.monotonic()
        heap = self.heap
        while heap and heap[0][0] <= now:
            _, _, fn, args = heapq.heappop(heap)
            try:
                fn(*args)
            except Exception:
                log.exception("%s: timer %r failed", self.name, fn)
        if heap:
            return max(0.0, heap[0][0] - time.monotonic())
        return 60.0


class LoopStats:
    """Counters of one loop: messages sent (by every thread), received and dropped."""

    __slots__ = ("loop", "received", "dropped", "by_kind")

    def __init__(self, loop: IOLoop) -> None:
        self.loop = loop
        self.received = 0  # every message received
        self.dropped = 0
        self.by_kind: collections.Counter = collections.Counter()  # received, by Kind value

    def __getitem__(self, key: str) -> int:
        if key == "sent":
            return self.loop.peers.sent()
        if key in ("received", "dropped"):
            return getattr(self, key)
        raise KeyError(key)
