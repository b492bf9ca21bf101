"""The replies of one call (`ReplyCollector`): sent from the caller's thread, gathered on the
I/O thread into its future(s) (a ValueMesh, one value, or a stream), with a failed rank's
proc or actor failing the call in Monarch's words.

Layer 7 (user API, under `adverbs`): imports _core, transport and the basics.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from ..config import config
from .._core.liveness import note_reply
from ..errors import ActorError, CancelledError, SupervisionError
from ..future import Future, note_call, resolve_later
from ..shapes import Shape
from ..supervision.fold import ranks_phrase
from ..transport.framing import ERROR, Header, Kind
from ..transport import bulk
from ..transport.serialization import loads
from ..value_mesh import ValueMesh

__all__ = [
    "FAILED_RANKS_GRACE_S", "CallInterrupt", "wait_for_room", "take_room", "cancel_calls",
    "ReplyCollector", "Fold",
]

#: how long call() waits for the other ranks after one rank's actor failed
FAILED_RANKS_GRACE_S = 0.5


class CallInterrupt:
    """A call's interrupt hook (Ctrl-C in a wait on its future): KeyboardInterrupt in the
    actors of its procs serving its port; `cancel` (`Future.cancel()`) also drops the call
    where it still waits in a mailbox and fails it here at once."""

    __slots__ = ("rt", "procs", "port")

    def __init__(self, rt: Any, procs: frozenset, port: int) -> None:
        self.rt = rt
        self.procs = procs
        self.port = port

    def __call__(self) -> None:
        self.rt.interrupt(self.procs, self.port)

    def cancel(self, label: str) -> None:
        """Stop the call everywhere and fail it with CancelledError (any thread): on the
        I/O thread, the call fails here first and only then are its actors told, so the
        error reply of the handler they stop can never settle it first."""
        rt = self.rt
        exc = CancelledError(f"{label} was cancelled (Future.cancel()): its actors were "
                             "told to stop it and stay usable")

        def now() -> None:
            rt.ports.fail(self.port, exc)
            rt.interrupt(self.procs, self.port, cancel=True)

        if rt.loop.in_loop():
            now()
        else:
            rt.loop.call_soon(now)


class Fold:
    """A reduced call's fold: `combine` (associative and commutative), its `identity`, and
    the combine pickled once for the host agents that fold on the way up."""

    __slots__ = ("combine", "identity", "pickled")

    def __init__(self, combine: Any, identity: Any, pickled: bytes) -> None:
        self.combine, self.identity, self.pickled = combine, identity, pickled

    def result(self, got: tuple) -> Any:
        """The call's value from (its answers by rank, the partial values, how to unpickle
        one): the identity, then each folded in (the thread that takes it: user code)."""
        values, parts, value_of = got
        acc = self.identity
        for v in values:
            if v is not _FOLDED:
                acc = self.combine(acc, value_of(v) if type(v) is _Encoded else v)
        for p in parts:
            acc = self.combine(acc, value_of(p))
        return acc


#: a call()'s slot for a rank whose answer came folded into a partial value
_FOLDED = object()


class _Encoded:
    """An answer as it came: unpickled by the thread that takes the value."""

    __slots__ = ("body", "buffers", "rank")

    def __init__(self, body: Any, buffers: list, rank: int) -> None:
        self.body, self.buffers, self.rank = body, buffers, rank


def _set(fut: Future, value: Any, decode: Any) -> None:
    """Resolve `fut` with an answer: unpickled later by its taker if it came encoded."""
    if type(value) is _Encoded:
        resolve_later(fut, value, decode)
    else:
        fut.set_result(value)


def wait_for_room(rt: Any, rec: Any, ranks: list[int], size: int) -> None:
    """Wait (the calling thread) until every live rank of `ranks` has room for a call of
    `size` bytes in this process's call window to actor mesh `rec` (`mailbox_limit`
    calls, `mailbox_bytes` bytes; one call always fits). The I/O thread never waits: its
    calls go at once. Ctrl-C interrupts the wait."""
    if rt.loop.in_loop():
        return

    def full() -> bool:
        """Whether to wait on: until a quarter of the window is free (one wake-up lets a
        batch of calls go, not one call per answer)."""
        limit, limit_bytes = config.mailbox_limit * 3 // 4, config.mailbox_bytes * 3 // 4
        inflight, inflight_bytes, failed = rec.inflight, rec.inflight_bytes, rec.failed
        return not rec.stopped and any(
            r not in failed and (inflight[r] > limit or
                                 (inflight[r] and inflight_bytes[r] + size > limit_bytes))
            for r in ranks)

    with rec.room:
        rec.room_waiters += 1
        try:
            while full():
                rec.room.wait(0.1)  # in slices: a failure that ends no call is seen too
        finally:
            rec.room_waiters -= 1


def take_room(rt: Any, rec: Any, ranks: list[int], size: int, confirm: bool = False) -> None:
    """Count a message of `size` bytes to each of `ranks` in this process's call window to
    actor mesh `rec`, once there is room (`wait_for_room`). `confirm`: a message without an
    answer (broadcast, send), which leaves the window when the actor confirms it took it."""
    inflight, inflight_bytes = rec.inflight, rec.inflight_bytes
    limit, limit_bytes = config.mailbox_limit, config.mailbox_bytes
    for r in ranks:
        if inflight[r] >= limit or (inflight[r] and inflight_bytes[r] + size > limit_bytes):
            wait_for_room(rt, rec, ranks, size)
            break
    for r in ranks:
        rec.take_room(r, size, confirm)


def cancel_calls(rt: Any, proc_ids: set, actor_id: Optional[str] = None) -> int:
    """Cancel every call of this process in flight to actors on `proc_ids` (of actor mesh
    `actor_id` only, if given), as `Future.cancel()` does; returns how many."""
    n = 0
    for port, w in rt.ports.waiters():
        if type(w) is not ReplyCollector or w.done or (
                actor_id is not None and w.rec.actor_id != actor_id) or \
                not proc_ids.intersection(w.procs):
            continue
        CallInterrupt(rt, w.procs, port).cancel(w.label)
        n += 1
    return n


class ReplyCollector:
    """Gathers the replies of one call. Started (and its messages sent) in the caller's
    thread; replies and failures arrive on the I/O thread, in the order their senders sent
    them; `lock` makes each of them one step against the caller's thread."""

    __slots__ = ("rt", "rec", "method", "label", "extra", "targets", "shape", "ranks",
                 "values", "index", "remaining", "mode", "futs", "fut", "next_stream", "body",
                 "bufs", "port", "error", "done", "lock", "procs", "size", "tree",
                 "tree_gathered", "deferred", "gone", "fold", "parts")

    def __init__(self, rt: Any, rec: Any, method: str, label: str, extra: Optional[dict],
                 where: tuple[list, frozenset], shape: Optional[Shape], ranks: list[int],
                 body: bytes, bufs: list, mode: str, futs: "list[Future] | Future",
                 fold: Optional["Fold"] = None) -> None:
        """A call of `method` (`label`: Class.method, for errors; `extra`: its CALL header's
        extra) on actor mesh `rec`'s `ranks` at `where` (targets, proc ids); `shape` lays out
        a call()'s ValueMesh; `mode` is "call", "one" or "stream". `fold`: a call() whose
        answers are reduced to one value (host agents fold them on the way up)."""
        self.rt = rt
        self.rec = rec
        self.method = method
        self.label = label
        self.extra = extra
        self.targets, self.procs = where
        self.shape = shape
        self.ranks = ranks
        # call(): the values by rank; one actor: its value (no list: one object less per
        # call for the garbage collector)
        self.values: Any = [None] * len(ranks) if mode != "one" else None
        self.index = {r: i for i, r in enumerate(ranks)} if len(ranks) > 1 else None
        self.remaining = dict.fromkeys(ranks)
        self.mode = mode
        # stream(): a future per rank; else the call's one future (no list around it)
        self.futs = futs
        self.fut: Future = futs[0] if isinstance(futs, list) else futs
        self.next_stream = 0
        self.body: Optional[bytes] = body
        self.bufs: Optional[list] = bufs
        self.port = 0
        self.size = 0  # bytes of the call's message (its share of the call window)
        # call(): the first failed actor's SupervisionError, raised once every rank has
        # answered or failed (so each failure has reached its supervisor by then)
        self.error: Optional[BaseException] = None
        self.done = False
        self.lock = threading.Lock()
        # sent down a cast tree (runtime/transport/casttree.py): which relay each answer
        # comes through; gathered, every rank is settled by the tree (an answer, an error
        # reply, or "gone" once its proc exited or a relay on its way died), so a death
        # reported on another path waits in `deferred` until the tree says the proc is
        # gone (`gone`: said before the death was reported here)
        self.tree: Any = None
        self.tree_gathered = False
        self.deferred: Optional[dict] = None
        self.gone: Optional[set] = None
        self.fold = fold
        #: a reduced call: the partial values host agents folded (made with the first: one
        #: tracked object less per call for the garbage collector)
        self.parts: Optional[list] = None

    def start(self) -> None:
        rt = self.rt
        rec = self.rec
        ranks = self.ranks
        targets = self.targets
        self.port = port = rt.open_port(self)  # this collector is the port's Waiter
        # Ctrl-C in a wait interrupts the remote call. The hook holds no mesh and not this
        # collector: a future (or one derived from it, which copies the hook) would keep
        # them alive, or in a cycle with it, for the garbage collector
        interrupt = CallInterrupt(rt, self.procs, port) if config.interrupt_remote else None
        first = targets[0][0] or (targets[0][1] or ("",))[0]
        for f in (self.futs if type(self.futs) is list else (self.fut,)):
            f.reply_ports = (port,)
            f.interrupt_hook = interrupt
        body, bufs = self.body or b"", self.bufs or []
        size = self.size = len(body) + (sum(memoryview(b).nbytes for b in bufs)
                                        if bufs else 0)
        take_room(rt, rec, ranks, size)
        h = Header(Kind.CALL, src=rt.proc_id, actor=rec.actor_id, method=self.method,
                   reply=rt.reply_address_for(first),
                   port=port, extra=self.extra)
        self.body = self.bufs = None
        gather = self.mode == "call" and self._gatherable()
        base = rec.agents() if rec.routes else None
        tree = self.tree = rt.messenger.tree_for(targets, base)
        if tree is not None and gather and config.gather_replies != "off":
            self.tree_gathered = True
            self.deferred, self.gone = {}, set()
        try:
            rt.messenger.cast(targets, h, body, tuple(bufs), gather=gather, base=base,
                              tree=tree, reduce=self.fold.pickled if self.fold else None)
        except BaseException:  # not sent: raised at the call site, and nothing kept for it
            for r in ranks:
                self._finish_rank(r)
            rt.close_port(port)
            raise
        note_call(interrupt, self.futs)  # the thread's CallScope (a notebook cell) keeps it

    def target(self) -> dict:
        """What this call waits on, for a diagnosis: the actor mesh and ranks."""
        return {"actor": self.rec.actor_id, "mesh": self.rec.name, "ranks": list(self.remaining.copy()),
                "label": self.label}

    def _gatherable(self) -> bool:
        """Whether host agents may gather the replies (runtime/host/gather.py): for call()
        of an endpoint whose replies come back from the actors it reached (not through a
        Port the handler may pass on)."""
        return self.mode == "call" and self.method not in self.rec.explicit_ports and \
            (self.extra or {}).get("as") != "port"

    def _finish_rank(self, r: int) -> None:
        del self.remaining[r]
        self.rec.release(r, 1, self.size)
        note_reply(self.rt, self.rec, r)

    def on_reply(self, h: Header, body: Any, buffers: list) -> None:
        with self.lock:
            self._on_reply(h, body, buffers)

    def _on_reply(self, h: Header, body: Any, buffers: list) -> None:
        r = h.rank
        if r not in self.remaining:
            if r == -1 and h.status == ERROR and self.remaining:  # a proc answered for an
                r = next(iter(self.remaining))  # actor it does not know: fail the call
                for other in list(self.remaining)[1:]:
                    self._finish_rank(other)
            else:
                if bulk.is_bulk(body):  # the call is over: its answer will not be read
                    bulk.discard(body)
                return
        if bulk.is_bulk(body):  # a large result left on the data plane: read it off the I/O
            def read() -> None:  # thread, then deliver on it (unless the call ended since)
                value = self._decode(h, r, body, buffers)
                self.rt.loop.call_soon(self._deliver_read, h, r, value)

            bulk.submit(read)
            return
        self._finish_rank(r)
        if h.status == ERROR:  # decoded here: an error decides the call's course
            self._deliver(h, r, self._decode(h, r, body, buffers))
        else:  # unpickled by the thread that takes the value, never the I/O thread
            self._deliver(h, r, _Encoded(body, buffers, r))

    def on_partial(self, h: Header, body: Any, buffers: list, ranks: list[int]) -> None:
        """Several ranks' answers folded into one value by host agents (I/O thread): those
        ranks are answered; the value is folded with the others by the thread that takes
        the result."""
        with self.lock:
            if self.done or self.fold is None:
                return
            got = [r for r in ranks if r in self.remaining]
            if not got:
                return
            for r in got:
                self._finish_rank(r)
                self.values[self.index[r] if self.index is not None else 0] = _FOLDED
            if self.parts is None:
                self.parts = []
            self.parts.append(_Encoded(body, buffers, got[0]))
            if not self.remaining:
                self._complete()

    def _deliver_read(self, h: Header, r: int, value: Any) -> None:
        with self.lock:
            if self.done or r not in self.remaining:
                return
            self._finish_rank(r)
            self._deliver(h, r, value)

    def _decode(self, h: Header, r: int, body: Any, buffers: list) -> Any:
        try:
            return loads(body, buffers)
        except Exception as e:
            h.status = ERROR
            return ActorError(f"cannot unpickle the reply of {self.label}(): "
                              f"{type(e).__name__}: {e}", mesh=self.rec.name, rank=r,
                              endpoint=self.method)

    def _value_of(self, enc: "_Encoded") -> Any:
        """An answer's value, unpickled (the thread that takes it); ActorError if it cannot be."""
        try:
            return loads(enc.body, enc.buffers)
        except Exception as e:
            raise ActorError(f"cannot unpickle the reply of {self.label}(): "
                             f"{type(e).__name__}: {e}", mesh=self.rec.name, rank=enc.rank,
                             endpoint=self.method) from None

    def _values_of(self, values: list) -> ValueMesh:
        """call()'s ValueMesh, each answer unpickled (the thread that takes it)."""
        out = [self._value_of(v) if type(v) is _Encoded else v for v in values]
        assert self.shape is not None  # call() has its shape
        return ValueMesh(self.shape, out, self.shape)

    def _deliver(self, h: Header, r: int, value: Any) -> None:
        if h.status == ERROR and not isinstance(value, BaseException):
            value = ActorError(str(value), mesh=self.rec.name, rank=r, endpoint=self.method)
        if self.mode == "stream":
            assert isinstance(self.futs, list)
            f = self.futs[self.next_stream]
            self.next_stream += 1
            if h.status == ERROR:
                self.rt.ports.settle()
                f.set_exception(value)
            else:
                self.rt.ports.settle()
                _set(f, value, self._value_of)
        elif h.status == ERROR:
            if self.mode == "call" and isinstance(value, SupervisionError) and self.remaining:
                self._wait_for_others(value)
                return
            self._close()
            self.rt.ports.settle()
            self.fut.set_exception(self.error or value)
            return
        elif self.mode == "one":
            self.values = value
        else:
            self.values[self.index[r] if self.index is not None else 0] = value
        if not self.remaining:
            self._complete()

    def _complete(self) -> None:
        """Every rank has answered: resolve the call."""
        self._close()
        if self.error is not None:
            self.rt.ports.settle()
            self.fut.set_exception(self.error)
        elif self.fold is not None:
            self.rt.ports.settle()
            resolve_later(self.fut, (self.values, self.parts or (), self._value_of),
                          self.fold.result)
        elif self.mode == "call":
            self.rt.ports.settle()
            resolve_later(self.fut, self.values, self._values_of)
        elif self.mode == "one":
            self.rt.ports.settle()
            _set(self.fut, self.values, self._value_of)

    def on_fail(self, exc: BaseException, proc: Optional[str] = None,
                actor: Optional[str] = None) -> None:
        """A proc (or, with `actor`, an actor) this call waits on failed (I/O thread). Every
        answer its actor sent before failing has been delivered by now: the failure comes
        after them on the same connection, or after the dead proc's stream was read
        (docs/transport.md)."""
        with self.lock:
            self._on_fail(exc, proc, actor)

    def on_gone(self, procs: list, why: Optional[dict] = None) -> None:
        """A cast tree says these procs will not answer this call (they exited, a relay on
        their way died, or, with `why`, a relay could not reach theirs): the deaths told
        here, or `why`, fail their ranks now (I/O thread). A call that is not gathered
        hears only the last kind (its answers do not come up the tree)."""
        with self.lock:
            if self.done or (not self.tree_gathered and not why):
                return
            unreached: dict[str, list] = {}  # why -> procs a relay could not reach
            for p in procs:
                exc = self.deferred.pop(p, None) if self.deferred is not None else None
                if exc is not None:
                    self._on_fail(exc, p, None, settled=True)
                elif why and isinstance(why.get(p), str):
                    unreached.setdefault(why[p], []).append(p)
                elif self.gone is not None:
                    self.gone.add(p)
            for text, ps in unreached.items():
                ranks = sorted(r for r in map(self.rec.rank_of, ps) if r in self.remaining)
                if not ranks:
                    continue
                exc = SupervisionError(f"{self.label}: {ranks_phrase(ranks)} of actor mesh "
                                       f"{self.rec.name!r}: {text}")
                for p in ps:
                    self._on_fail(exc, p, None, settled=True)

    def relay_died(self, agent: str, dead: Any, cause: str) -> Optional[tuple]:
        """Host agent `agent` (dead: every agent known dead) died while this call was in
        flight (I/O thread). Gathered: the ranks of its subtree are failed once the nearest
        live relay above it has said they are gone, or now if there is none; returned:
        (that relay, its subtree's procs) to tell. Not gathered: the ranks below it are
        failed now, since the call may not have reached them."""
        tree = self.tree
        if tree is None or agent not in tree.parent:
            return None
        with self.lock:
            if self.done:
                return None
            rec = self.rec
            procs = tree.subtree(agent) if self.tree_gathered else set(tree.below.get(agent, ()))
            ranks = [r for r in self.remaining if rec.proc_ids[r] in procs]
            if not ranks:
                return None
            how = ("before their answers came back through it" if self.tree_gathered else
                   "before it was known whether the call reached them")
            exc = SupervisionError(
                f"{self.label}: {ranks_phrase(ranks)} of actor mesh {rec.name!r} were "
                f"reached through host {cause}, which died {how}; they may have run it")
            if not self.tree_gathered:
                for r in ranks:
                    self._on_fail(exc, rec.proc_ids[r], None)
                return None
            up = tree.nearest_live_ancestor(agent, dead)
            gone, deferred = self.gone, self.deferred
            assert gone is not None and deferred is not None  # (tree-gathered)
            for r in ranks:
                p = rec.proc_ids[r]
                if not up or p in gone:
                    gone.discard(p)
                    deferred.pop(p, None)
                    self._on_fail(exc, p, None, settled=True)
                else:  # this names the whole subtree (and the host's death)
                    deferred[p] = exc
            return (up, procs) if up else None

    def _on_fail(self, exc: BaseException, proc: Optional[str], actor: Optional[str],
                 settled: bool = False) -> None:
        if self.done or (actor is not None and actor != self.rec.actor_id):
            return
        if self.tree_gathered and proc is not None and not settled:
            if not self._proc_dead(proc):
                return  # an actor failed, its proc lives: its error replies come up the tree
            gone, deferred = self.gone, self.deferred
            assert gone is not None and deferred is not None  # (tree-gathered)
            if proc in gone:
                gone.discard(proc)
            else:  # its answers may still be on their way up the tree: wait for "gone"
                deferred.setdefault(proc, exc)
                return
        proc_ids = self.rec.proc_ids
        failed_ranks = [r for r in self.remaining if proc is None or proc_ids[r] == proc]
        if not failed_ranks:
            return
        exc = self._monarch_wording(exc, failed_ranks[0])
        if self.mode == "stream":
            assert isinstance(self.futs, list)
            for r in failed_ranks:
                self._finish_rank(r)
                fut = self.futs[self.next_stream]
                self.next_stream += 1
                self.rt.ports.settle()
                fut.set_exception(exc)
            if not self.remaining:
                self._close()
            return
        f = getattr(exc, "failure", None)
        if self.mode == "call" and actor is not None and f is not None and \
                f.exit_code is None and f.signal is None:  # an actor failed, its proc lives
            for r in failed_ranks:
                self._finish_rank(r)
            if self.remaining:
                self._wait_for_others(exc)
                return
        self._close()
        self.rt.ports.settle()
        self.fut.set_exception(self.error or exc)

    def _proc_dead(self, proc: str) -> bool:
        state = self.rt.state
        if proc in state.dead_procs:
            return True
        rec = state.proc(proc)
        return rec is not None and rec.state in ("failed", "stopped")

    def _wait_for_others(self, exc: BaseException) -> None:
        """A rank's actor failed: give the other ranks a moment (their actors often fail
        together) so that every failure reaches its supervisor before the call raises, as
        in Monarch; then raise the first (I/O thread). A dead proc fails the call at once."""
        if self.error is None:
            self.error = exc
            loop = self.rt.loop  # timers are the I/O thread's; this may be the caller's
            loop.call_soon(loop.call_later, FAILED_RANKS_GRACE_S, self._give_up)

    def _give_up(self) -> None:
        with self.lock:
            if not self.done and self.error is not None:
                self._close()
                self.rt.ports.settle()
                self.fut.set_exception(self.error)

    def _monarch_wording(self, exc: BaseException, rank: int) -> BaseException:
        """A SupervisionError for this call, with a last line in Monarch's words
        (`Endpoint call mesh.ep() failed, The actor <...> and all its descendants have
        failed: cause`; the first line keeps `Actor ... exited because of ...`)."""
        failure = getattr(exc, "failure", None)
        if type(exc) is not SupervisionError or failure is None:
            return exc
        rec = self.rec
        why = (f"The actor {rec.actor_name(rank)} and all its descendants have failed: "
               f"{failure.cause}")
        line = f"Endpoint call {rec.name}.{self.method}() failed, {why}"
        return SupervisionError(f"{exc.args[0]}\n{line}", failure)

    def _close(self) -> None:
        if not self.done:
            self.done = True
            if self.remaining:
                for r in list(self.remaining):
                    self._finish_rank(r)
            self.rt.close_port(self.port)
