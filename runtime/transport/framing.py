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

__all__ = [
    "Kind", "Header", "OK", "ERROR", "PARTIAL", "FrameError", "encode_header", "decode_header",
    "INLINE_BODY", "build", "parse", "peek_kind", "frames_nbytes", "summarize", "extra_get",
    "reply_batch", "split_reply_batch", "PREAMBLE", "PREAMBLE_MAX", "NO_LIMIT", "MAX_FRAMES",
    "IOV_MAX", "nbytes", "stream_parts", "stream_message", "preamble", "parse_preamble",
    "advance", "StreamDecoder",
]


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
    AGENT_QUERY = 26  # to an agent: a question answered with a REPLY (its procs' log files)
    TIMELINE = 27  # to a proc: reply with its timeline records (runtime/timeline.py)
    RELAY = 28  # proc -> its host agent: send the enclosed message to a peer on another host
    DELIVER = 29  # to an agent from another host: pass the enclosed message to one local proc
    TAKEN = 30  # actor -> a sender: it took n of the sender's messages that have no answer
    RELAY_LOST = 31  # caller -> agent of a cast tree: a relay below it died, with its procs
    LOG_LEVEL = 40  # to a proc: the level its Actor.logger records print at (logging_option)
    WORKSPACE = 41  # to an agent: sync workspace files; to a proc: reload changed modules
    REATTACH = 42  # to a kept proc: a new controller owns it; reply with its actors
    INJECT = 43  # to a proc: an actor's next endpoint call raises InjectedFault (inject_raise)


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
    status: int = 0  # OK, ERROR, or PARTIAL (in a REPLY_BATCH)
    extra: Any = None  # small kind-specific data (msgpack types only)


_KINDS = frozenset(int(k) for k in Kind)
_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(Header)

OK = 0
ERROR = 1
#: a REPLY_BATCH item that is several ranks' answers folded into one value by host agents
#: (a reduced call: runtime/host/folds.py); the batch's "part" extra names its ranks
PARTIAL = 2


class FrameError(ValueError):
    """A frame list that is not a valid message of this session."""


def encode_header(h: Header) -> bytes:
    return _enc.encode(h)


def decode_header(data: bytes | memoryview) -> Header:
    try:
        h = _dec.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError) as e:
        raise FrameError(f"bad header: {type(e).__name__}: {str(e)[:200]}") from None
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


def peek_kind(head: Any, token_len: int) -> int:
    """The kind of the message whose head frame is `head`, read without decoding it (-1
    when it does not look like one): a relay decides how urgent a message is unread."""
    try:
        i = token_len + _HLEN.size
        if head[i] & 0xF0 == 0x90 and head[i + 1] < 0x80:  # fixarray, positive fixint
            return head[i + 1]
    except (IndexError, TypeError):
        pass
    return -1


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


def summarize(frames: Sequence[Any], limit: int = 3) -> str:
    """A short description of a rejected frame list, for log lines: its frames' sizes, never
    their bytes (the head frame begins with a session token)."""
    sizes = [nbytes(f) for f in list(frames)[:limit]]
    more = f" (+{len(frames) - limit} more)" if len(frames) > limit else ""
    return f"{len(frames)} frame(s) of {sizes}{more} bytes"


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


# -- the stream wire (runtime/transport/stream.py) -------------------------------------------
#: Each message on a stream connection is `count (u32) | size (u64) x count | frames`; the
#: first message of a connection is its preamble: one frame, `PREAMBLE | token length (u16)
#: | token | sender id` (who sent everything that follows).
PREAMBLE = b"MNSTRM01"
#: the largest preamble frame read (a token and a sender id)
PREAMBLE_MAX = 4096
#: the frame size of an identified stream peer: any
NO_LIMIT = 1 << 62
#: frames a stream message may have: a call's or reply's frames are a few plus at most
#: serialization.MAX_OUT_OF_BAND buffers; a gathered batch is split to stay within it
MAX_FRAMES = 8192
#: buffers one sendmsg takes (Linux's IOV_MAX): a longer message is written in pieces
IOV_MAX = 1024
_COUNT = struct.Struct("<I")
_U16 = struct.Struct("<H")


def nbytes(f: Any) -> int:
    """The size of one frame (bytes or any buffer)."""
    return len(f) if isinstance(f, (bytes, bytearray)) else memoryview(f).nbytes


_ONE = struct.Struct("<IQ")


def stream_parts(frames: Sequence[Any]) -> tuple[list[Any], int]:
    """The buffers that put one message on a stream (its prefix, then its frames, no
    copy) and their total size."""
    n = len(frames)
    if n == 1:
        f = frames[0]
        size = len(f) if type(f) is bytes else nbytes(f)
        return [_ONE.pack(1, size), f], size + 12
    if not 0 < n <= MAX_FRAMES:
        raise FrameError(f"a message has 1 to {MAX_FRAMES} frames, not {n}")
    sizes = [nbytes(f) for f in frames]
    return [struct.pack(f"<I{n}Q", n, *sizes), *frames], 4 + 8 * n + sum(sizes)


def stream_message(frames: Sequence[Any]) -> list[Any]:
    """The buffers that put one message on a stream (`stream_parts` without the size)."""
    return stream_parts(frames)[0]


