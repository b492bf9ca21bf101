"""A gateway: one TCP port through which a controller outside the cluster drives a job.

The controller (a notebook on a laptop, behind `ssh -L`) opens the only connection: a zmq
DEALER to the gateway's ROUTER, CurveZMQ with the cluster key (a client without it is
refused by the handshake and logged). Nothing inside the cluster dials the controller:

- controller -> peer: `[b"D", address, *message]` on the client connection; the gateway
  sends the message on its own CurveZMQ PUSH to `address` (one per peer, so the order per
  peer holds: one ordered connection, then one ordered PUSH).
- peer -> controller: every process of the job sends the controller's messages to the
  gateway's *inner* address (a CurveZMQ PULL on the cluster network), which is what the
  controller advertises as its own TCP address there (reply addresses, `this_proc()`
  actors, owner of the agents); the gateway passes each message on as `[b"D", *message]`.
- `[b"H"]` (client hello) -> `[b"W", inner address]`; a newer client replaces the older
  (it is told `[b"X", why]`). A send the gateway cannot make comes back as
  `[b"E", seq, address, port, text]` and fails that call at the controller.
- A cut connection loses nothing (`Resend`): each end numbers its messages (`seq`, 8
  bytes after the kind), keeps them until the other end confirms them (`[b"A", seq]`, sent
  after each batch read), and when zmq has connected again the client says what it has
  (`[b"R", seq]`); the gateway answers what it has (`[b"G", seq]`), and each sends again
  what the other lacks, in order; duplicates are skipped by number. What was let go over
  `gateway_buffer_bytes` and is needed is reported (`[b"L", seq]` from the gateway; the
  client's own by the same count) and fails the calls behind the gateway.

Messages are never unpickled here: a message whose head frame does not carry the cluster
token, a destination that is not `tcp://HOST:PORT`, or data from a client that did not say
hello is dropped with a log line and counted. docs/transport.md, "Through a gateway".
"""

from __future__ import annotations

import collections
import logging
import os
import re
import struct
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional

import zmq

from ..config import config
from .auth import CurveKeys, cluster_token
from .listen import Listener

if TYPE_CHECKING:
    from .loop import IOLoop

__all__ = [
    "HEARTBEAT_MS", "HEARTBEAT_TIMEOUT_MS", "MAX_PEERS", "client_gateways", "Kept", "Resend", "Receipt",
    "Gateway", "GatewayLink", "GatewayPeer", "main",
]

log = logging.getLogger("runtime.gateway")
_NOBLOCK = int(zmq.NOBLOCK)
_DEST = re.compile(r"tcp://[A-Za-z0-9._\-\[\]:]+:\d{1,5}")
#: zmq heartbeats on the client connection: an ssh tunnel that died silently is noticed
HEARTBEAT_MS, HEARTBEAT_TIMEOUT_MS = 1000, 5000
_PORT = struct.Struct("!Q")
_SEQ = _PORT
#: sockets to peers the gateway keeps open (the least recently used beyond it are closed)
MAX_PEERS = 1024
_links: "weakref.WeakSet[GatewayLink]" = weakref.WeakSet()  # this process's, as a client


def client_gateways() -> list[str]:
    """The gateways this process reaches a cluster through (open links): RDMA data, which
    dials its owner directly, is not relayed across them (runtime/rdma/client.py)."""
    return [link.address for link in list(_links) if not link.closed]


def _heartbeats(s: zmq.Socket) -> None:
    s.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
    s.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    s.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)


class Kept(NamedTuple):
    """A numbered message `Resend` keeps until the other end confirms it."""

    seq: int
    frames: list  # [kind, seq, *frames], as sent
    nbytes: int  # counted against the limit


