"""The I/O thread: one zmq poller loop that owns the inbox and receives every message.

Every socket has exactly one owning thread. The loop owns the inbox, the extra listeners
and its own send sockets; any other thread that sends (a caller in the controller, an actor
thread in a proc) owns send sockets of its own (`ThreadSenders`), made on its first send to
an address and closed when the thread ends. Sending from the calling thread saves the
hand-off to the loop and back. Callbacks reach the loop with `call_soon` (eventfd wake-up).
Incoming frame lists are checked (token, header) before a handler sees them; bad ones are
dropped with a log line.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable, Optional

import zmq

from ..config import SETTINGS, config
from . import framing, receive
from .auth import CurveKeys
from .datagram import SWEEP_S, LaneInbox, Lanes, LaneSender
from .listen import Listener
from .senders import ThreadSenders, send_frames

log = logging.getLogger("runtime.transport")

Handler = Callable[[framing.Header, Any, list], None]


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
        self._out: dict[str, zmq.Socket] = {}
        self._tls = threading.local()
        self._senders: "weakref.WeakSet[ThreadSenders]" = weakref.WeakSet()
        self._forgotten: collections.OrderedDict = collections.OrderedDict()
        self._forget_gen = 0
        #: hold a thread's bursts of small messages to one address and send them as one
        #: (runtime/transport/senders.py); set before threads send
        self.coalesce = True
        #: ipc inboxes get a datagram lane, and sends to them use it (transport/datagram.py)
        self.lane = config.datagram_lane
        self._calls: collections.deque = collections.deque()
        self.timers = Timers(name)
        self._readers: dict[int, Callable[[], None]] = {}
        self._writers: dict[int, Callable[[], None]] = {}
        self.lanes = Lanes()  # this process's datagram lanes (transport/datagram.py)
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._sleeping = False
        self._stopping = False
        self._thread: Optional[threading.Thread] = None
        self.listener = Listener(self.ctx, max_message_bytes)
        self.poller = zmq.Poller()
        self.stats = LoopStats(self)
        self.thread_id: Optional[int] = None
        self.on_close: list[Callable[[], None]] = []  # run on the loop thread as it stops
        self.shared_inbox: Any = None  # transport.inbox.SharedInbox: actor threads read too

    # -- set-up --------------------------------------------------------------------------
    def bind(self, addr: str) -> str:
        """Bind the inbox; returns the resolved address (ephemeral TCP ports filled in). An
        ipc inbox gets its datagram lane beside it (transport/datagram.py)."""
        self.address = self.listener.bind(self.inbox, addr, self.keys)
        if self.lane and self.address.startswith("ipc://"):
            self.inbox = LaneInbox(self.inbox, self.address, self.tokens, self.stats)
            self.lanes.add_inbox(self.inbox, None)
        return self.address

    def bind_extra(self, addr: str, keys: Optional[CurveKeys] = None) -> str:
        """Listen on a second address too (e.g. TCP with CurveZMQ besides the ipc inbox;
        on ipc with a datagram lane, as every ipc inbox)."""
        s = self.ctx.socket(zmq.PULL)
        s.setsockopt(zmq.RCVHWM, 0)
        s.setsockopt(zmq.LINGER, 0)
        try:
            addr = self.listener.bind(s, addr, keys or self.keys)
            if self.lane and addr.startswith("ipc://"):
                s = LaneInbox(s, addr, self.tokens, self.stats)
                self.lanes.add_inbox(s, None)
        except BaseException:
            s.close()
            raise
        self._extra.append(s)
        if self._thread is not None:
            self.call_soon(self._watch_extra, s)
        return addr

    def _watch_extra(self, s: Any) -> None:
        if isinstance(s, LaneInbox):
            self.add_reader(s.fd, lambda: self.drain_inbox(s))
        else:
            self.poller.register(s, zmq.POLLIN)

    def start(self) -> None:
        if self.shared_inbox is None:  # a lane's descriptor, or the zmq socket itself
            self.poller.register(_pollable(self.inbox), zmq.POLLIN)
        else:  # it watches the inbox's descriptor, and drains it when no actor reads
            self.call_soon(self.shared_inbox.start)
        self.poller.register(self._wake_fd, zmq.POLLIN)
        for s in self._extra:
            self._watch_extra(s)
        if self.lane:  # strays of lane inboxes: none without the lane
            self.call_soon(self.call_every, SWEEP_S, self.lanes.sweep)
        self._thread = threading.Thread(target=self._run, name=f"monarch-io-{self.name}",
                                        daemon=True)
        self._thread.start()

    # -- thread-safe API ---------------------------------------------------------------------
    def in_loop(self) -> bool:
        return threading.get_ident() == self.thread_id

    def send(self, addr: str, frames: list) -> None:
        """Send a frame list to `addr` now, on a socket the calling thread owns (any thread).

        Messages from one thread to one address arrive in the order they were sent."""
        if self._stopping:
            log.debug("%s: loop stopped; message to %s dropped", self.name, addr)
            return
        if threading.get_ident() == self.thread_id:
            self._send_from_loop(addr, frames)
            return
        senders = self._tls.__dict__.get("s")
        if senders is None:
            senders = self._tls.s = ThreadSenders(self, self.coalesce)
            self._senders.add(senders)
        senders.send(addr, frames)

    def before_block(self) -> None:
        """The calling thread is about to wait (or hand work to the loop): what it holds of
        a burst of small messages goes out now (runtime/transport/senders.py)."""
        senders = self._tls.__dict__.get("s")
        if senders is not None:
            senders.before_block()

    def call_soon(self, fn: Callable, *args: Any) -> None:
        """Run `fn(*args)` on the loop thread (any thread); what the calling thread holds
        goes out first, so that what the loop sends for it follows."""
        self.before_block()
        self.schedule(fn, *args)

    def schedule(self, fn: Callable, *args: Any) -> None:
        """`call_soon` without the flush, and without a lock: what finalizers and weakref
        callbacks use (the collector runs them at any allocation, maybe inside this
        thread's own send, whose lock they must not wait for), and a sender arming its own
        late flush."""
        self._calls.append((fn, args))
        if self._sleeping:
            self._wake()

    def run_sync(self, fn: Callable, *args: Any, timeout: float = 30.0) -> Any:
        """Run `fn(*args)` on the loop thread and return its result (any thread). Before
        the loop starts or after it stopped, runs it in the calling thread."""
        if self._thread is None or self._stopping or self.in_loop():
            return fn(*args)
        return _run_on_loop(self, fn, args, timeout)

    def call_later(self, delay: float, fn: Callable, *args: Any) -> None:
        """Run `fn(*args)` on the loop thread after `delay` seconds (loop thread only)."""
        self.timers.later(delay, fn, *args)

    def call_every(self, period: float, fn: Callable[[], Any]) -> None:
        """Run `fn()` every `period` seconds on the loop thread (loop thread only)."""
        self.timers.every(period, fn, lambda: self._stopping)

    def add_reader(self, fd: int, fn: Callable[[], None]) -> None:
        """Call `fn()` when `fd` is readable (loop thread only)."""
        self._readers[fd] = fn
        self.poller.register(fd, zmq.POLLIN)

    def remove_reader(self, fd: int) -> None:
        """Stop watching `fd` (a reader's or a writer's)."""
        if self._readers.pop(fd, None) is not None or self._writers.pop(fd, None) is not None:
            try:
                self.poller.unregister(fd)
            except KeyError:
                pass

    remove_writer = remove_reader

    def add_writer(self, fd: int, fn: Callable[[], None]) -> None:
        """Call `fn()` when `fd` is writable (loop thread only; never also a reader's fd)."""
        if fd not in self._writers:
            self._writers[fd] = fn
            self.poller.register(fd, zmq.POLLOUT)

    def forget_peer(self, addr: str) -> None:
        """Close the sockets to a peer that is gone, dropping what they had queued (loop
        thread; other threads close theirs on their next send)."""
        s = self._out.pop(addr, None)
        if s is not None:
            s.close(linger=0)
        gen = self._forget_gen + 1
        _remember_forgotten(self._forgotten, addr, gen, self._senders)
        self._forget_gen = gen  # published after the address is recorded

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
    def new_push_socket(self, addr: str) -> zmq.Socket:
        """A PUSH socket connected to `addr` (CurveZMQ for TCP peers), for one owning thread."""
        return _push_socket(self.ctx, addr, self.peer_keys.get(addr, self.keys))

    def new_sender(self, addr: str, lock: Optional[threading.Lock]) -> Any:
        """What one owner sends to `addr` with: the datagram lane to an ipc inbox (the
        owner's sends under `lock`; None: the loop's own), else a PUSH socket."""
        if self.lane and addr[:6] == "ipc://":
            return LaneSender(self, addr, lock)
        return self.new_push_socket(addr)

    def _send_from_loop(self, addr: str, frames: list) -> None:
        s = self._out.get(addr)
        try:
            if s is None:
                s = self._out[addr] = self.new_sender(addr, None)
            send_frames(s, frames)
            self.stats.loop_sent += 1
        except zmq.ZMQError as e:
            log.warning("send to %s failed: %s", addr, e)

    def drain_inbox(self, sock: zmq.Socket) -> None:
        """Receive and dispatch what waits in `sock` (loop thread)."""
        receive.drain(self, sock)

    def _run_calls(self) -> None:
        calls = self._calls
        n = len(calls)
        for _ in range(n):
            fn, args = calls.popleft()
            try:
                fn(*args)
            except Exception:
                log.exception("%s: callback %r failed", self.name, fn)

    def _run(self) -> None:
        self.thread_id = threading.get_ident()
        wake_fd = self._wake_fd
        inbox = self.inbox
        # what the poller reports for the inbox, when this thread watches it (a shared
        # inbox's descriptor is a reader's: transport.inbox.SharedInbox takes its lock)
        inbox_fd = _pollable(inbox) if self.shared_inbox is None else None
        try:
            while True:
                self._run_calls()
                timeout = self.timers.run_due()
                if self._stopping:
                    self._run_calls()
                    break
                self._sleeping = True
                if self._calls:
                    self._sleeping = False
                    continue
                events = self.poller.poll(int(timeout * 1000) + 1)
                self._sleeping = False
                for what, _ in events:
                    if what == inbox_fd:
                        self.drain_inbox(inbox)
                    elif isinstance(what, zmq.Socket):
                        self.drain_inbox(what)
                    elif what == wake_fd:
                        try:
                            os.eventfd_read(wake_fd)
                        except BlockingIOError:
                            pass
                    else:
                        fn = self._readers.get(what) or self._writers.get(what)
                        if fn is not None:
                            try:
                                fn()
                            except Exception:
                                log.exception("%s: reader for fd %s failed", self.name, what)
        finally:
            self._close()

    def _close(self) -> None:
        for fn in self.on_close:
            try:
                fn()
            except Exception:
                log.exception("%s: close hook %r failed", self.name, fn)
        for senders in list(self._senders):  # threads still alive: their sockets end here
            senders.close(linger=200)
        for s in [*self._out.values(), *self._extra, self.inbox]:
            try:
                s.close(linger=0 if s is self.inbox or s in self._extra else 200)
            except zmq.ZMQError:
                pass
        self._out.clear()
        self.lanes.finish()  # backlogs still waiting for room: out now, or dropped
        self.listener.close()
        try:
            self.ctx.term()
        except zmq.ZMQError:
            pass
        try:
            os.close(self._wake_fd)
        except OSError:
            pass


def lane_env(loop: IOLoop) -> dict[str, str]:
    """The environment that gives a child the datagram lane setting `loop` runs with: the
    processes that talk by ipc must agree on it (an agent pins its procs' to its own, as a
    controller pins its local agents', whatever their environment or configure() says)."""
    return {SETTINGS["datagram_lane"].env: "1" if loop.lane else "0"}


def _pollable(inbox: Any) -> Any:
    """What the poller watches for an inbox: a lane's (level-triggered) descriptor, or the
    zmq socket itself (never its edge-triggered `fd`, which zmq's poll handles)."""
    return inbox.fd if isinstance(inbox, LaneInbox) else inbox


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
        """Run what is due; returns the seconds until the next timer (1 s when none)."""
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
        return 1.0


def _push_socket(ctx: zmq.Context, addr: str, keys: Optional[CurveKeys]) -> zmq.Socket:
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.SNDHWM, 0)
    s.setsockopt(zmq.LINGER, 2000)
    s.setsockopt(zmq.RECONNECT_IVL, 10)
    s.setsockopt(zmq.RECONNECT_IVL_MAX, 0)  # constant 10 ms: procs bind soon after spawn
    if addr.startswith("tcp://") and keys is not None:
        s.curve_serverkey = keys.public
        s.curve_publickey = keys.public
        s.curve_secretkey = keys.secret
    s.connect(addr)
    return s


def _remember_forgotten(forgotten: collections.OrderedDict, addr: str, gen: int,
                        senders: "weakref.WeakSet[ThreadSenders]") -> None:
    """Record `addr` as forgotten at generation `gen`, and keep only the addresses some
    sending thread still has a socket for (that thread closes it on its next send): the
    table stays as small as what is left to close, even when threads sit idle."""
    forgotten.pop(addr, None)
    forgotten[addr] = gen
    try:
        held = [t.socks for t in list(senders)]  # dict membership reads are atomic
    except RuntimeError:  # a thread made its senders meanwhile: trim next time
        return
    for a in [a for a in forgotten if not any(a in socks for socks in held)]:
        del forgotten[a]
    while len(forgotten) > 4096:
        forgotten.popitem(last=False)


class LoopStats:
    """Counters of one loop: messages sent (by every thread), received and dropped."""

    __slots__ = ("loop", "loop_sent", "retired_sent", "received", "dropped", "actor_read")

    def __init__(self, loop: IOLoop) -> None:
        self.loop = loop
        self.loop_sent = 0
        self.retired_sent = 0
        self.received = 0  # every message received, by any thread
        self.dropped = 0
        self.actor_read = 0  # of those, read by an actor thread (transport.inbox.SharedInbox)

    def __getitem__(self, key: str) -> int:
        if key == "sent":
            return self.loop_sent + self.retired_sent + sum(s.sent for s in list(self.loop._senders))
        if key in ("received", "dropped", "actor_read"):
            return getattr(self, key)
        raise KeyError(key)