def preamble(token: bytes, sender: str) -> list[Any]:
    """The first message of a connection: who sends what follows (`parse_preamble`)."""
    return stream_message([b"".join((PREAMBLE, _U16.pack(len(token)), token,
                                     sender.encode()))])


def parse_preamble(frames: Sequence[Any], tokens: Sequence[bytes]) -> str:
    """The sender id of a preamble whose token is one of `tokens`; FrameError otherwise."""
    head = _as_bytes(frames[0]) if len(frames) == 1 else b""
    n = len(PREAMBLE) + _U16.size
    if head[:len(PREAMBLE)] != PREAMBLE or len(head) < n:
        raise FrameError("a connection that does not begin with a preamble")
    (k,) = _U16.unpack_from(head, len(PREAMBLE))
    if not any(_compare(head[n:n + k], t) for t in tokens):
        raise FrameError("wrong session token")
    try:
        return head[n + k:].decode()
    except UnicodeDecodeError:
        raise FrameError("bad sender id in preamble") from None


def advance(bufs: list[Any], n: int) -> list[Any]:
    """What is left of `bufs` once their first `n` bytes were written (a partial send)."""
    i = 0
    while i < len(bufs):
        size = nbytes(bufs[i])
        if n < size:
            break
        n -= size
        i += 1
    rest = bufs[i:]
    if rest and n:
        rest[0] = memoryview(rest[0]).cast("B")[n:]
    return rest


class StreamDecoder:
    """Cuts the bytes of one stream connection into messages (lists of frames). Pure: the
    caller reads into `buffer()` and says with `feed(n)` how many bytes came; `feed`
    returns the messages completed. A frame larger than half the read buffer is read into a
    buffer of its own (no second copy). Raises FrameError for a stream that is not ours."""

    def __init__(self, max_frame: int, chunk: int = 256 << 10, first_max: int = 0) -> None:
        self.max_frame = max_frame
        #: the frame size allowed now: `first_max` for the first message (a connection's
        #: preamble, sent before the peer is known: nothing larger is allocated for it)
        self.limit = first_max or max_frame
        self.buf = bytearray(chunk)
        self.view = memoryview(self.buf)
        self.start = self.end = 0
        self.sizes: list[int] = []  # frame sizes of the message being read, reversed
        self.frames: list[Any] = []
        self.big: Optional[bytearray] = None  # a large frame being filled
        self.big_off = 0

    def mid_message(self) -> bool:
        """Whether a message has begun and not ended (its sender died while sending)."""
        return bool(self.sizes or self.frames or self.big is not None or
                    self.end > self.start)

    def buffer(self) -> memoryview:
        """Where the next bytes go."""
        if self.big is not None:
            return memoryview(self.big)[self.big_off:]
        if len(self.buf) - self.end < (len(self.buf) >> 2):  # make room: move what is left
            n = self.end - self.start
            self.buf[:n] = self.view[self.start:self.end]
            self.start, self.end = 0, n
        return self.view[self.end:]

    def feed(self, n: int) -> list[list[Any]]:
        """`n` bytes came into `buffer()`: the messages now complete, in order."""
        if self.big is not None:
            self.big_off += n
            if self.big_off < len(self.big):
                return []
            self.frames.append(self.big)
            self.big = None
        else:
            self.end += n
        out: list[list[Any]] = []
        while self._step(out):
            pass
        return out

    def _step(self, out: list) -> bool:
        """Take one header or frame from the buffer; False when more bytes are needed."""
        buf, start, avail = self.buf, self.start, self.end - self.start
        sizes = self.sizes
        if not sizes:
            if self.frames:
                out.append(self.frames)
                self.frames = []
                self.limit = self.max_frame
            if avail < 4:
                return False
            if avail >= 12:  # the common case: a one-frame message, whole in the buffer
                count, size = _ONE.unpack_from(buf, start)
                if count == 1 and size <= avail - 12 and size <= self.limit:
                    self.start = start + 12 + size
                    out.append([bytes(self.view[start + 12:self.start])])
                    self.limit = self.max_frame
                    return True
            (count,) = _COUNT.unpack_from(buf, start)
            if not 0 < count <= MAX_FRAMES:
                raise FrameError(f"a message of {count} frames")
            if avail < 4 + 8 * count:
                return False
            got = struct.unpack_from(f"<{count}Q", buf, start + 4)
            if max(got) > self.limit:
                raise FrameError(f"a frame of {max(got)} bytes (limit {self.limit})")
            self.sizes = sizes = list(reversed(got))
            self.start = start = start + 4 + 8 * count
            avail -= 4 + 8 * count
        size = sizes[-1]
        if size <= avail:
            sizes.pop()
            f = self.view[start:start + size]
            self.frames.append(bytes(f) if not self.frames else bytearray(f))
            self.start = start + size
            if not sizes:
                out.append(self.frames)
                self.frames = []
                self.limit = self.max_frame
            return True
        if size <= len(buf) >> 1:
            return False  # a small frame: the rest comes into this buffer
        sizes.pop()
        big = self.big = bytearray(size)  # a large frame: read into its own buffer
        big[:avail] = self.view[start:self.end]
        self.big_off = avail
        self.start = self.end = 0
        return False
