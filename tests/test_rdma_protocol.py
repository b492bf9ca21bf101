"""The data-socket protocol on its own: handshake and framing over a socketpair, no processes."""

from __future__ import annotations

import socket
import threading

import pytest

from runtime.rdma import protocol as P


_opened: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_pairs():
    """The socketpairs a test made are closed after it."""
    yield
    while _opened:
        _opened.pop().close()


def _pair():
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    _opened.extend((a, b))
    return a, b


def test_handshake_succeeds_with_a_shared_secret():
    srv, cli = _pair()
    errors: list[BaseException] = []

    def serve():
        try:
            P.server_handshake(srv, b"k" * 32)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=serve)
    t.start()
    P.client_handshake(cli, b"k" * 32)
    t.join(5)
    assert errors == []


def test_handshake_fails_on_both_sides_with_different_secrets():
    srv, cli = _pair()
    errors: list[BaseException] = []

    def serve():
        try:
            P.server_handshake(srv, b"server-secret")
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            srv.close()

    t = threading.Thread(target=serve)
    t.start()
    with pytest.raises(P.HandshakeRejected, match="wrong session token"):
        P.client_handshake(cli, b"client-secret")
    t.join(5)
    assert len(errors) == 1 and "authentication" in str(errors[0])


def test_client_refuses_a_peer_that_is_not_a_data_server():
    srv, cli = _pair()
    srv.sendall(b"HTTP/1.1 200 OK\r\nServer: x\r\n\r\n")
    with pytest.raises(P.ProtocolError, match="magic"):
        P.client_handshake(cli, b"k")


def test_requests_and_replies_round_trip():
    a, b = _pair()
    P.send_request(a, P.OP_READ, 7, 4096, 1 << 30, b"xyz")
    assert P.recv_request(b) == (P.OP_READ, 7, 4096, 1 << 30, b"xyz")
    P.send_reply(b, P.ST_DROPPED, b"gone")
    assert P.recv_reply(a) == (P.ST_DROPPED, b"gone")
    a.close()
    assert P.recv_request(b) is None  # clean close between requests


def test_oversized_control_payload_is_refused_unread():
    a, b = _pair()
    a.sendall(P.REQUEST.pack(P.OP_INFO, P.MAX_PAYLOAD + 1, 0, 0, 0))
    with pytest.raises(P.ProtocolError, match="exceeds"):
        P.recv_request(b)


def test_truncated_stream_is_an_error_not_short_data():
    a, b = _pair()
    a.sendall(b"\x01\x02")
    a.close()
    with pytest.raises(P.ProtocolError, match="closed"):
        P.recv_request(b)
    c, d = _pair()
    c.sendall(b"abc")
    c.close()
    buf = bytearray(10)
    with pytest.raises(P.ProtocolError, match="3 of 10"):
        P.recv_into_exact(d, memoryview(buf))
