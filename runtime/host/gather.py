"""Replies gathered per host: for a call fanned out through a host agent, the agent sends
the caller one REPLY_BATCH for all its procs instead of one REPLY per proc.

The caller's cost per reply is mostly per message (a wake-up, a receive, a parse), so a
cast to 1,024 actors on 16 hosts costs it 16 messages instead of 1,024. Only `call()`
gathers: its future resolves when every rank has answered, so holding the early replies
delays nothing. The agent sends a batch when every proc of the call has answered or exited,
and at once when a reply is an error (the call fails fast on it); later replies of that
call follow as they come. A batch is sent early, too, rather than grow past a message's
frame count or the size limit (`max_message_bytes`): it splits, never fails. Runs on the
agent's I/O thread.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

from ..config import config
from ..transport import framing
from ..transport.framing import Header


class _Batch:
    __slots__ = ("reply", "port", "waiting", "items", "bodies", "buffers", "size", "failed")

    def __init__(self, reply: str, port: int, procs: list[str]) -> None:
        self.reply = reply
        self.port = port
        self.waiting = set(procs)
        self.items: list = []
        self.bodies: list = []
        self.buffers: list = []
        self.size = 0  # bytes of the bodies and buffers held
        self.failed = False  # an error went out: the rest is sent as it comes


class ReplyGather:
    """The batches of one agent: calls in flight whose replies come back through it."""

    def __init__(self, address: str, send: Callable[[str, list], None], token: bytes) -> None:
        self.address = address  # where local procs reply (the agent's ipc inbox)
        self._send = send
        self._token = token
        self._ids = itertools.count(1)
        self.batches: dict[int, _Batch] = {}
        self.holding: dict[str, set[int]] = {}  # proc id -> batches holding a reply of it

    def start(self, inner: Header, procs: list[str]) -> Header:
        """Take over the replies of the call `inner` to `procs`: returns the header to
        deliver, with this agent as the reply address."""
        gid = next(self._ids)
        self.batches[gid] = _Batch(inner.reply, inner.port, procs)
        extra = dict(inner.extra) if isinstance(inner.extra, dict) else {}
        extra.update(g=gid, caller=inner.reply)
        inner.extra = extra
        inner.reply = self.address
        return inner

    def on_reply(self, h: Header, body: Any, buffers: list) -> None:
        """A REPLY from a local proc (I/O thread)."""
        gid = framing.extra_get(h, "g")
        b = self.batches.get(gid) if isinstance(gid, int) else None
        if b is None or h.src not in b.waiting:
            return
        b.waiting.discard(h.src)
        size = len(body) + sum(framing.nbytes(x) for x in buffers)
        if b.items and (len(b.buffers) + len(buffers) + 4 > framing.MAX_FRAMES
                        or b.size + size > config.max_message_bytes):
            self._flush(gid)  # what is held goes first: a batch stays within the limits
        b.size += size
        b.items.append([h.src, h.actor, h.rank, h.status, len(body), len(buffers)])
        self.holding.setdefault(h.src, set()).add(gid)
        b.bodies.append(body)
        b.buffers.extend(buffers)
        if h.status != framing.OK:
            b.failed = True
        if b.failed or not b.waiting:
            self._flush(gid)

    def proc_exited(self, proc_id: str) -> None:
        """A local proc is gone: its batches stop waiting for it (the caller learns of
        the exit from the agent's PROC_EXIT and fails that rank)."""
        for gid, b in list(self.batches.items()):
            if proc_id in b.waiting:
                b.waiting.discard(proc_id)
                if not b.waiting:
                    self._flush(gid)

    def flush_from(self, proc_id: str) -> None:
        """Send now what is held of `proc_id`'s replies: a message it sent after them is
        about to go (its replies must arrive first)."""
        for gid in list(self.holding.get(proc_id, ())):
            self._flush(gid)

    def _flush(self, gid: int) -> None:
        b = self.batches[gid]
        if not b.waiting:
            del self.batches[gid]
        if b.items:
            for item in b.items:
                held = self.holding.get(item[0])
                if held is not None:
                    held.discard(gid)
                    if not held:
                        del self.holding[item[0]]
            h, body = framing.reply_batch(b.port, b.items, b.bodies)
            self._send(b.reply, framing.build(self._token, h, body, b.buffers))
        b.items, b.bodies, b.buffers, b.size = [], [], [], 0

