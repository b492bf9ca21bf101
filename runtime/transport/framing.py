"""Message framing: a head frame `token | flag | header length | header [| body]`, then the
body (when not inline) and the out-of-band buffers, with a msgpack header.

A body up to INLINE_BODY bytes travels inside the head frame: most messages are one frame,
which zmq and pyzmq send and receive several times faster than three (measured: 0.6 us
against 8.7 us for a send and receive of a small message). Pure logic: builds and parses
frame lists, checks the session token. A frame list that does not parse or carries the wrong
token is rejected before anything is unpickled.
"""

from __future__ import annotations

import enum
import hmac
import struct
from typing import Any, Optional, Sequence

import msgspec


class Kind(enum.IntEnum):
    # actor traffic
    CALL = 1  # invoke an endpoint (port == 0: no reply wanted)
    REPLY = 2  # a value or an error for a port
    PORT_SEND = 3  # a value sent to a user Port
    SPAWN_ACTOR = 4
    ACTOR_READY = 5
    ACTOR_FAILED = 6  # an actor failed (init, broadcast error, crash): to its owner
    STOP_ACTOR = 7
    ACTOR_STOPPED = 8
    # process management
    HELLO = 10  # a proc (or agent) announces itself to its owner
    HEARTBEAT = 11
    SPAWN_PROCS = 12  # to an agent
    PROC_EXIT = 13  # agent -> owner: a proc exited
    KILL_PROCS = 14  # to an agent: signal procs
    STOP_PROC = 15  # to a proc: exit cleanly
    AGENT_STOP = 16
    LOG = 17  # agent -> owner: output of a proc
    PROC_DEAD = 18  # owner -> procs: these procs are gone, fail what waits on them
    DUMP_STACK = 19  # to a proc: reply with the stacks of its threads
    INTERRUPT = 20  # to a proc: raise KeyboardInterrupt in actors serving a port
    FANOUT = 21  # to an agent: deliver the enclosed message to several local procs
    AGENT_ATTACH = 22  # controller -> remote agent: adopt me as owner
    DEBUG = 23  # debugger traffic (actor <-> controller)
    SUPERVISE = 24  # owner-side delivery of a failure to a supervising actor
    REPLY_BATCH = 25  # agent -> caller: the replies of several local procs to one call
    LOG_LEVEL = 40  # to a proc: the level its Actor.logger records print at (logging_option)


class Header(msgspec.Struct, array_like=True, omit_defaults=False, gc=False):
    """The small, never-pickled part of every message. Not tracked by the garbage collector
    (one per message, never in a reference cycle: `extra` holds msgpack data only)."""

    kind: int
    src: str = ""  # sender's process id
    actor: str = ""  # destination actor id
    method: str = ""  # endpoint name
    reply: str = ""  # address to reply to
    port: int = 0  # port id at `reply` (0: none)
    rank: int = -1  # sender rank (replies) or target rank (calls)
    status: int = 0  # 0 ok, 1 error
    extra: Any = None  # small kind-specific data (msgpack types only)


_KINDS = frozenset(int(k) for k in Kind)
_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(Header)

OK = 0
ERROR = 1


class FrameError(ValueError):
    """A frame list that is not a valid message of this session."""


def encode_header(h: Header) -> bytes:
    return _enc.encode(h)


def decode_header(data: bytes | memoryview) -> Header:
    try:
        h = _dec.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise FrameError(f"bad header: {e}") from None
    if h.kind not in _KINDS:
        raise FrameError(f"unknown message kind {h.kind}")
    return h


#: Bodies up to this size travel inside the head frame (copied once); larger ones are a
#: frame of their own (sent without a copy).
INLINE_BODY = 16 << 10
_INLINE = 1
_SEPARATE = 0
_HLEN = struct.Struct("<BI")  # flag, header length


def build(token: bytes, header: Header, body: bytes = b"",
          buffers: Sequence[Any] = ()) -> list[Any]:
    """The frame list for one message."""
    hb = _enc.encode(header)
    if len(body) <= INLINE_BODY:
        return [b"".join((token, _HLEN.pack(_INLINE, len(hb)), hb, body)), *buffers]
    return [b"".join((token, _HLEN.pack(_SEPARATE, len(hb)), hb)), body, *buffers]


