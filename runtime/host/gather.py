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

In a cast tree (runtime/transport/casttree.py) an agent's batch also waits for the batches
of its child agents, and goes to its parent agent instead of the caller; every batch lists
the procs that will not answer through it (`gone`: exited here, or below a dead relay), so
the caller settles each rank from the tree alone (docs/transport.md, "The cast tree").

A reduced call (`Accumulator(..., associative=True)`) folds its answers here instead of
holding them (runtime/host/folds.py, on the agent's worker thread): the batch carries one
PARTIAL value for the ranks it covers (the "part" extra names them), plus what could not be
folded.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any, Callable, Iterable, Optional, Sequence

from ..config import config
from ..transport import bulk, casttree, framing
from ..transport.framing import Header
from .folds import Fold, Folds

__all__ = ["LOST_KEPT", "ReplyGather"]

log = logging.getLogger("runtime.host")


#: dead relays and reaped procs an agent remembers (a cast that raced with the news skips
#: them rather than wait for them)
LOST_KEPT = 4096


def _remember(seen: dict, items: Iterable[str]) -> None:
    """Add `items` to the bounded, oldest-first record `seen`."""
    for x in items:
        seen[x] = None
    while len(seen) > LOST_KEPT:
        del seen[next(iter(seen))]


class _Batch:
    __slots__ = ("reply", "port", "waiting", "items", "bodies", "buffers", "size", "failed",
                 "gone", "why", "up_g", "children", "started", "fold", "finishing", "parts")

    def __init__(self, reply: str, port: int, procs: Iterable[str], up_g: Any) -> None:
        self.reply = reply
        self.port = port
        self.waiting = set(procs)
        self.items: list = []
        self.bodies: list = []
        self.buffers: list = []
        self.size = 0  # bytes of the bodies and buffers held
        self.failed = False  # an error went out: the rest is sent as it comes
        #: procs that will not answer through this agent (exited, behind a dead relay),
        #: told to the caller with the next batch so it stops waiting for them here
        self.gone: list = []
        self.why: dict = {}  # gone proc -> why, where the caller hears of it from nobody else
        self.up_g = up_g  # the parent agent's batch id (a cast tree), else None
        self.children: dict[str, set] = {}  # child relay -> its subtree's procs (a tree)
        self.started = time.monotonic()
        self.fold: Optional[Fold] = None  # a reduced call: its fold (the worker's), until done
        self.finishing = False  # the fold's end is asked for (nothing more waited for)
        #: partial values to send: (body, buffers, procs, ranks) each
        self.parts: list[tuple] = []


class ReplyGather:
    """The batches of one agent: calls in flight whose replies come back through it."""

    def __init__(self, address: str, send: Callable[[str, list], None], token: bytes,
                 call_soon: Optional[Callable[..., None]] = None) -> None:
        self.address = address  # where local procs reply (the agent's ipc inbox)
        self._send = send
        self._token = token
        #: the fold worker of reduced calls (`call_soon`: the I/O thread's); None: no folds
        self.folds = Folds(call_soon) if call_soon is not None else None
        self._ids = itertools.count(1)
        self.batches: dict[int, _Batch] = {}
        self.holding: dict[str, set[int]] = {}  # proc id -> batches holding a reply of it
        self.lost: dict[str, None] = {}  # child relays known dead (oldest first, bounded)
        self.exited: dict[str, None] = {}  # local procs reaped (oldest first, bounded)

    def stop(self) -> None:
        """The agent exits: end its fold worker."""
        if self.folds is not None:
            self.folds.stop()

    def start(self, inner: Header, procs: list[str], sub: Sequence[list] = (),
              reduce: Optional[bytes] = None) -> Header:
        """Take over the replies of the call `inner` to `procs` (this agent's) and to the
        subtrees `sub` below it (a cast tree's child nodes): returns the header to deliver,
        with this agent as the reply address. A proc that exited here, or one below a
        child relay known dead, is gone at once (its death was told, or is being told, to
        the caller). `reduce`: the call's pickled combine (its answers are folded here)."""
        gid = next(self._ids)
        extra = dict(inner.extra) if isinstance(inner.extra, dict) else {}
        up_g = extra.get("g") if "caller" in extra else None  # from a parent agent
        waiting: list[str] = []
        gone: list[str] = []
        exited = self.exited
        for p in procs:
            (gone if p in exited else waiting).append(p)
        children = {}
        for node in sub:
            below = casttree.procs_of(node)
            if node[0] in self.lost:
                gone.extend(below)
            else:
                waiting.extend(below)
                children[node[0]] = set(below)
        b = self.batches[gid] = _Batch(inner.reply, inner.port, waiting, up_g)
        b.gone = gone
        b.children = children
        if reduce and self.folds is not None:
            b.fold = self.folds.start(reduce)
        extra["g"] = gid
        extra.setdefault("caller", inner.reply)  # the call's own caller, kept down a tree
        inner.extra = extra
        inner.reply = self.address
        if not b.waiting:
            self._flush(gid)
        return inner

    def on_reply(self, h: Header, body: Any, buffers: list) -> None:
        """A REPLY from a local proc (I/O thread)."""
        gid = framing.extra_get(h, "g")
        b = self.batches.get(gid) if isinstance(gid, int) else None
        if b is None or h.src not in b.waiting:
            return
        if b.fold is not None and h.status == framing.OK and not bulk.is_bulk(body):
            b.waiting.discard(h.src)
            item = [h.src, h.actor, h.rank, h.status, len(body), len(buffers)]
            self._fold(gid, b.fold, item, body, buffers, None)
            if not b.waiting:
                self._flush(gid)
            return
        self._add(gid, b, h.src, h.actor, h.rank, h.status, body, buffers)
        if b.failed or not b.waiting:
            self._flush(gid)

    def on_batch(self, h: Header, body: Any, buffers: list) -> None:
        """A REPLY_BATCH from a child agent of a cast tree (I/O thread): its replies and its
        gone procs join this agent's batch of the same call."""
        gid = framing.extra_get(h, "g")
        b = self.batches.get(gid) if isinstance(gid, int) else None
        if b is None:
            log.warning("agent: a reply batch from %s for no call of this agent; dropped",
                        h.src)
            return
        try:
            replies = framing.split_reply_batch(h, body, buffers)
        except framing.FrameError as e:
            log.warning("agent: dropped a reply batch from %s: %s", h.src, e)
            return
        parts = iter(_parts(h))
        for rh, rbody, rbufs in replies:
            if rh.status == framing.PARTIAL:  # a child's fold: its ranks are answered
                part = next(parts, None)
                if part is None:
                    log.warning("agent: a partial value from %s without its ranks dropped",
                                h.src)
                    continue
                if b.waiting.isdisjoint(part[0]):
                    continue  # its procs were given up on here (gone): not counted twice
                b.waiting.difference_update(part[0])
                if b.fold is not None:
                    self._fold(gid, b.fold, [rh.src, rh.actor, rh.rank, rh.status,
                                             len(rbody), len(rbufs)], rbody, rbufs, part)
                else:
                    b.parts.append((rbody, rbufs, part[0], part[1]))
            elif rh.src in b.waiting:
                self._add(gid, b, rh.src, rh.actor, rh.rank, rh.status, rbody, rbufs)
        gone = framing.extra_get(h, "gone")
        why = framing.extra_get(h, "why")
        if isinstance(gone, list):
            for p in gone:
                if p in b.waiting:
                    b.waiting.discard(p)
                    b.gone.append(p)
                    if isinstance(why, dict) and isinstance(why.get(p), str):
                        b.why[p] = why[p]
        if b.failed or not b.waiting or b.gone:
            self._flush(gid)

    # -- reduced calls: folded on the agent's worker (runtime/host/folds.py) -----------------
    def _fold(self, gid: int, fold: Fold, item: list, body: Any, buffers: list,
              part: Optional[tuple]) -> None:
        assert self.folds is not None
        self.folds.submit(self._fold_step, gid, fold, item, body, buffers, part)

    def _fold_step(self, gid: int, fold: Fold, item: list, body: Any, buffers: list,
                   part: Optional[tuple]) -> None:
        """(worker) Fold one answer; a combine that raised is told to the caller at once."""
        failed = fold.add(item, body, buffers, part)
        if failed is not None and self.folds is not None:
            self.folds.post(self._fold_failed, gid, failed[0], failed[1])

    def _fold_failed(self, gid: int, item: list, body: bytes) -> None:
        b = self.batches.get(gid)
        if b is not None:
            self._add(gid, b, item[0], item[1], item[2], item[3], body, [])
            self._flush(gid)

    def _fold_end(self, gid: int, fold: Fold) -> None:
        """(worker) The fold is complete: its partial goes up with the batch's rest."""
        partial, raw = fold.finish()
        if self.folds is not None:
            self.folds.post(self._folded, gid, partial, raw)

    def _folded(self, gid: int, partial: Optional[tuple], raw: list) -> None:
        b = self.batches.get(gid)
        if b is None:
            return
        for item, body, buffers, part in raw:
            if part is None:
                self._add(gid, b, item[0], item[1], item[2], item[3], body, buffers)
            else:
                b.parts.append((body, buffers, part[0], part[1]))
        if partial is not None:
            b.parts.append(partial)
        b.fold = None
        self._flush(gid)

    def _add(self, gid: int, b: _Batch, src: str, actor: str, rank: int, status: int,
             body: Any, buffers: list) -> None:
        size = len(body) + sum(framing.nbytes(x) for x in buffers)
        if b.items and (len(b.buffers) + len(buffers) + 4 > framing.MAX_FRAMES
                        or b.size + size > config.max_message_bytes):
            self._flush(gid)  # what is held goes first: a batch stays within the limits
        b.waiting.discard(src)  # after: the flush above keeps the batch (it still waits)
        b.size += size
        b.items.append([src, actor, rank, status, len(body), len(buffers)])
        self.holding.setdefault(src, set()).add(gid)
        b.bodies.append(body)
        b.buffers.extend(buffers)
        if status != framing.OK:
            b.failed = True

    def proc_exited(self, proc_id: str) -> None:
        """A local proc is gone: its batches stop waiting for it and tell the caller (which
        also learns of the exit from the agent's PROC_EXIT and fails that rank)."""
        _remember(self.exited, [proc_id])
        self._gone([proc_id])

    def relay_lost(self, relays: Iterable[str], procs: Iterable[str]) -> None:
        """Relays below this agent died (its caller says so): their subtrees' `procs` will
        not answer through them; every batch stops waiting for them, and a cast that still
        names one of them as a child (sent before the caller knew) does not wait for it."""
        _remember(self.lost, relays)
        self._gone(list(procs))

    def waiting_children(self, older_than: float) -> set:
        """The child relays that batches started over `older_than` seconds ago still wait
        on (the agent checks they are reachable)."""
        now = time.monotonic()
        return {c for b in self.batches.values() if now - b.started > older_than
                for c, procs in b.children.items() if not procs.isdisjoint(b.waiting)}

    def child_unreachable(self, child: str, why: str) -> None:
        """Child relay `child` has not answered this agent's pings: the procs of its
        subtree that batches still wait on are gone, with `why` (the caller hears of it
        from nobody else), and their batches go on."""
        for gid, b in list(self.batches.items()):
            hit = list(b.children.pop(child, set()) & b.waiting)
            if hit:
                b.waiting.difference_update(hit)
                b.gone.extend(hit)
                b.why.update(dict.fromkeys(hit, why))
                self._flush(gid)

    def _gone(self, procs: list) -> None:
        for gid, b in list(self.batches.items()):
            hit = [p for p in procs if p in b.waiting]
            if hit:
                b.waiting.difference_update(hit)
                b.gone.extend(hit)
                self._flush(gid)

    def flush_from(self, proc_id: str) -> None:
        """Send now what is held of `proc_id`'s replies: a message it sent after them is
        about to go (its replies must arrive first)."""
        for gid in list(self.holding.get(proc_id, ())):
            self._flush(gid)

    def _flush(self, gid: int) -> None:
        b = self.batches[gid]
        if not b.waiting:
            if b.fold is None:
                del self.batches[gid]
            elif not b.finishing:  # every answer is in: the fold's end, after its steps
                b.finishing = True
                assert self.folds is not None
                self.folds.submit(self._fold_end, gid, b.fold)
        if b.items or b.gone or b.parts:
            for item in b.items:
                held = self.holding.get(item[0])
                if held is not None:
                    held.discard(gid)
                    if not held:
                        del self.holding[item[0]]
            part = []
            for body, buffers, procs, ranks in b.parts:
                b.items.append([self.address, "", ranks[0] if ranks else -1, framing.PARTIAL,
                                len(body), len(buffers)])
                b.bodies.append(body)
                b.buffers.extend(buffers)
                part.append([procs, ranks])
            h, body = framing.reply_batch(b.port, b.items, b.bodies)
            if part:
                h.extra["part"] = part
            if b.up_g is not None:
                h.extra["g"] = b.up_g
            if b.gone:
                h.extra["gone"] = b.gone
            if b.why:
                h.extra["why"] = b.why
            self._send(b.reply, framing.build(self._token, h, body, b.buffers))
        b.items, b.bodies, b.buffers, b.size, b.gone, b.why = [], [], [], 0, [], {}
        b.parts = []


def _parts(h: Header) -> list[tuple[list, list]]:
    """The (procs, ranks) of each PARTIAL item of a REPLY_BATCH, in order (malformed: none)."""
    got = framing.extra_get(h, "part")
    out: list[tuple[list, list]] = []
    if isinstance(got, list):
        for p in got:
            if isinstance(p, list) and len(p) == 2 and isinstance(p[0], list) and \
                    isinstance(p[1], list) and len(p[0]) == len(p[1]) and \
                    all(isinstance(x, str) for x in p[0]) and \
                    all(type(r) is int for r in p[1]):
                out.append((p[0], p[1]))
            else:
                return []
    return out
