"""Malformed input is cheap (docs/transport.md, "Malformed input"): nothing is allocated
for an unauthenticated connection's frames beyond a small bound, a connection that never
finishes its preamble is closed, waiting ones are capped, a header that cannot be decoded
fails its message alone, and no log line carries the session token."""

from __future__ import annotations

import logging
import socket
import struct

import pytest

from _util import wait_until
from runtime.transport import framing, peers
from runtime.transport.framing import Header, Kind
from runtime.transport.loop import IOLoop

pytestmark = pytest.mark.timeout(60)
TOKEN = b"s" * 16


_wait = wait_until


@pytest.fixture
def reader(tmp_path):
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    got: list = []
    loop = IOLoop("reader", TOKEN, lambda h, b, bufs: got.append(h.extra))
    addr = loop.bind(f"ipc://{d}/reader")
    loop.start()
    yield loop, addr[6:], got
    loop.stop()


def _dial(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.settimeout(10)
    return s


def _closed_by_peer(s: socket.socket) -> bool:
    """Whether the reader closed this connection (EOF within the socket's timeout)."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_huge_first_frame_is_refused_before_anything_is_allocated(reader):
    """A connection with no token yet declares a 1.5 GiB frame and sends 10 bytes: the
    reader refuses it at once (over the preamble's bound) instead of allocating the frame
    and waiting for its bytes."""
    loop, path, _ = reader
    s = _dial(path)
    s.sendall(struct.pack("<IQ", 1, 3 << 29) + b"x" * 10)
    assert _closed_by_peer(s)
    assert loop.stats.dropped >= 1
    s.close()


def test_connections_that_never_say_who_they_are_are_closed(reader, monkeypatch):
    """Connections that send nothing are closed after the preamble timeout, and no more
    than MAX_UNIDENTIFIED wait at once (the oldest goes); a real peer is served meanwhile."""
    loop, path, got = reader
    monkeypatch.setattr(peers, "PREAMBLE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(peers, "MAX_UNIDENTIFIED", 4)
    silent = [_dial(path) for _ in range(6)]
    good = _dial(path)
    good.sendall(b"".join(framing.preamble(TOKEN, "good")))
    msg = framing.build(TOKEN, Header(Kind.LOG, extra={"i": 1}))
    good.sendall(b"".join(bytes(b) for b in framing.stream_message(msg)))
    _wait(lambda: got == [{"i": 1}])
    for s in silent:  # the first over the cap at once, the rest at their deadline
        assert _closed_by_peer(s)
        s.close()
    good.close()
    _wait(lambda: not loop.peers.unidentified)


def test_an_undecodable_header_fails_its_message_alone(reader, caplog):
    """A message with the right token and a header nested 5,000 deep is dropped with a log
    line; the well-formed message written behind it, in the same write, is delivered; the
    log line does not carry the token."""
    loop, path, got = reader
    nested = b"\x99" + b"\x0b" + b"\xa0" * 4 + b"\x00\xff\x00" + b"\x91" * 5000 + b"\xc0"
    bad = [TOKEN + struct.pack("<BI", 1, len(nested)) + nested]
    good = framing.build(TOKEN, Header(Kind.LOG, extra={"i": 2}))
    s = _dial(path)
    with caplog.at_level(logging.WARNING, logger="runtime.transport"):
        s.sendall(b"".join(framing.preamble(TOKEN, "nested")) +
                  b"".join(bytes(b) for b in framing.stream_message(bad)) +
                  b"".join(bytes(b) for b in framing.stream_message(good)))
        _wait(lambda: got == [{"i": 2}])
        assert loop.stats.dropped == 1
    assert "bad header" in caplog.text
    assert TOKEN.decode() not in caplog.text and repr(TOKEN)[2:-1] not in caplog.text
    s.close()


def test_an_undecodable_header_on_a_tcp_inbox_fails_its_message_alone():
    """The same nested header on a zmq (TCP) inbox, as a host agent's: that message is
    dropped and the I/O thread goes on reading the next one (it stopped for good)."""
    got: list = []
    sink = IOLoop("tcpsink", TOKEN, lambda h, b, bufs: got.append(h.extra))
    addr = sink.bind("tcp://127.0.0.1:0")
    sink.start()
    src = IOLoop("tcpsource", TOKEN, lambda h, b, bufs: None)
    src.start()
    try:
        nested = b"\x99" + b"\x0b" + b"\xa0" * 4 + b"\x00\xff\x00" + b"\x91" * 5000 + b"\xc0"
        src.send(addr, [TOKEN + struct.pack("<BI", 1, len(nested)) + nested])
        src.send(addr, framing.build(TOKEN, Header(Kind.LOG, extra={"i": 3})))
        _wait(lambda: got == [{"i": 3}])
        assert sink.stats.dropped == 1
    finally:
        src.stop()
        sink.stop()