class Resend:
    """The numbered messages one end of a gateway connection sent, kept until the other end
    confirms them, to send again after a cut (pure logic: no I/O). Bounded: past `limit`
    bytes the oldest are let go (`let_go`: the highest number no longer kept)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seq = 0  # the last number given
        self.kept: collections.deque[Kept] = collections.deque()
        self.bytes = 0
        self.let_go = 0

    def add(self, kind: bytes, frames: list) -> list:
        """Number a message of `kind`: returns its frames `[kind, seq, *frames]`, kept."""
        self.seq += 1
        msg = [kind, _SEQ.pack(self.seq), *frames]
        n = 64 + sum(_nbytes(f) for f in frames)
        self.kept.append(Kept(self.seq, msg, n))
        self.bytes += n
        while self.bytes > self.limit and len(self.kept) > 1:
            gone = self.kept.popleft()
            self.bytes -= gone.nbytes
            self.let_go = gone.seq
        return msg

    def confirmed(self, upto: int) -> None:
        """The other end has every message up to `upto`."""
        kept = self.kept
        while kept and kept[0].seq <= upto:
            self.bytes -= kept.popleft().nbytes

    def after(self, upto: int) -> list:
        """The kept messages the other end lacks, having everything up to `upto`."""
        self.confirmed(upto)
        return [k.frames for k in self.kept]

    def take_back(self) -> None:
        """Forget the message `add` numbered last (its send failed: never sent again)."""
        last = self.kept.pop()
        self.bytes -= last.nbytes
        self.seq -= 1

    def lost_after(self, upto: int) -> int:
        """How many messages the other end lacks that are no longer kept."""
        return max(0, self.let_go - upto)

    def reset(self) -> None:
        self.seq = self.bytes = self.let_go = 0
        self.kept.clear()


class Receipt:
    """The numbered messages one end has taken: each is handled once, in order."""

    def __init__(self) -> None:
        self.last = 0  # every message up to this one was handled
        self.acked = 0  # what the other end was last told

    def take(self, seq_frame: Any) -> bool:
        """Whether the message numbered `seq_frame` is the next one (handle it); False for
        one already handled, or one after a gap (what is missing comes again first)."""
        seq = _SEQ.unpack(_bytes(seq_frame))[0]
        if seq != self.last + 1:
            return False
        self.last = seq
        return True

    def ack(self) -> Optional[list]:
        """`[b"A", seq]` if there is something new to confirm, else None."""
        if self.last == self.acked:
            return None
        self.acked = self.last
        return [b"A", _SEQ.pack(self.last)]


def _bytes(f: Any) -> bytes:
    return f if isinstance(f, bytes) else f.bytes


def _nbytes(f: Any) -> int:
    if isinstance(f, (bytes, bytearray)):
        return len(f)
    if isinstance(f, zmq.Frame):
        return len(f.buffer)
    return memoryview(f).nbytes


class Gateway:
    """The relay: a ROUTER for the one client, a PULL for the job's processes, a PUSH per
    peer; one thread, so each direction keeps its order."""

    def __init__(self, keys: CurveKeys, listen: str, inner_ip: str,
                 max_message_bytes: int = 0) -> None:
        self.keys = keys
        self.token = cluster_token(keys)
        self.ctx = zmq.Context(io_threads=1)
        self.listener = Listener(self.ctx, max_message_bytes)
        self.front = self.ctx.socket(zmq.ROUTER)
        self.front.setsockopt(zmq.SNDHWM, 0)
        self.front.setsockopt(zmq.RCVHWM, 0)
        self.front.setsockopt(zmq.LINGER, 0)
        self.front.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a gone client is an error, not a drop
        self.front.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a client reconnecting keeps its place
        _heartbeats(self.front)
        self.inner = self.ctx.socket(zmq.PULL)
        self.inner.setsockopt(zmq.RCVHWM, 0)
        self.inner.setsockopt(zmq.LINGER, 0)
        try:
            self.address = self.listener.bind(self.front, listen, keys)
            self.inner_address = self.listener.bind(self.inner, f"tcp://{inner_ip}:0", keys)
        except BaseException:
            self.close()
            raise
        # handshakes that fail (a client without the cluster key) are logged here
        self.monitor = self.front.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        self.client: Optional[bytes] = None
        self.to_client = Resend(config.gateway_buffer_bytes)  # numbered, kept until confirmed
        self.from_client = Receipt()
        self.connected = False  # whether the client's connection takes messages now
        self.out: dict[str, zmq.Socket] = {}
        self.stats = {"to_peers": 0, "to_client": 0, "dropped": 0, "clients": 0,
                      "refused": 0}
        self._next_refusal_log = 0.0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # -- running ---------------------------------------------------------------------------
    def start(self) -> "Gateway":
        self._thread = threading.Thread(target=self._run, name="monarch-gateway", daemon=True)
        self._thread.start()
        log.info("gateway listening at %s; the job answers at %s", self.address,
                 self.inner_address)
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.close()

    def close(self) -> None:
        for s in [getattr(self, "monitor", None), self.front, self.inner, *self.out.values()]:
            if s is None:
                continue
            s.close(linger=0)
        self.out.clear()
        self.listener.close()
        self.ctx.term()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        poller.register(self.inner, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        while not self._stop.is_set():
            for sock, _ in poller.poll(200):
                if sock is self.monitor:
                    self._refused()
                    continue
                for _ in range(256):  # a turn for the other direction
                    try:
                        frames = sock.recv_multipart(_NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    try:
                        if sock is self.front:
                            self._from_client(frames)
                        else:
                            self._from_job(frames)
                    except Exception:
                        log.exception("gateway: relaying a message failed")
            if self.client is not None:
                ack = self.from_client.ack()  # what came from the client so far: confirmed
                if ack is not None:
                    self._send_client(ack)

    def _refused(self) -> None:
        from zmq.utils.monitor import recv_monitor_message

        while self.monitor.poll(0):
            ev = recv_monitor_message(self.monitor)
            self.stats["refused"] += 1
            now = time.monotonic()
            if now < self._next_refusal_log:
                continue  # a client retrying: logged at most once per 10 s, with a count
            self._next_refusal_log = now + 10.0
            log.warning("gateway %s: refused a client: the CurveZMQ handshake failed (%s, "
                        "code %s): it does not hold this cluster's key (%d refused so far)",
                        self.address, zmq.Event(ev["event"]).name, ev["value"],
                        self.stats["refused"])

    # -- the two directions ----------------------------------------------------------------
    def _drop(self, why: str) -> None:
        self.stats["dropped"] += 1
        log.warning("gateway: dropped %s", why)

    def _from_client(self, frames: list) -> None:
        ident, kind = frames[0].bytes, frames[1].bytes if len(frames) > 1 else b""
        if kind == b"H":
            if self.client is not None and self.client != ident:
                self._to(self.client, [b"X", b"another client attached to this gateway"])
            self.client = ident
            self.to_client.reset()  # a new session: numbers start again on both ends
            self.from_client = Receipt()
            self.connected = True
            self.stats["clients"] += 1
            log.info("gateway: a client attached (%d so far)", self.stats["clients"])
            self._to(ident, [b"W", self.inner_address.encode()])
            return
        if ident != self.client:
            return self._drop("a message from a client that is not the attached one")
        if kind in (b"A", b"R") and len(frames) == 3:
            upto = _SEQ.unpack(frames[2].bytes)[0]
            if kind == b"A":
                self.to_client.confirmed(upto)
            else:
                self._resume(upto)
            return
        if kind != b"D" or len(frames) < 5:
            return self._drop(f"a malformed client message ({len(frames)} frames)")
        if not self.from_client.take(frames[2]):
            return  # handled already, or after a gap: the client sends it again (`_resume`)
        dest = frames[3].bytes.decode("ascii", "replace")
        body = frames[4:]
        if not _DEST.fullmatch(dest):
            return self._drop(f"a message to {dest[:80]!r}, which is not tcp://HOST:PORT")
        if not body[0].bytes.startswith(self.token):
            return self._drop(f"a message to {dest} without the cluster's token")
        sock = self.out.pop(dest, None)  # most recently used last
        if sock is None:
            from .peers import push_socket

            sock = push_socket(self.ctx, dest, self.keys)
            if len(self.out) >= MAX_PEERS:  # the least recently used goes (dialed again
                old = next(iter(self.out))  # if it is needed again)
                self.out.pop(old).close(linger=2000)
        self.out[dest] = sock
        try:
            sock.send_multipart(body, _NOBLOCK, copy=False)
            self.stats["to_peers"] += 1
        except zmq.ZMQError as e:
            self._undeliverable(dest, body, f"the gateway could not send to {dest}: {e}")

    def _resume(self, upto: int) -> None:
        """The client is connected again and has our messages up to `upto`: tell it what we
        have of its own, then send again what it lacks, in order."""
        self.connected = True
        if not self._send_client([b"G", _SEQ.pack(self.from_client.last)]):
            return
        lost = self.to_client.lost_after(upto)
        if lost:
            log.warning("gateway: %d message(s) for the client were let go during the cut "
                        "(over gateway_buffer_bytes)", lost)
            if not self._send_client([b"L", _SEQ.pack(self.to_client.let_go)]):
                return
        for msg in self.to_client.after(upto):
            if not self._send_client(msg):
                return

    def _undeliverable(self, dest: str, body: list, text: str) -> None:
        from . import framing

        log.warning("gateway: %s", text)
        try:
            header, _, _ = framing.parse(body, [self.token])
            port = header.port if header.reply else 0
        except framing.FrameError:
            port = 0
        if port and self.client is not None:
            self._numbered(b"E", [dest.encode(), _PORT.pack(port), text.encode()])

    def _from_job(self, frames: list) -> None:
        if not frames[0].bytes.startswith(self.token):
            return self._drop("a message from the job without the cluster's token")
        if self.client is None:
            return self._drop("a message for the controller: no client is attached")
        self._numbered(b"D", frames)
        self.stats["to_client"] += 1

    def _numbered(self, kind: bytes, frames: list) -> None:
        """A message for the client: numbered and kept until confirmed; sent now if its
        connection takes it (else when it comes back, `_resume`)."""
        msg = self.to_client.add(kind, frames)
        if self.connected:
            self._send_client(msg)

    def _send_client(self, msg: list) -> bool:
        """Send to the attached client; False (and nothing more until it resumes) if its
        connection is down."""
        if self.client is None:
            return False
        try:
            self.front.send_multipart([self.client, *msg], _NOBLOCK, copy=False)
            return True
        except zmq.ZMQError as e:
            if self.connected:
                log.warning("gateway: the client's connection is down (%s); what comes for "
                            "it is kept until it returns", e)
            self.connected = False
            return False

    def _to(self, ident: bytes, frames: list) -> None:
        try:
            self.front.send_multipart([ident, *frames], _NOBLOCK, copy=False)
        except zmq.ZMQError as e:
            self._drop(f"a message for the client, which is not connected ({e})")


class GatewayLink:
    """The controller's end: one DEALER to a gateway, shared by every peer behind it."""

    def __init__(self, loop: "IOLoop", address: str, keys: CurveKeys) -> None:
        self.loop = loop
        self.address = address
        self.keys = keys
        self.lock = threading.Lock()
        self.inner_address = ""
        self.closed = ""  # why, once closed
        self.last_seen = time.monotonic()  # when the gateway last relayed anything here
        self.partition_reported = False
        self.outage = ""  # set while cut off within the lease: calls then fail at once
        self.sent = Resend(config.gateway_buffer_bytes)  # numbered, kept until confirmed
        self.got = Receipt()
        self.ack_due = False  # a confirmation is scheduled
        #: fn(text): messages were lost in a cut (let go over gateway_buffer_bytes): the
        #: calls behind this gateway fail (set by the runtime; I/O thread)
        self.on_loss: Optional[Callable[[str], None]] = None
        s = self.sock = loop.ctx.socket(zmq.DEALER)
        # a fixed identity: after a tunnel drops and zmq reconnects, the gateway still knows
        # this client (ROUTER_HANDOVER)
        s.setsockopt(zmq.ROUTING_ID, b"c" + os.urandom(15))
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.RCVHWM, 0)
        s.setsockopt(zmq.LINGER, 0)
        _heartbeats(s)
        s.curve_serverkey = keys.public
        s.curve_publickey = keys.public
        s.curve_secretkey = keys.secret
        # each connection made (the first, and each after a cut): say what came through
        self.monitor = s.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        s.connect(address)

    def hello(self, timeout: float) -> str:
        """Say hello and wait for the gateway's welcome (before the I/O thread reads this
        socket); returns the address the job reaches this controller at."""
        self.sock.send(b"H")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sock.poll(100):
                frames = self.sock.recv_multipart()
                if frames[0] == b"W" and len(frames) == 2:
                    self.inner_address = frames[1].decode()
                    return self.inner_address
        self.close("no welcome")
        raise TimeoutError(
            f"the gateway at {self.address} did not answer within {timeout:g} s: it must be "
            "running and reachable (is the ssh -L tunnel up?) and hold the same cluster key; "
            "a gateway holding another key refuses the connection")

    def start(self) -> None:
        """Hand the socket to the I/O loop, which reads what the gateway relays."""
        self.loop.watch_zmq(self.sock, self._readable)
        self.loop.watch_zmq(self.monitor, self._connected)
        _links.add(self)
        self.loop.on_close.append(lambda: self.close("this process's runtime stopped"))

    def silent_for(self, now: float) -> float:
        """Seconds since anything came through the gateway (heartbeats of every host behind
        it do, every `heartbeat_interval`)."""
        return now - self.last_seen

    def partition_cause(self, now: float, timeout: float, hosts: int) -> str:
        """The cause that fails the hosts behind a gateway that went silent: one partition
        (logged once per outage), not a failure of each host."""
        cause = (f"the connection to the gateway {self.address} is lost (nothing through it "
                 f"for {timeout:g} s): a partition between this controller and the {hosts} "
                 "host(s) behind it")
        if not self.partition_reported:
            self.partition_reported = True
            log.warning("%s: %s", self.loop.name, cause)
        return cause

    def peer(self, addr: str) -> "GatewayPeer":
        return GatewayPeer(self, addr)

    def send(self, dest: str, frames: list, port: int) -> None:
        error = ""
        with self.lock:
            if self.closed:
                error = f"the gateway connection ({self.address}) is closed: {self.closed}"
            elif self.outage and port:  # a call now would wait for nothing: it fails
                error = self.outage
            else:
                msg = self.sent.add(b"D", [dest.encode(), *frames])
                try:
                    self.sock.send_multipart(msg, _NOBLOCK, copy=False)
                except zmq.ZMQError as e:
                    self.sent.take_back()  # failed here: never sent again
                    error = f"send to {dest} through the gateway {self.address} failed: {e}"
        if error and port:
            self.loop.schedule(self.loop.peers.send_failed, dest, [port], error, False)

    def _readable(self, sock: zmq.Socket) -> None:
        for _ in range(256):
            with self.lock:
                if self.closed:
                    return
                try:
                    frames = sock.recv_multipart(_NOBLOCK, copy=False)
                except zmq.Again:
                    break
            self.last_seen = time.monotonic()
            if self.partition_reported:
                self.partition_reported, self.outage = False, ""
                log.warning("%s: the gateway %s answers again", self.loop.name, self.address)
            kind = frames[0].bytes
            if kind == b"D" and len(frames) > 2:
                if self.got.take(frames[1]):
                    self.loop.dispatch(frames[2:])
            elif kind == b"E" and len(frames) == 5:
                if self.got.take(frames[1]):
                    port = _PORT.unpack(frames[3].bytes)[0]
                    self.loop.peers.send_failed(frames[2].bytes.decode(), [port],
                                                frames[4].bytes.decode(), False)
            elif kind in (b"A", b"G", b"L") and len(frames) == 2:
                self._control(kind, _SEQ.unpack(frames[1].bytes)[0])
            elif kind == b"X":
                log.warning("gateway %s: %s", self.address, frames[-1].bytes.decode())
            elif kind != b"W":
                self.loop.stats.dropped += 1
                log.warning("%s: dropped a malformed message from the gateway %s",
                            self.loop.name, self.address)
        if self.got.last - self.got.acked >= 64:
            self._ack()  # much came: confirmed now, so the gateway lets it go
        elif self.got.last != self.got.acked and not self.ack_due:
            self.ack_due = True  # else shortly, once for what comes meanwhile
            self.loop.call_later(0.1, self._ack)

    def _control(self, kind: bytes, seq: int) -> None:
        """The gateway confirmed our messages up to `seq` (A); or, after a cut, has them up
        to `seq` (G: the rest go again, in order); or let its own go up to `seq` (L)."""
        if kind == b"A":
            with self.lock:
                self.sent.confirmed(seq)
            return
        if kind == b"L":
            lost = seq - self.got.last
            self.got.last = max(self.got.last, seq)  # what follows is what it still has
            return self._lost(f"{lost} message(s) for this controller")
        with self.lock:
            lost = self.sent.lost_after(seq)
            again = self.sent.after(seq)
            for msg in again:
                try:
                    self.sock.send_multipart(msg, _NOBLOCK, copy=False)
                except zmq.ZMQError:
                    break
        if again:
            log.info("%s: %d message(s) sent again through the gateway %s after a cut",
                     self.loop.name, len(again), self.address)
        if lost:
            self._lost(f"{lost} message(s) from this controller")

    def _lost(self, what: str) -> None:
        text = (f"the gateway connection {self.address} was cut and {what} could not be kept "
                "(gateway_buffer_bytes)")
        log.warning("%s: %s", self.loop.name, text)
        if self.on_loss is not None:
            self.on_loss(text)

    def _ack(self) -> None:
        """Confirm what came through (I/O thread)."""
        self.ack_due = False
        ack = self.got.ack()
        if ack is None:
            return
        with self.lock:
            if not self.closed:
                try:
                    self.sock.send_multipart(ack, _NOBLOCK)
                except zmq.ZMQError:
                    self.got.acked = 0  # not sent: said again next time

    def _connected(self, monitor: zmq.Socket) -> None:
        """A connection to the gateway was made (the first, or one after a cut): say what
        came through, so it sends what we lack, and learn what it lacks (I/O thread)."""
        from zmq.utils.monitor import recv_monitor_message

        while True:
            try:
                recv_monitor_message(monitor, _NOBLOCK)
            except zmq.Again:
                break
            except zmq.ZMQError:
                return
            with self.lock:
                if self.closed:
                    return
                try:
                    self.sock.send_multipart([b"R", _SEQ.pack(self.got.last)], _NOBLOCK)
                except zmq.ZMQError:
                    pass

    def close(self, why: str) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = why
            for sock in (self.sock, self.monitor):
                try:
                    self.loop.unwatch_zmq(sock)
                except Exception:
                    pass
            self.sock.disable_monitor()
            self.monitor.close(linger=0)
            self.sock.close(linger=0)


