"""Reply inboxes of the threads that wait: a caller receives its own replies.

A thread that calls actors in local procs gets a PULL socket of its own (ipc, in the run
directory), and its calls name that socket as their reply address. The thread that holds
the inbox's lock owns the socket, one thread at a time:

- a thread waiting in `Future.get()` for a reply that comes to its own inbox takes the lock
  and receives, checks and delivers the replies itself (no hop through the I/O thread, no
  wake-up of it);
- otherwise the I/O thread: it watches the socket's file descriptor and drains the socket
  when the lock is free (replies of futures awaited in asyncio, waited on by another thread,
  or not waited on yet). When it finds the lock taken, it stops watching (the waiting thread
  reads what comes) and looks again after `RECHECK_S` (doubling up to `RECHECK_MAX_S`), so
  a thread that calls and waits in a loop does not wake it per reply.

Replies go to ports, which are per process: whichever thread drains an inbox delivers every
reply in it to its port. A thread that ends gives its inbox back to a pool; the next thread
that needs one takes it, so a process has as many inboxes as it had threads calling at once.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable, Optional

import zmq

from . import framing, receive
from .datagram import LaneInbox

log = logging.getLogger("runtime.transport")

Handler = Callable[[framing.Header, Any, list], None]

#: how often the I/O thread looks again at an inbox it found taken by the thread reading it
#: (doubling up to RECHECK_MAX_S while that thread goes on reading)
RECHECK_S = 0.002
RECHECK_MAX_S = 0.02
#: how many of its latest answered calls an actor names in its failure report (an older
#: answer still in flight then is failed by the report, as before: `after_replies` counts it
#: only if it has arrived)
ANSWERED_KEPT = 64
#: the message that wakes a waiting owner (not a framed message: no token)
WAKE = b""
#: messages drained in one go before other work gets a turn
_BATCH = 1000
#: messages an actor thread routes after a call for itself, before it runs that call
_BURST = 64
# plain ints: pyzmq's enum flags make `&` and option reads slow Python calls
_EVENTS, _POLLIN, _RCVMORE = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.RCVMORE)
_NOBLOCK = int(zmq.NOBLOCK)
_COALESCED = receive.COALESCED
_CLEN = receive.CLEN


def process_address(reply_address: str) -> str:
    """The process inbox behind a reply address: a thread's inbox `<process>-t<n>` gives
    `<process>`, anything else itself. A proc sends error replies there, so that they keep
    their order with the failure reports it sends to the same socket."""
    if reply_address[:6] == "ipc://":
        head, sep, tail = reply_address.rpartition("-t")
        if sep and tail.isdigit():
            return head
    return reply_address


#: reply address -> whether it is a thread's inbox (`Answered.note` asks once per call)
_is_thread_inbox: dict[str, bool] = {}


class Answered:
    """The latest calls an actor answered to a thread's reply inbox (reply address, port),
    named in its failure report: those answers travel by another socket than the report,
    in no order with it, so its caller waits for them instead of failing the calls."""

    __slots__ = ("ring",)

    def __init__(self) -> None:
        self.ring: Any = collections.deque(maxlen=ANSWERED_KEPT)

    def note(self, address: str, port: int) -> None:
        """A result for `port` goes to `address` (any thread): kept if that is a thread's
        inbox (a process inbox keeps its order with the report)."""
        if port:
            thread = _is_thread_inbox.get(address)
            if thread is None:
                thread = address[:6] == "ipc://" and process_address(address) != address
                if len(_is_thread_inbox) > 4096:
                    _is_thread_inbox.clear()
                _is_thread_inbox[address] = thread
            if thread:
                self.ring.append((address, port))

    def has(self, address: str, port: int) -> bool:
        """Whether the answer for `port` to `address` is among the kept ones."""
        return (address, port) in list(self.ring)

    def report(self) -> dict[str, list[int]]:
        """The kept answers for a failure report: {reply address: [port, ...]}."""
        out: dict[str, list[int]] = {}
        for address, port in list(self.ring):
            out.setdefault(address, []).append(port)
        return out


def answered_ports(report: Any, address: str) -> frozenset:
    """The ports of the process whose inbox is `address` that a failure report
    (`Answered.report()`) says its actor answered: their answers are on their way."""
    if not isinstance(report, dict):
        return frozenset()
    return frozenset(p for a, ports in report.items()
                     if isinstance(a, str) and process_address(a) == address
                     for p in ports if isinstance(p, int))


class ThreadInbox:
    """One thread's reply socket and its lock."""

    __slots__ = ("hub", "address", "sock", "fd", "lock", "owner", "closing", "watched",
                 "rechecking", "timeout_ms", "deferred", "__weakref__")

    def __init__(self, hub: "ThreadInboxes", address: str, sock: zmq.Socket) -> None:
        self.hub = hub
        self.address = address
        self.sock = sock
        self.fd: int = sock.getsockopt(zmq.FD)
        self.lock = threading.RLock()  # re-entrant: a done-callback may wait on a future
        self.owner: Optional[int] = threading.get_ident()
        self.closing = False
        self.watched = False  # the I/O thread polls `fd` (I/O thread only)
        self.rechecking = False
        self.timeout_ms = -1  # the socket's receive timeout (owner only)
        self.deferred: Any = collections.deque()  # failures to apply after the next drain

    # -- the owning thread ------------------------------------------------------------------
    def wake(self, _fut: Any = None) -> None:
        """Wake the owner from its receive (a future it waits on was resolved by another
        thread: a failure, a large reply read off the I/O thread): an empty message."""
        if threading.get_ident() != self.owner and not self.closing:
            self.hub.loop.send(self.address, [WAKE])

    def pump(self, fut: Any, timeout: float) -> Optional[bool]:
        """Receive and deliver replies on this thread until `fut` is done (True) or
        `timeout` passes (False); None: the inbox is closing, wait on the future instead."""
        if self.closing or not self.lock.acquire(True, timeout):
            return None if self.closing else fut.done()
        try:
            sock = self.sock
            ms = max(1, int(timeout * 1000))
            if ms != self.timeout_ms:
                sock.setsockopt(zmq.RCVTIMEO, ms)
                self.timeout_ms = ms
            deadline = time.monotonic() + timeout
            while True:
                # zmq answers "is anything waiting?" with a poll(2): asked only where it
                # matters, before failures deferred behind the queued replies run and
                # once the future is done (what else waits is delivered before the lock
                # goes back); the blocking receive below returns a waiting message at once
                if self.deferred and not self.drain():
                    continue  # a full batch: more waits
                if fut.done():
                    while not self.drain():
                        pass
                    return True
                if self.closing:
                    return None
                try:
                    head = sock.recv()  # blocks (without the GIL) up to the timeout
                except zmq.Again:
                    if time.monotonic() >= deadline:
                        return False
                    continue
                self._handle(head)
        except zmq.ZMQError:
            return None if self.closing else fut.done()
        finally:
            self.lock.release()

    # -- whoever holds the lock ---------------------------------------------------------------
    def drain(self) -> bool:
        """Deliver what waits in the socket, then the failures deferred behind it (lock
        held); False if a batch's worth was left. Asks zmq first: an empty socket's
        `zmq.Again` costs more than the question."""
        sock = self.sock
        for _ in range(_BATCH):
            if not sock.getsockopt(_EVENTS) & _POLLIN:
                deferred = self.deferred
                while deferred:
                    fn = deferred.popleft()
                    try:
                        fn()
                    except Exception:
                        log.exception("%s: a deferred failure raised", self.address)
                return True
            self._handle(sock.recv(_NOBLOCK))
        return False

    def after_replies(self, fn: Callable[[], None]) -> None:
        """Run `fn` (a call's failure) once the replies already in this inbox have been
        delivered (I/O thread): a reply its actor sent before failing still counts. Now
        when the lock is free; else its holder runs it after its next drain (woken for it),
        and the I/O thread makes sure within `RECHECK_MAX_S`."""
        if self.lock.acquire(False):
            try:
                self.drain()
            finally:
                self.lock.release()
            fn()
            return
        self.deferred.append(fn)
        self.wake()
        self.hub.loop.call_later(RECHECK_MAX_S, self.hub.flush_deferred, self)

    def _handle(self, head: bytes) -> None:
        """Check and deliver the message whose first frame is `head`."""
        sock = self.sock
        frames = [head]
        if sock.getsockopt(_RCVMORE):
            frames += sock.recv_multipart(flags=_NOBLOCK, copy=False)
        elif head == WAKE:
            return
        elif head[:_CLEN] == _COALESCED:
            for one in receive.unpack(self.hub.loop, head):
                self._deliver([one])
            return
        self._deliver(frames)

    def _deliver(self, frames: list) -> None:
        try:
            header, body, buffers = framing.parse(frames, self.hub.tokens)
        except framing.FrameError as e:
            log.warning("%s: dropped a message that is not from this session (%s): %s",
                        self.address, e, framing.summarize(frames))
            return
        try:
            self.hub.on_message(header, body, buffers)
        except Exception:
            log.exception("%s: handler failed for message kind %s", self.address, header.kind)


