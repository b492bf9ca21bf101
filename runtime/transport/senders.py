"""The send sockets of one thread, and how a burst of small messages goes out as one.

A thread that sends (a caller in a controller, an actor thread in a proc) owns a PUSH socket
per peer address (`ThreadSenders`). Each zmq send wakes zmq's own I/O thread, which costs more
than the send itself when a thread sends many small messages with Python work in between
(pipelined calls, the replies to them). So a thread *holds* a small message that follows its
previous one to the same address within `BURST_GAP_S`, without having waited since, and sends
what it holds as one frame (`framing.pack_coalesced`):

- when it has `MAX_HELD` messages or `MAX_HELD_BYTES` bytes;
- before it sends to another address, or a message that is not small (its order is kept);
- before it waits: `Future.get()`, `await`, an actor thread going to read or wait for its
  next message, a hand-off to the I/O thread (`before_block`);
- at the latest `FLUSH_AFTER_S` after it began holding, by the I/O thread (a thread that
  goes on computing without waiting), which takes the lock and sends on the same socket;
  while the holder runs Python without pause that is up to the interpreter's switch
  interval (5 ms) later;
- when the thread ends or the loop stops.

Receivers unpack the frame and handle each message as if it had come alone (its token is
checked as always). A thread that waits between its sends (one call, then `get()`) never
holds anything: a message alone leaves at once.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

import zmq

from . import framing

if TYPE_CHECKING:
    from .loop import IOLoop

log = logging.getLogger("runtime.transport")

#: a message sent within this long after the previous one to the same address (and no wait
#: in between) is held: the thread is sending a burst
BURST_GAP_S = 100e-6
#: what a thread holds for one address at most before sending it
MAX_HELD = 64
MAX_HELD_BYTES = 60 << 10  # a burst then fits one datagram (transport/datagram.py)
#: only one-frame messages up to this size are held
MAX_HELD_MESSAGE = 16 << 10
#: the I/O thread sends what a thread still holds this long after it began holding
FLUSH_AFTER_S = 200e-6

_NOBLOCK = int(zmq.NOBLOCK)


def send_frames(s: zmq.Socket, frames: list) -> None:
    """Send a frame list without blocking: a lone head frame copied (cheapest for small
    messages), bodies and buffers without a copy."""
    if len(frames) == 1:
        s.send(frames[0], _NOBLOCK)
    else:
        s.send_multipart(frames, copy=False, flags=_NOBLOCK)


class ThreadSenders:
    """The send sockets one thread owns, one per peer address, and the messages it holds
    for one of them; closed when the thread ends (its thread-local storage is dropped) or
    when the loop stops. `lock` guards the sockets and the held messages: the I/O thread
    takes it to send what a thread held too long.

    The owning thread can be *re-entered* while it holds the lock: the cyclic garbage
    collector runs finalizers and weakref callbacks at any allocation, and one of them may
    send or schedule work. `inside` (set by the owner around its send) tells: such a send
    goes by the I/O thread and `before_block` does nothing, instead of waiting forever for
    the lock its own thread holds (which also left the collector stuck, so nothing cyclic
    was ever freed again, and the thread blocked the interpreter's exit)."""

    __slots__ = ("loop", "socks", "gen", "sent", "lock", "coalesce", "last_addr", "last_t",
                 "held", "held_addr", "held_bytes", "inside", "__weakref__")

    def __init__(self, loop: "IOLoop", coalesce: bool = True) -> None:
        self.loop = loop
        self.socks: dict[str, zmq.Socket] = {}
        self.gen = loop._forget_gen
        self.sent = 0
        self.lock = threading.Lock()
        self.coalesce = coalesce
        self.last_addr = ""  # where this thread sent last, and when (0: it waited since)
        self.last_t = 0.0
        self.held: list[bytes] = []
        self.held_addr = ""
        self.held_bytes = 0
        self.inside = False  # the owning thread is in `send` (see the class docstring)

    def send(self, addr: str, frames: list) -> None:
        """Send `frames` to `addr`, or hold them (a small message in a burst)."""
        if self.inside:  # re-entered by a finalizer: the lock is this thread's own
            loop = self.loop
            loop.schedule(loop.send, addr, frames)
            return
        with self.lock:
            self.inside = True
            try:
                self._send_or_hold(addr, frames)
            finally:
                self.inside = False

    def _send_or_hold(self, addr: str, frames: list) -> None:
        """`send`, lock held."""
        if self.gen != self.loop._forget_gen:
            self._drop_forgotten()
        frame = frames[0] if self.coalesce and len(frames) == 1 else b""
        n = len(frame)
        if not 0 < n <= MAX_HELD_MESSAGE:  # not holdable: what is held goes first
            if self.held:
                self._flush()
            self.last_t = 0.0
            self._send(addr, frames)
            return
        if self.held and self.held_addr == addr:  # the burst goes on
            self.held.append(frame)
            self.held_bytes += n
            if len(self.held) >= MAX_HELD or self.held_bytes >= MAX_HELD_BYTES:
                self._flush()
            return
        if self.held:
            self._flush()
        now = time.monotonic()
        if self.last_addr == addr and now - self.last_t < BURST_GAP_S:  # a burst begins
            self.held.append(frame)
            self.held_addr = addr
            self.held_bytes = n
            self.last_t = now
            loop = self.loop
            loop.schedule(loop.call_later, FLUSH_AFTER_S, self.flush_late)
            return
        self.last_addr, self.last_t = addr, now
        self._send(addr, frames)

    def before_block(self) -> None:
        """The thread is about to wait: send what it holds, and end its burst (not when
        re-entered inside its own send: that send goes on)."""
        if (self.held or self.last_t) and not self.inside:
            with self.lock:
                if self.held:
                    self._flush()
                self.last_t = 0.0

    def flush_late(self) -> None:
        """Send what the thread still holds (I/O thread, `FLUSH_AFTER_S` after it began)."""
        if self.held:
            with self.lock:
                if self.held:
                    self._flush()

    def close(self, linger: int = 2000) -> None:
        with self.lock:
            if self.held:
                self._flush()
            self.loop.stats.retired_sent += self.sent
            self.sent = 0
            socks, self.socks = self.socks, {}
        for s in socks.values():
            try:
                s.close(linger=linger)
            except zmq.ZMQError:
                pass

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- lock held ------------------------------------------------------------------------
    def _flush(self) -> None:
        held, addr = self.held, self.held_addr
        self.held = []
        self.held_bytes = 0
        if len(held) == 1:
            self._send(addr, held)
            return
        self._send(addr, [framing.pack_coalesced(held)], len(held))

    def _send(self, addr: str, frames: list, count: int = 1) -> None:
        s = self.socks.get(addr)
        try:
            if s is None:
                s = self.socks[addr] = self.loop.new_sender(addr, self.lock)
            send_frames(s, frames)
            self.sent += count
        except zmq.ZMQError as e:
            log.warning("send to %s failed: %s", addr, e)

    def _drop_forgotten(self) -> None:
        """Peers that died: drop their sockets (and anything held for them)."""
        loop = self.loop
        gen = loop._forget_gen
        for a in [a for a in self.socks if a in loop._forgotten]:
            self.socks.pop(a).close(linger=0)
        if self.held and self.held_addr in loop._forgotten:
            self.held = []
            self.held_bytes = 0
        self.gen = gen  # after the check: the loop then trims what every thread saw