class GatewayPeer:
    """A peer behind a gateway, in a process's table of connections (`Peers.out`)."""

    opened = True
    sent = 0

    def __init__(self, link: GatewayLink, addr: str) -> None:
        self.link = link
        self.addr = addr
        self.error = ""

    def send(self, frames: list, port: int = 0) -> None:
        if self.error:
            if port:
                self.link.loop.schedule(self.link.loop.peers.send_failed, self.addr, [port],
                                        self.error, True)
            return
        self.link.send(self.addr, frames, port)
        self.sent += 1

    def close(self, why: str = "", linger: int = 0, gone: bool = True) -> None:
        self.error = why or f"{self.addr} is closed"

    def finish(self) -> None:
        self.error = "this process's runtime stopped"

    def pending(self) -> int:
        return 0


def main(argv: Optional[list] = None) -> None:
    """`python -m runtime.transport.gateway --listen tcp://0.0.0.0:PORT --inner-ip IP
    --key-file PATH`: a gateway on its own, next to a host agent."""
    import argparse
    import json
    import os
    import signal

    from . import auth

    p = argparse.ArgumentParser(prog="python -m runtime.transport.gateway")
    p.add_argument("--listen", required=True, help="tcp://ADDR:PORT the client dials")
    p.add_argument("--inner-ip", required=True, help="this node's address in the cluster")
    p.add_argument("--key-file", default=os.environ.get("MONARCH_KEY_FILE"))
    p.add_argument("--address-file", help="write the bound addresses here (JSON)")
    a = p.parse_args(argv)
    if not a.key_file:
        p.error("--key-file (or MONARCH_KEY_FILE) is required")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    gw = Gateway(auth.read_key_file(a.key_file, "--key-file"), a.listen, a.inner_ip).start()
    if a.address_file:
        with open(a.address_file + ".tmp", "w") as f:
            json.dump({"gateway": gw.address, "inner": gw.inner_address}, f)
        os.replace(a.address_file + ".tmp", a.address_file)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    gw.stop()


if __name__ == "__main__":
    main()