class _Holder:
    """A thread's claim on an inbox; dropped with the thread's locals when it ends."""

    __slots__ = ("inbox",)

    def __init__(self, inbox: ThreadInbox) -> None:
        self.inbox = inbox

    def __del__(self) -> None:
        inbox = self.inbox
        inbox.owner = None
        inbox.hub.free.append(inbox)


class ThreadInboxes:
    """The reply inboxes of one process's threads, watched by its I/O thread."""

    def __init__(self, loop: Any, prefix: str, tokens: list, on_message: Handler) -> None:
        self.loop = loop  # transport.loop.IOLoop
        self.prefix = prefix  # "ipc://<rundir>/<proc id>": inboxes are <prefix>-t<n>
        self.tokens = tokens  # accepted session tokens (the loop's list, shared)
        self.on_message = on_message
        self.free: list[ThreadInbox] = []
        self.all: list[ThreadInbox] = []
        self._tls = threading.local()
        self._lock = threading.Lock()
        self._closed = False
        loop.on_close.append(self.close_all)

    def for_this_thread(self) -> Optional[ThreadInbox]:
        """This thread's inbox (made, or taken from the pool, on first use); None once the
        loop stops or from the I/O thread itself."""
        holder = self._tls.__dict__.get("h")
        if holder is not None:
            return holder.inbox
        if self._closed or self.loop.in_loop():
            return None
        with self._lock:
            if self._closed:
                return None
            if self.free:
                inbox = self.free.pop()
                inbox.owner = threading.get_ident()
            else:
                inbox = self._new()
        self._tls.h = _Holder(inbox)
        return inbox

    def _new(self) -> ThreadInbox:
        address = f"{self.prefix}-t{len(self.all)}"
        sock = self.loop.ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(address)
        if not self.loop.lane:
            inbox = ThreadInbox(self, address, sock)
        else:
            lane = LaneInbox(sock, address, self.tokens, self.loop.stats)
            inbox = ThreadInbox(self, address, lane)
            self.loop.lanes.add_inbox(lane, inbox.lock)
        self.all.append(inbox)
        self.loop.call_soon(self._watch, inbox)
        return inbox

    def sizes(self) -> dict[str, int]:
        """How many inboxes exist and how many wait in the pool (for table_sizes)."""
        return {"thread_inboxes": len(self.all), "thread_inboxes_free": len(self.free)}

    # -- the I/O thread -----------------------------------------------------------------------
    def _watch(self, inbox: ThreadInbox) -> None:
        if not inbox.closing and not inbox.watched:
            inbox.watched = True
            self.loop.add_reader(inbox.fd, lambda: self._readable(inbox))

    def _readable(self, inbox: ThreadInbox) -> None:
        if inbox.lock.acquire(False):
            try:
                done = inbox.drain()
            finally:
                inbox.lock.release()
            if not done:
                self.loop.call_soon(self._readable, inbox)
            return
        # its thread is waiting and reads what comes: stop watching, look again soon
        self.loop.remove_reader(inbox.fd)
        inbox.watched = False
        if not inbox.rechecking:
            inbox.rechecking = True
            self.loop.call_later(RECHECK_S, self._recheck, inbox)

    def _recheck(self, inbox: ThreadInbox, after: float = RECHECK_S) -> None:
        if inbox.closing:
            return
        if not inbox.lock.acquire(False):  # still waiting: look less often (a long call)
            after = min(after * 2, RECHECK_MAX_S)
            self.loop.call_later(after, self._recheck, inbox, after)
            return
        try:
            inbox.rechecking = False
            inbox.drain()
            self._watch(inbox)  # the fd becomes readable if something is left or comes
        finally:
            inbox.lock.release()

    def flush_deferred(self, inbox: ThreadInbox) -> None:
        """Run the failures an inbox's holder has not run yet (I/O thread)."""
        if not inbox.deferred or inbox.closing:
            return
        if inbox.lock.acquire(False):
            try:
                inbox.drain()
            finally:
                inbox.lock.release()
        else:
            self.loop.call_later(RECHECK_MAX_S, self.flush_deferred, inbox)

    def close_all(self) -> None:
        """Close every inbox (the loop is stopping): waiting owners go back to waiting on
        their futures; the sockets' files are removed."""
        with self._lock:
            self._closed = True
            inboxes, self.all, self.free = self.all, [], []
        for inbox in inboxes:
            inbox.closing = True
            self.loop._send_from_loop(inbox.address, [WAKE])  # a blocked owner returns
        for inbox in inboxes:
            self.loop.remove_reader(inbox.fd)
            got = inbox.lock.acquire(True, 1.0)
            try:
                inbox.sock.close(linger=0)
            except zmq.ZMQError:
                pass
            finally:
                if got:
                    inbox.lock.release()


