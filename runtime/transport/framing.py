"""Message framing: `[token, header, body, *buffers]`, with a msgpack header.

Pure logic: builds and parses frame lists, checks the session token. A frame list that does
not parse or carries the wrong token is rejected before anything is unpickled.
"""

from __future__ import annotations

import enum
import hmac
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
    LOG_LEVEL = 40  # to a proc: the level its Actor.logger records print at (logging_option)


class Header(msgspec.Struct, array_like=True, omit_defaults=False):
    """The small, never-pickled part of every message."""

    kind: int
    src: str = ""  # sender's process id
    actor: str = ""  # destination actor id
    method: str = ""  # endpoint name
    reply: str = ""  # address to reply to
    port: int = 0  # port id at `reply` (0: none)
    rank: int = -1  # sender rank (replies) or target rank (calls)
    status: int = 0  # 0 ok, 1 error
    extra: Any = None  # small kind-specific data (msgpack types only)


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
    try:
        Kind(h.kind)
    except ValueError:
        raise FrameError(f"unknown message kind {h.kind}") from None
    return h


def build(token: bytes, header: Header, body: bytes = b"",
          buffers: Sequence[Any] = ()) -> list[Any]:
    """The frame list for one message."""
    return [token, encode_header(header), body, *buffers]


def parse(frames: Sequence[Any], token: bytes | Sequence[bytes]) -> tuple[Header, Any, list[Any]]:
    """Check the token (one, or any of several) and decode the header; returns
    (header, body, buffers). Raises FrameError for anything not of this session."""
    if len(frames) < 3:
        raise FrameError(f"{len(frames)} frames, expected at least 3")
    t = _as_bytes(frames[0])
    tokens = (token,) if isinstance(token, (bytes, bytearray)) else token
    ok = False
    for tok in tokens:
        if len(t) == len(tok) and hmac.compare_digest(t, tok):
            ok = True
    if not ok:
        raise FrameError("wrong session token")
    header = decode_header(_as_bytes(frames[1]))
    return header, frames[2], list(frames[3:])


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
