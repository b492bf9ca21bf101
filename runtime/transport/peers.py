"""A process's connections: one outgoing connection per peer address, the incoming ones by
sender, and what happens when one fails (docs/transport.md).

- To a peer on this host (`ipc://PATH`): an AF_UNIX stream this process dialed
  (`stream.Outbound`); to a peer on another host (`tcp://`): a zmq PUSH socket with
  CurveZMQ (`ZmqPeer`), or, for a proc, its host agent's stream (`relay_peer`: the agent
  sends it on); to a proc on another host, its agent (`agent_routed_peer`). Any thread
  sends, under the connection's lock.
- From peers on this host: the connections they dialed (`stream.Inbound`), accepted and
  read by the I/O thread, known by the sender id of their preamble.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Optional, Protocol

import zmq

from . import framing, stream
from .auth import CurveKeys, cluster_token

__all__ = [
    "GONE_KEPT", "RECONNECT_MAX_MS", "PREAMBLE_TIMEOUT_S", "MAX_UNIDENTIFIED", "PeersLoop",
    "Peers", "WrappedPeer", "relay_peer", "agent_routed_peer", "ZmqPeer", "push_socket",
    "LinkWatch",
]

log = logging.getLogger("runtime.transport")
_NOBLOCK = int(zmq.NOBLOCK)
_POLLIN = int(zmq.POLLIN)
GONE_KEPT = 1024
#: the longest wait between zmq's dials of a TCP peer that does not answer
RECONNECT_MAX_MS = 1000
#: seconds a new connection has to send its preamble, and how many may be waiting to: a
#: connection that says nothing holds no descriptor for long
PREAMBLE_TIMEOUT_S = 10.0
MAX_UNIDENTIFIED = 64


class PeersLoop(stream.ConnectionLoop, Protocol):
    """What the connections table and its peers use of their I/O loop (`loop.IOLoop`): what
    a connection uses, and the process's session token and keys, the keys of TCP peers of
    other clusters, its relay (a proc's host agent), gateways and zmq context."""

    @property
    def peers(self) -> "Peers": ...

    @property
    def token(self) -> bytes: ...

    @property
    def keys(self) -> Optional[CurveKeys]: ...

    @property
    def peer_keys(self) -> dict[str, CurveKeys]: ...

    @property
    def relay(self) -> str: ...

    @property
    def gateways(self) -> dict[bytes, Any]: ...

    @property
    def ctx(self) -> zmq.Context: ...


class Peers:
    """The connections of one I/O loop's process."""

    def __init__(self, loop: PeersLoop) -> None:
        self.loop = loop
        #: fn(address, ports, error): a send failed, the calls on `ports` must fail
        self.on_send_failed: stream.SendFailed = _log_send_failed
        self.out: dict[str, Any] = {}  # address -> Outbound or ZmqPeer
        self.lock = threading.Lock()
        self.inbound: dict[str, list[stream.Inbound]] = {}  # peer id -> its connections
        #: accepted connections whose preamble has not come, oldest first -> deadline
        self.unidentified: dict[stream.Inbound, float] = {}
        self._sweep_due = False
        #: ipc addresses of peers known dead (`forget`), the latest GONE_KEPT: a send there
        #: fails its call at once instead of dialing a socket that will never listen (not
        #: TCP ones: another agent may listen at the same host and port later)
        self.gone: collections.OrderedDict = collections.OrderedDict()
        #: addresses whose connection broke after it was open: dialed again on the next
        #: send, but a peer not listening there now is gone (no retry)
        self.broke: collections.OrderedDict = collections.OrderedDict()

    # -- sending (any thread) --------------------------------------------------------------
    def send(self, addr: str, frames: list, port: int = 0) -> None:
        """Send a frame list to `addr`. Everything this process sends one peer arrives in
        the order of these calls; if it cannot be sent, the call waiting on `port` (a reply
        port of this process) fails (`on_send_failed`)."""
        peer = self.out.get(addr)
        if peer is None:
            if addr in self.gone:
                if port:
                    self.loop.schedule(self.send_failed, addr, [port], f"{addr} is gone", True)
                else:
                    log.debug("%s: a message to %s, a peer known dead, dropped",
                              self.loop.name, addr)
                return
            peer = self._new(addr)
        peer.send(frames, port)

    def _new(self, addr: str, link: Optional[tuple[float, float]] = None) -> Any:
        with self.lock:
            peer = self.out.get(addr)
            if peer is None:
                loop = self.loop
                if addr.startswith("ipc://"):
                    keys = loop.peer_keys.get(addr)  # an ipc worker of a cluster: its token
                    token = cluster_token(keys) if keys is not None else loop.token
                    peer = stream.Outbound(loop, addr, framing.preamble(token, loop.name),
                                           wait_for_listener=addr not in self.broke)
                elif "#" in addr:
                    peer = agent_routed_peer(loop, addr)  # a proc reached through its agent
                elif loop.relay:
                    peer = relay_peer(loop, addr)  # a proc: through its host agent
                elif loop.gateways and (link := loop.gateways.get(
                        getattr(loop.peer_keys.get(addr, loop.keys), "public", b""))):
                    peer = link.peer(addr)  # this cluster is reached through its gateway
                else:
                    peer = ZmqPeer(loop, addr, link)  # watched: `watch_link`
                self.out[addr] = peer
        return peer

    def watch_link(self, addr: str, interval: float, timeout: float) -> None:
        """From now on, keep the TCP connection to `addr` checked by zmq's own heartbeats
        (ZMTP PING and PONG, answered by the peer's zmq thread: they need no GIL), so that
        `link_up` can tell a peer that runs but is silent from one that is gone. Call it
        before the first send to `addr`: a connection already made is left as it is (a
        second socket would break the order of what is sent), and is not watched."""
        if addr.startswith("tcp://") and addr not in self.out:
            self._new(addr, (interval, timeout))

    def link_up(self, addr: str) -> bool:
        """Whether the connection to `addr` (watched: `watch_link`) is up: its handshake
        done and zmq's heartbeats answered since. False for an address not watched."""
        peer = self.out.get(addr)
        return isinstance(peer, ZmqPeer) and peer.link is not None and peer.link.up()

    # -- the I/O thread -----------------------------------------------------------------------
    def forget(self, addr: str) -> None:
        """A peer is gone: close the connection to it; what waited to be written is dropped
        and the calls it carried fail."""
        with self.lock:
            peer = self.out.pop(addr, None)
            if addr.startswith("ipc://"):  # unique per process; a TCP host:port is reused
                _remember(self.gone, addr)
        if peer is not None:
            peer.close(f"{addr} is gone")

    def dropped(self, peer: Any) -> None:
        """A connection broke (the peer closed it, a send failed): the next send to its
        address makes a new one (a worker restarted at the same path)."""
        addr, opened = peer.addr, peer.opened
        with self.lock:
            if self.out.get(addr) is peer:
                del self.out[addr]
                if opened:
                    _remember(self.broke, addr)

    def drain_from(self, sender: str) -> None:
        """Read and dispatch everything `sender` has sent this process so far: called before
        its death fails the calls waiting on it, so that an answer it sent first always
        counts. A dead process writes nothing more, so this ends."""
        for inbound in list(self.unidentified):  # any of them may be the sender's
            inbound.read()
        for inbound in list(self.inbound.get(sender, ())):
            inbound.read()

    def last_heard(self, sender: str) -> float:
        """When bytes last came from `sender` on a stream (time.monotonic(); 0.0: never)."""
        return max((c.last_read for c in self.inbound.get(sender, ())), default=0.0)

    def read_pending(self) -> None:
        """Read and dispatch what every incoming stream holds now (I/O thread)."""
        for inbound in list(self.unidentified):
            inbound.read()
        for conns in list(self.inbound.values()):
            for inbound in list(conns):
                inbound.read()

    def send_failed(self, addr: str, ports: list, error: str, gone: bool = False) -> None:
        """A send failed: the calls waiting on `ports` fail, naming the peer and the error
        (`gone`: because the peer went away)."""
        try:
            self.on_send_failed(addr, ports, error, gone)
        except Exception:
            log.exception("%s: failing the calls of a lost send raised", self.loop.name)

    def accept(self, lsock: Any) -> None:
        """Accept what waits on a listening socket."""
        loop = self.loop
        for _ in range(64):
            try:
                sock, _ = lsock.accept()
            except BlockingIOError:
                return
            except OSError as e:  # out of descriptors: back off, the peers wait in backlog
                log.warning("%s: accept failed (%s); again in 0.1 s", loop.name, e)
                fd = lsock.fileno()
                loop.unwatch(fd)
                loop.call_later(0.1, loop.watch, fd, _POLLIN, lambda ev: self.accept(lsock))
                return
            sock.setblocking(False)
            inbound = stream.Inbound(loop, sock)
            if len(self.unidentified) >= MAX_UNIDENTIFIED:
                oldest = next(iter(self.unidentified))
                oldest.close(f"{MAX_UNIDENTIFIED} connections wait for their preamble; the "
                             f"oldest is dropped")
            self.unidentified[inbound] = time.monotonic() + PREAMBLE_TIMEOUT_S
            loop.watch(inbound.fd, _POLLIN, inbound.readable)
            if not self._sweep_due:
                self._sweep_due = True
                loop.call_later(PREAMBLE_TIMEOUT_S, self._sweep_unidentified)

    def _sweep_unidentified(self) -> None:
        """Close the connections whose preamble is overdue (I/O thread)."""
        self._sweep_due = False
        now = time.monotonic()
        for inbound, deadline in list(self.unidentified.items()):
            if deadline <= now:
                inbound.close(f"no preamble within {PREAMBLE_TIMEOUT_S:g} s; connection "
                              f"dropped")
        if self.unidentified:
            self._sweep_due = True
            first = min(self.unidentified.values())
            self.loop.call_later(max(0.01, first - now), self._sweep_unidentified)

    def identified(self, inbound: stream.Inbound) -> None:
        """A connection's preamble named its sender."""
        self.unidentified.pop(inbound, None)
        self.inbound.setdefault(inbound.peer, []).append(inbound)

    def closed(self, inbound: stream.Inbound) -> None:
        """An incoming connection ended."""
        self.unidentified.pop(inbound, None)
        self.loop.unwatch(inbound.fd)
        conns = self.inbound.get(inbound.peer)
        if conns is not None and inbound in conns:
            conns.remove(inbound)
            if not conns:
                del self.inbound[inbound.peer]

    def finish(self) -> None:
        """The loop stops: what the kernel takes now is written, the rest reported."""
        with self.lock:
            out, self.out = list(self.out.values()), {}
        for peer in out:
            peer.finish()
        for conns in list(self.inbound.values()):
            for inbound in list(conns):
                inbound.sock.close()

    def sent(self) -> int:
        return sum(p.sent for p in list(self.out.values()))

    def sizes(self) -> dict[str, int]:
        """Connections and what waits in them (runtime.table_sizes)."""
        out = list(self.out.values())
        return {"send_sockets": len(out), "forgotten_peers": len(self.gone),
                "inbound_connections": sum(len(c) for c in list(self.inbound.values())),
                "queued_messages": sum(p.pending() for p in out)}


class WrappedPeer:
    """A peer reached through another connection of this process: each message goes there
    behind a head built once for the peer (docs/transport.md, "Across hosts").

    - `relay_peer`: a peer on another host that a proc reaches through its host agent, on
      the proc's one stream to it (RELAY; the agent's `_on_relay` sends it on). Everything
      the proc sends other hosts leaves on one path, in `send` order, and is in the
      kernel's hands when `send` returns: the agent reads it to the end before it reports
      the proc's death, on the same connection.
    - `agent_routed_peer`: a proc on another host, addressed `tcp://AGENT_HOST:PORT#PROC_ID`,
      reached through that agent (DELIVER; its `_on_deliver` passes it on the proc's
      stream): calls and casts (which go through the agent too) and answers to the proc's
      ports take one path and keep their order."""

    opened = False

    def __init__(self, loop: PeersLoop, addr: str, via: str, head: bytes) -> None:
        self.loop = loop
        self.addr = addr
        self.via = via
        self.head = head
        self.sent = 0

    def send(self, frames: list, port: int = 0) -> None:
        self.sent += 1
        self.loop.peers.send(self.via, [self.head, *frames], port)

    def close(self, why: str = "") -> None:
        """Nothing of its own to close: the connection it goes through is the connection."""

    def finish(self) -> None:
        """The connection it goes through finishes what it holds."""

    def pending(self) -> int:
        return 0


def relay_peer(loop: PeersLoop, addr: str) -> WrappedPeer:
    """`addr` on another host, for a proc: through its host agent (`loop.relay`)."""
    head = framing.build(loop.token, framing.Header(
        framing.Kind.RELAY, src=loop.name, extra={"to": addr}))[0]
    return WrappedPeer(loop, addr, loop.relay, head)


def agent_routed_peer(loop: PeersLoop, addr: str) -> WrappedPeer:
    """The proc at `tcp://AGENT#PROC`: through its agent, with that cluster's token."""
    agent, _, proc = addr.partition("#")
    keys = loop.peer_keys.get(addr) or loop.peer_keys.get(agent, loop.keys)
    token = cluster_token(keys) if keys is not None else loop.token
    head = framing.build(token, framing.Header(
        framing.Kind.DELIVER, src=loop.name, extra={"proc": proc}))[0]
    return WrappedPeer(loop, addr, agent, head)


class ZmqPeer:
    """The zmq PUSH socket this process sends one TCP peer with (any thread, under a lock:
    one socket per peer keeps this process's messages to it in order)."""

    def __init__(self, loop: PeersLoop, addr: str,
                 link: Optional[tuple[float, float]] = None) -> None:
        self.loop = loop
        self.addr = addr
        self.lock = threading.Lock()
        self.sent = 0
        self.error = ""
        self.gone = False
        keys: Optional[CurveKeys] = loop.peer_keys.get(addr, loop.keys)
        self.sock: Optional[zmq.Socket] = push_socket(loop.ctx, addr, keys, link)
        #: zmq's view of the connection (`Peers.watch_link`), None when not watched
        self.link = LinkWatch(self.sock) if link is not None else None

    def send(self, frames: list, port: int = 0) -> None:
        error = ""
        with self.lock:
            if self.sock is None:
                error = self.error
            else:
                try:
                    if len(frames) == 1:
                        self.sock.send(frames[0], _NOBLOCK)
                    else:
                        self.sock.send_multipart(frames, copy=False, flags=_NOBLOCK)
                    self.sent += 1
                except zmq.ZMQError as e:
                    error = f"send to {self.addr} failed: {e}"
                    log.warning("%s: %s", self.loop.name, error)
        if error and port:
            self.loop.schedule(self.loop.peers.send_failed, self.addr, [port], error,
                               self.gone and self.sock is None)

    def close(self, why: str = "", linger: int = 0, gone: bool = True) -> None:
        with self.lock:
            sock, self.sock = self.sock, None
            self.error, self.gone = why or f"{self.addr} is closed", gone
        if self.link is not None:
            if sock is not None:
                sock.disable_monitor()
            self.link.close()
        if sock is not None:
            sock.close(linger=linger)

    def finish(self) -> None:
        """The loop stops: queued messages get up to 2 s to leave."""
        self.close("this process's runtime stopped", linger=2000, gone=False)

    def pending(self) -> int:
        return 0


def _remember(table: collections.OrderedDict, addr: str) -> None:
    """Add `addr` to a table of the latest GONE_KEPT addresses."""
    table[addr] = True
    table.move_to_end(addr)
    while len(table) > GONE_KEPT:
        table.popitem(last=False)


def _log_send_failed(addr: str, ports: list, error: str, gone: bool) -> None:
    log.warning("a send to %s failed (%s); %d call(s) lost", addr, error, len(ports))


class LinkWatch:
    """zmq's events of one PUSH socket's connection, read when asked (`up`, any thread,
    under its lock): up once a handshake has succeeded, down once the connection closed
    (zmq closes it when its heartbeats go unanswered past their timeout)."""

    _EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
               | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
               | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_MONITOR_STOPPED)

    def __init__(self, sock: zmq.Socket) -> None:
        self.lock = threading.Lock()
        self.is_up = False
        self.monitor: Optional[zmq.Socket] = sock.get_monitor_socket(self._EVENTS)

    def up(self) -> bool:
        """Read the events so far; whether the connection is up after them."""
        from zmq.utils.monitor import recv_monitor_message

        with self.lock:
            while self.monitor is not None and self.monitor.poll(0):
                event = recv_monitor_message(self.monitor, _NOBLOCK)["event"]
                self.is_up = event == zmq.EVENT_HANDSHAKE_SUCCEEDED
            return self.is_up

    def close(self) -> None:
        with self.lock:
            monitor, self.monitor, self.is_up = self.monitor, None, False
        if monitor is not None:
            monitor.close(linger=0)


def push_socket(ctx: zmq.Context, addr: str, keys: Optional[CurveKeys],
                link: Optional[tuple[float, float]] = None) -> zmq.Socket:
    """The PUSH socket to one TCP peer; `link` (interval, timeout: seconds) turns zmq's
    heartbeats on for its connection (`Peers.watch_link`)."""
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.SNDHWM, 0)
    s.setsockopt(zmq.LINGER, 2000)
    if link is not None:
        s.setsockopt(zmq.HEARTBEAT_IVL, max(1, int(link[0] * 1000)))
        s.setsockopt(zmq.HEARTBEAT_TIMEOUT, max(1, int(link[1] * 1000)))
    # peers bind soon after spawn: the first retries come fast (10 ms, doubling), and a
    # peer that stays away (a dead or lost host) is dialed once a second, not 100 times
    s.setsockopt(zmq.RECONNECT_IVL, 10)
    s.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_MAX_MS)
    if addr.startswith("tcp://") and keys is not None:
        s.curve_serverkey = keys.public
        s.curve_publickey = keys.public
        s.curve_secretkey = keys.secret
    s.connect(addr)
    return s