class SharedInbox:
    """A proc's inbox, read by an idle actor thread instead of its I/O thread.

    An actor thread with nothing to do takes the lock and blocks in `recv`: a call for
    itself it runs at once (no hop through the I/O thread, no wake-up of it); a call for
    another actor of the proc goes to that actor's mailbox; anything else (heartbeats,
    stops, replies, supervision, a call while earlier hand-offs wait) is handed to the I/O
    thread, in order: while hand-offs wait there, every message is handed off, so each
    sender's messages keep their order. Without a reading actor the I/O thread drains the
    inbox (it watches the socket's descriptor, as for `ThreadInbox`, looking again at
    most every `RECHECK_MAX_S` while an actor reads). A put into the reading actor's
    mailbox wakes it with an empty message to the inbox (`wake`).
    """

    def __init__(self, loop: Any) -> None:
        self.loop = loop  # transport.loop.IOLoop, whose inbox this shares (before start)
        self.sock = loop.inbox
        self.fd: int = self.sock.getsockopt(zmq.FD)
        self.sock.setsockopt(zmq.RCVTIMEO, 100)  # a reader looks at `closing` that often
        self.lock = threading.Lock()
        loop.lanes.set_lock(self.sock, self.lock)
        self.reader: Optional[int] = None  # the thread reading, while one does
        self.pending: Any = collections.deque()  # messages handed to the I/O thread
        self.closing = False
        self.watched = False
        self.rechecking = False
        self.recheck_s = RECHECK_S
        self.free_once = False  # the lock was free at the last look (I/O thread)
        loop.shared_inbox = self
        loop.on_close.append(self._close)

    # -- an actor thread ------------------------------------------------------------------
    def read(self, route: Callable[[framing.Header, Any, list], Any],
             idle: Callable[[], bool], keep: Callable[[Any], None]) -> Any:
        """Read the inbox on this thread while `idle()` holds (the actor's mailbox is
        empty). `route(h, body, buffers)` returns a value to return (a call to run here),
        True (it took the message), or False (hand it to the I/O thread). Returns None when
        the lock is taken, the actor is no longer idle, or the inbox closes. Before it
        returns a call, what already waits is routed too (a burst of pipelined calls stays
        on this thread): a second value to run here goes to `keep` (the mailbox)."""
        if self.closing or not self.lock.acquire(False):
            return None
        self.reader = threading.get_ident()
        empty = False
        try:
            sock = self.sock
            while idle() and not self.closing:
                try:
                    got = self._take(sock.recv(), route, keep)
                except zmq.Again:
                    continue
                if got is not None:
                    for _ in range(_BURST):
                        if not sock.getsockopt(_EVENTS) & _POLLIN:
                            empty = True  # asked just now (a poll(2) each time)
                            break
                        self._take(sock.recv(_NOBLOCK), route, keep, keep)
                    return got
            return None
        except zmq.ZMQError:
            return None
        finally:
            self.reader = None
            try:  # zmq signals the descriptor again only once asked: messages left wait
                left = not self.closing and not empty and \
                    self.sock.getsockopt(_EVENTS) & _POLLIN
            except zmq.ZMQError:
                left = False
            self.lock.release()
            if left:
                self.loop.call_soon(self._readable)

    def _take(self, head: bytes, route: Callable[[framing.Header, Any, list], Any],
              keep: Callable[[Any], None], got: Optional[Callable[[Any], None]] = None) -> Any:
        """Route the message whose first frame is `head` (lock held). A call to run here is
        returned, or given to `got` when that is set; of a coalesced frame's messages, the
        first such call is, and the next ones go to `keep`, in order."""
        sock = self.sock
        frames = [head]
        if sock.getsockopt(_RCVMORE):
            frames += sock.recv_multipart(flags=_NOBLOCK, copy=False)
        elif head == WAKE:
            return None
        elif head[:_CLEN] == _COALESCED:
            first = None
            for one in receive.unpack(self.loop, head):
                call = self._route_one([one], route)
                if call is None:
                    continue
                if first is None and got is None:
                    first = call
                else:
                    keep(call)
            return first
        call = self._route_one(frames, route)
        if call is not None and got is not None:
            got(call)
            return None
        return call

    def _route_one(self, frames: list, route: Callable[[framing.Header, Any, list], Any]) -> Any:
        stats = self.loop.stats
        try:
            h, body, buffers = framing.parse(frames, self.loop.tokens)
        except framing.FrameError as e:
            stats.dropped += 1
            log.warning("%s: dropped a message that is not from this session (%s): %s",
                        self.loop.name, e, framing.summarize(frames))
            return None
        stats.received += 1
        stats.actor_read += 1
        pending = self.pending
        if not pending:
            got = route(h, body, buffers)
            if got is True:
                return None
            if got is not False:
                return got
        pending.append((h, body, buffers))
        self.loop.call_soon(self._run_pending)
        return None

    def wake(self) -> None:
        """Wake the reading thread (something was put in its mailbox), unless it is us."""
        reader = self.reader
        if reader is not None and reader != threading.get_ident() and not self.closing:
            self.loop.send(self.loop.address, [WAKE])

    # -- the I/O thread ----------------------------------------------------------------------
    def start(self) -> None:
        """Watch the inbox (I/O thread)."""
        self._watch()

    def _run_pending(self) -> None:
        pending, dispatch = self.pending, self.loop.on_message
        while pending:
            h, body, buffers = pending[0]
            try:
                dispatch(h, body, buffers)
            except Exception:
                log.exception("%s: handler failed for message kind %s", self.loop.name, h.kind)
            pending.popleft()  # after: a reader hands off while this one is not done

    def _watch(self) -> None:
        if not self.closing and not self.watched:
            self.watched = True
            self.loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        if not self.lock.acquire(False):  # an actor reads: let it, look again later
            self.loop.remove_reader(self.fd)
            self.watched = False
            if not self.rechecking:
                self.rechecking = True
                self.loop.call_later(self.recheck_s, self._recheck)
            return
        try:
            self._run_pending()
            self.loop.drain_inbox(self.sock)
            more = self.sock.getsockopt(_EVENTS) & _POLLIN
        finally:
            self.lock.release()
        if more:
            self.loop.call_soon(self._readable)

    def _recheck(self) -> None:  # `rechecking` stays set: this chain is the only one
        if self.closing:
            self.rechecking = False
            return
        if self.lock.locked():  # an actor reads: look less often while it goes on
            self.recheck_s = min(self.recheck_s * 2, RECHECK_MAX_S)
            self.free_once = False
        elif not self.free_once:  # free now: an actor may be between two calls; drain
            self.free_once = True  # what waits, and watch only if it stays free
            self.recheck_s = RECHECK_S
            self._readable()
        else:
            self.free_once = False
            self.rechecking = False
            self._watch()
            self._readable()
            return
        self.loop.call_later(self.recheck_s, self._recheck)

    def _close(self) -> None:
        """The loop stops: a reader returns, and the socket is the loop's again."""
        self.closing = True
        self.loop.remove_reader(self.fd)
        self.loop._send_from_loop(self.loop.address, [WAKE])
        if self.lock.acquire(True, 1.0):
            self.lock.release()