def parse(frames: Sequence[Any], token: bytes | Sequence[bytes]) -> tuple[Header, Any, list[Any]]:
    """Check the token (one, or any of several) and decode the header; returns
    (header, body, buffers). Raises FrameError for anything not of this session."""
    if not frames:
        raise FrameError("no frames")
    head = frames[0]
    if type(head) is not bytes:
        head = _as_bytes(head)
    tokens = (token,) if isinstance(token, (bytes, bytearray)) else token
    n = 0
    for tok in tokens:
        if _compare(head[:len(tok)], tok):
            n = len(tok)
    if not n:
        raise FrameError("wrong session token")
    size = len(head)
    if size < n + _HLEN.size:
        raise FrameError(f"head frame of {size} bytes is too short")
    flag, hlen = _HLEN.unpack_from(head, n)
    start = n + _HLEN.size
    if flag not in (_INLINE, _SEPARATE) or start + hlen > size:
        raise FrameError("bad head frame layout")
    header = decode_header(head[start:start + hlen])
    if flag == _INLINE:
        return header, head[start + hlen:], list(frames[1:])
    if len(frames) < 2 or len(head) != start + hlen:
        raise FrameError("bad head frame layout")
    return header, frames[1], list(frames[2:])


_compare = hmac.compare_digest


def _as_bytes(f: Any) -> bytes:
    if isinstance(f, bytes):
        return f
    b = getattr(f, "bytes", None)
    if b is not None:
        return b
    return bytes(f)


def frames_nbytes(frames: Sequence[Any]) -> int:
    n = 0
    for f in frames:
        if isinstance(f, (bytes, bytearray)):
            n += len(f)
        else:
            n += memoryview(f).nbytes
    return n


def summarize(frames: Sequence[Any], limit: int = 40) -> str:
    """A short description of a rejected frame list, for log lines."""
    parts = []
    for f in list(frames)[:3]:
        b = _as_bytes(f)[:limit]
        parts.append(repr(b))
    return f"{len(frames)} frames: " + ", ".join(parts)


def extra_get(h: Header, key: str, default: Optional[Any] = None) -> Any:
    e = h.extra
    if isinstance(e, dict):
        return e.get(key, default)
    return default


def reply_batch(port: int, items: list, bodies: list) -> tuple[Header, bytes]:
    """Header and body of a REPLY_BATCH: `items` are [src, actor, rank, status, body length,
    buffer count] per reply, `bodies` their bodies (buffers follow in the same order)."""
    return Header(Kind.REPLY_BATCH, port=port, extra={"items": items}), b"".join(bodies)


def split_reply_batch(h: Header, body: Any, buffers: list) -> list[tuple[Header, Any, list]]:
    """The REPLY messages a REPLY_BATCH carries (pure logic; raises FrameError when the
    batch does not add up)."""
    items = extra_get(h, "items")
    if not isinstance(items, list):
        raise FrameError("reply batch without items")
    data = memoryview(body)
    out = []
    off = nb = 0
    size, nbufs = len(data), len(buffers)
    for it in items:
        try:
            src, actor, rank, status, n, k = it
        except (TypeError, ValueError):
            raise FrameError("bad reply batch item") from None
        if type(n) is not int or type(k) is not int or n < 0 or k < 0 or off + n > size \
                or nb + k > nbufs:
            raise FrameError("reply batch sizes do not add up")
        out.append((Header(Kind.REPLY, src=src, actor=actor, port=h.port, rank=rank,
                           status=status), data[off:off + n], buffers[nb:nb + k]))
        off += n
        nb += k
    if off != size or nb != nbufs:
        raise FrameError("reply batch sizes do not add up")
    return out


# -- coalesced messages ------------------------------------------------------------------------
#: The first bytes of a frame that carries several one-frame messages (a thread's burst to
#: one address, sent as one: runtime/transport/coalesce.py). A message's head frame starts
#: with a random session token, so a real message cannot start this way (2**-64).
COALESCED = b"\x00MNBATCH"
_LEN = struct.Struct("<I")


def pack_coalesced(messages: Sequence[bytes]) -> bytes:
    """One frame carrying `messages` (each a complete one-frame message), in order."""
    parts = [COALESCED]
    for m in messages:
        parts.append(_LEN.pack(len(m)))
        parts.append(m)
    return b"".join(parts)


def unpack_coalesced(frame: bytes) -> list[bytes]:
    """The one-frame messages a coalesced frame carries, in order (pure logic; raises
    FrameError when the lengths do not add up). Each is then parsed, and its token checked,
    as if it had come alone."""
    if frame[:len(COALESCED)] != COALESCED:
        raise FrameError("not a coalesced frame")
    out = []
    off, size, n = len(COALESCED), len(frame), _LEN.size
    while off < size:
        if off + n > size:
            raise FrameError("coalesced frame cut short")
        (k,) = _LEN.unpack_from(frame, off)
        off += n
        if off + k > size:
            raise FrameError("coalesced frame cut short")
        out.append(frame[off:off + k])
        off += k
    return out
