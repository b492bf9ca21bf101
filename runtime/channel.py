"""Channels and ports: one-way message streams any actor can send into.

Layer 5 (on the core): imports `runtime._core`, `runtime.transport` and the basics.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Generic, Optional, TypeVar

from ._core import get_runtime, reach
from .future import Future, resolve_later
from .transport.framing import ERROR, OK, Header, Kind
from .transport.serialization import check_size, dumps, loads

__all__ = ["T", "Port", "PortReceiver", "Channel"]

T = TypeVar("T")


class Port(Generic[T]):
    """The sending end of a channel; picklable, so it can be passed to endpoints. An
    explicit-response-port endpoint receives one (with the caller's `rank`) as its first
    argument: `send(value)` answers the call, `exception(exc)` fails it."""

    def __init__(self, address: str, port_id: int, rank: Optional[int] = None) -> None:
        self.address = address
        self.port_id = port_id
        self.rank = rank

    def _send(self, value: Any, status: int, what: str) -> None:
        if not self.port_id:
            return  # a call that wants no answer (broadcast): the value is dropped
        rt = get_runtime()
        body, bufs = dumps(value, what)
        check_size(body, bufs, what)
        if self.rank is None:
            h = Header(Kind.PORT_SEND, port=self.port_id, status=status)
        else:
            h = Header(Kind.REPLY, port=self.port_id, rank=self.rank, status=status)
        rt.send(self.address, h, body, tuple(bufs))

    def send(self, value: T) -> None:
        """Send `value` to the receiver (from any process of this controller's session)."""
        self._send(value, OK, "the value sent to a port")

    def exception(self, exc: BaseException) -> None:
        """Send an exception: the receiver's `recv()` (or the waiting call) raises it."""
        if not isinstance(exc, BaseException):
            raise TypeError(f"Port.exception() takes an exception, got {type(exc).__name__}")
        self._send(exc, ERROR, "the exception sent to a port")

    def __reduce__(self) -> Any:
        rt = get_runtime()
        if self.address and self.address == rt.address:  # other hosts take TCP (reach)
            alts = reach.own_alternatives(rt)
            if alts:
                return (_rebuild_port, (self.address, self.port_id, self.rank, rt.host, alts))
        return (Port, (self.address, self.port_id, self.rank))

    def __repr__(self) -> str:
        return f"<Port {self.port_id} at {self.address}>"


def _rebuild_port(address: str, port_id: int, rank: Optional[int], host: str,
                  alts: dict) -> Port:
    """A port pickled by the process that receives on it, unpickled here: on another host
    its ipc address becomes its TCP address of this process's cluster."""
    return Port(reach.choose(get_runtime(), [address], [host], [alts])[0], port_id, rank)


def _decode(raw: tuple) -> Any:
    """A value sent to a port, unpickled; an exception sent with `Port.exception` raised."""
    status, body, buffers = raw
    value = loads(body, buffers)
    if status == ERROR and isinstance(value, BaseException):
        raise value
    return value


class PortReceiver(Generic[T]):
    """The receiving end: `recv()` returns a Future of the next value."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: collections.deque = collections.deque()
        self._waiters: collections.deque = collections.deque()
        self._port_id = 0

    def _deliver(self, h: Header, body: Any, buffers: list) -> None:
        """A value came (I/O thread): kept as it came, unpickled by whoever takes it."""
        raw = (h.status, body, buffers)
        with self._lock:
            if self._waiters:
                fut = self._waiters.popleft()
            else:
                self._values.append(raw)
                return
        resolve_later(fut, raw, _decode)

    def recv(self) -> Future[T]:
        fut: Future = Future("PortReceiver.recv")
        with self._lock:
            if self._values:
                raw = self._values.popleft()
            else:
                self._waiters.append(fut)
                return fut
        resolve_later(fut, raw, _decode)
        return fut

    def close(self) -> None:
        get_runtime().close_port(self._port_id)


class Channel(Generic[T]):
    """Factory of (Port, PortReceiver) pairs."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[T], PortReceiver[T]]:
        rt = get_runtime()
        recv: PortReceiver[T] = PortReceiver()
        pid = rt.open_port(recv._deliver)
        recv._port_id = pid
        return Port(rt.address, pid), recv
