"""Data-socket wire format: an HMAC handshake, then fixed-size requests and replies.

Kept free of threads and registries so it can be tested with a socketpair."""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
from typing import Optional

__all__ = [
    "MAGIC", "NONCE", "MAC", "OP_READ", "OP_WRITE", "OP_PIN", "OP_UNPIN", "OP_DROP", "OP_INFO",
    "OP_IB_CONNECT", "OP_IB_MR", "OP_CUDA_IPC", "OP_CUDA_PIN", "ST_OK", "ST_UNKNOWN",
    "ST_DROPPED", "ST_BOUNDS", "ST_ERROR", "REQUEST", "REPLY", "MAX_PAYLOAD", "ProtocolError",
    "HandshakeRejected", "recv_exact", "recv_into_exact", "server_handshake", "client_handshake",
    "send_request", "recv_request", "send_reply", "recv_reply",
]

MAGIC = b"MRDM\x01"  # protocol name + version
NONCE = 16
MAC = 32

# Operations a client may ask for.
OP_READ = 1  # server streams bytes [offset, offset+length) of a buffer
OP_WRITE = 2  # client streams bytes into [offset, offset+length)
OP_PIN = 3  # same host: pin a buffer, reply with its address (caller uses process_vm_*)
OP_UNPIN = 4  # release the pin taken by OP_PIN on this connection
OP_DROP = 5  # drop a buffer for good
OP_INFO = 6  # reply with the server's pid and start time
OP_IB_CONNECT = 7  # exchange RC queue-pair info (payload: client's, reply: server's)
OP_IB_MR = 8  # register the buffer with the NIC (if needed); reply addr + rkey
OP_CUDA_IPC = 9  # same host, CUDA buffer: reply its CUDA IPC handle (JSON, never pickled)
OP_CUDA_PIN = 10  # same host, CUDA buffer: pin it and finish its device's work (OP_UNPIN ends)

# Reply statuses.
ST_OK = 0
ST_UNKNOWN = 1
ST_DROPPED = 2
ST_BOUNDS = 3
ST_ERROR = 4

REQUEST = struct.Struct("!B3xIQQQ")  # op, payload length, buffer id, offset, length
REPLY = struct.Struct("!B3xI")  # status, payload length
MAX_PAYLOAD = 1 << 16  # control payloads only: bulk bytes never count as payload


class ProtocolError(Exception):
    """The peer broke the protocol (bad magic, MAC, oversized payload, early close)."""


class HandshakeRejected(ProtocolError):
    """The server heard our proof and refused it (or could not prove itself): wrong secret."""


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly n bytes or raise ProtocolError if the peer closes first."""
    buf = bytearray(n)
    recv_into_exact(sock, memoryview(buf))
    return bytes(buf)


def recv_into_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill `view` from the socket, straight into its memory."""
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ProtocolError(f"peer closed after {got} of {n} bytes")
        got += k


def _mac(secret: bytes, tag: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, tag + a + b, hashlib.sha256).digest()


def server_handshake(sock: socket.socket, secret: bytes) -> None:
    """Challenge the client to prove it knows `secret`, then prove it back."""
    ns = os.urandom(NONCE)
    sock.sendall(MAGIC + ns)
    msg = recv_exact(sock, NONCE + MAC)
    nc, mac = msg[:NONCE], msg[NONCE:]
    if not hmac.compare_digest(mac, _mac(secret, b"c", ns, nc)):
        raise ProtocolError("client failed authentication (wrong session token)")
    sock.sendall(_mac(secret, b"s", ns, nc))


def client_handshake(sock: socket.socket, secret: bytes) -> None:
    """Answer the server's challenge and check the server's proof."""
    head = recv_exact(sock, len(MAGIC) + NONCE)
    if head[: len(MAGIC)] != MAGIC:
        raise ProtocolError("not an RDMABuffer data server (bad magic)")
    ns = head[len(MAGIC) :]
    nc = os.urandom(NONCE)
    sock.sendall(nc + _mac(secret, b"c", ns, nc))
    try:
        proof = recv_exact(sock, MAC)
    except ProtocolError:
        raise HandshakeRejected("data server closed the connection after our proof "
                                "(wrong session token?)") from None
    if not hmac.compare_digest(proof, _mac(secret, b"s", ns, nc)):
        raise HandshakeRejected("data server failed authentication")


def send_request(sock: socket.socket, op: int, buffer_id: int = 0, offset: int = 0,
                 length: int = 0, payload: bytes = b"") -> None:
    sock.sendall(REQUEST.pack(op, len(payload), buffer_id, offset, length) + payload)


def recv_request(sock: socket.socket) -> Optional[tuple[int, int, int, int, bytes]]:
    """Next request, or None when the client closed cleanly between requests."""
    head = bytearray(REQUEST.size)
    view = memoryview(head)
    got = 0
    while got < REQUEST.size:
        k = sock.recv_into(view[got:])
        if k == 0:
            if got == 0:
                return None
            raise ProtocolError("client closed mid-request")
        got += k
    op, plen, buffer_id, offset, length = REQUEST.unpack(head)
    if plen > MAX_PAYLOAD:
        raise ProtocolError(f"request payload of {plen} bytes exceeds {MAX_PAYLOAD}")
    payload = recv_exact(sock, plen) if plen else b""
    return op, buffer_id, offset, length, payload


def send_reply(sock: socket.socket, status: int, payload: bytes = b"") -> None:
    sock.sendall(REPLY.pack(status, len(payload)) + payload)


def recv_reply(sock: socket.socket) -> tuple[int, bytes]:
    status, plen = REPLY.unpack(recv_exact(sock, REPLY.size))
    if plen > MAX_PAYLOAD:
        raise ProtocolError(f"reply payload of {plen} bytes exceeds {MAX_PAYLOAD}")
    return status, (recv_exact(sock, plen) if plen else b"")
