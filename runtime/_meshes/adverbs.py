"""Adverbs on a mesh's endpoint: call, call_one, choose, broadcast, stream.

`mesh.method` is an `EndpointRef`. Arguments are checked against the endpoint's signature
and pickled in the caller's thread (errors name the argument), which also sends the
messages (one per proc, or one per remote host agent); the I/O thread collects the replies
into futures.
"""

from __future__ import annotations

import inspect
import sys
import threading
from typing import TYPE_CHECKING, Any, Iterator, Optional

from .. import _features
from ..config import config
from .._core.liveness import note_reply
from ..errors import ActorError, MeshStoppedError, MessageTooLargeError, SerializationError, \
    SupervisionError, actor_failed_message
from ..future import Future, when_all
from ..shapes import Shape
from ..transport.framing import ERROR, Header, Kind
from ..transport import bulk, cuda_tensors
from ..transport.serialization import dumps, dumps_plain, loads, swap_held
from ..value_mesh import ValueMesh

if TYPE_CHECKING:
    from .actor_mesh import ActorMesh


class EndpointRef:
    """An endpoint of an actor mesh (or of a slice of it); exported as `runtime.Endpoint`
    too (Monarch's name), and `Endpoint[P, R]` is the class itself."""

    def __class_getitem__(cls, item: Any) -> type:
        return cls

    def __init__(self, mesh: "ActorMesh", name: str, signature: Optional[inspect.Signature],
                 extra: Optional[dict] = None) -> None:
        self._mesh = mesh
        self._name = name
        self._sig = signature
        self._extra = extra  # {"as": "call"|"port"} for as_endpoint() of a plain method
        self._targets: Optional[tuple] = None  # (targets, proc ids) once all are known
        self._labels: dict[str, str] = {}  # adverb -> its futures' label

    def __repr__(self) -> str:
        return f"<endpoint {self._mesh._rec.cls_name}.{self._name} of {self._mesh!r}>"

    #: The adverbs, in the order completion offers them.
    ADVERBS = ("call", "call_one", "choose", "broadcast", "stream", "rref")

    def getdoc(self) -> str:
        """What IPython's `?` and Shift-Tab show (it calls `obj.getdoc()` first): the
        endpoint's signature, its docstring where the class is local, and the adverbs."""
        sig = "(...)" if self._sig is None else str(self._sig)
        cls = self._mesh._class
        fn = getattr(cls, self._name, None) if cls is not None else None
        doc = inspect.getdoc(fn) if fn is not None else None
        if fn is not None and self._sig is not None:  # the class is here: its annotations
            try:
                full = inspect.signature(fn)
                sig = str(full.replace(parameters=[p for p in full.parameters.values()
                                                   if p.name in self._sig.parameters]))
            except (TypeError, ValueError):
                pass
        return (f"{self._qualname()}{sig}\n\n" + (f"{doc}\n\n" if doc else "")
                + "Call it with an adverb: " + ", ".join(f".{a}()" for a in self.ADVERBS))

    # -- preparation (caller's thread) ------------------------------------------------------------
    def _qualname(self) -> str:
        return f"{self._mesh._rec.cls_name}.{self._name}"

    def _ipc_keep(self, ranks: list[int]) -> Optional[list]:
        """A list for CUDA IPC snapshots when every target proc shares this host (ipc://
        addresses), else None: CUDA tensors are then staged through pinned host memory."""
        rec = self._mesh._rec
        if all(str(rec.target(r)[0]).startswith("ipc://") for r in ranks):
            return []
        return None

    def _encode(self, args: tuple, kwargs: dict, keep: Optional[list] = None,
                held: Optional[list] = None) -> tuple[bytes, list]:
        """(body, buffers) of a call's arguments. With `held` (a call that gets replies),
        arguments over the message limit leave their large buffers on the data plane, and
        `held` gets what to release once every receiver answered."""
        old_send, old_held = cuda_tensors.swap_sending(keep), swap_held(held)
        try:
            return self._encode_now(args, kwargs, held)
        except BaseException:
            if keep:
                cuda_tensors.release(keep)
            raise
        finally:
            cuda_tensors.restore_sending(old_send)
            swap_held(old_held)

    def _encode_now(self, args: tuple, kwargs: dict,
                    held: Optional[list] = None) -> tuple[bytes, list]:
        bound = None
        if self._sig is not None and not _fast_arity_ok(self._sig, args, kwargs):
            try:
                bound = self._sig.bind(*args, **kwargs)
            except TypeError as e:
                raise TypeError(f"{self._qualname()}{self._sig}: {e}") from None
        try:
            body, bufs = dumps((args, kwargs), "arguments")
        except SerializationError:
            if bound is None and self._sig is not None:
                bound = self._sig.bind(*args, **kwargs)
            culprit, reason = _unpicklable_argument(bound, args, kwargs)
            raise SerializationError(
                f"argument {culprit} of {self._qualname()}() cannot be pickled{reason}") from None
        total = len(body) + sum(memoryview(b).nbytes for b in bufs)
        if total > config.max_message_bytes:
            moved = None
            if held is not None:
                moved = bulk.offload(body, bufs, config.max_message_bytes, drop_on_read=False)
            if moved is None:
                how = ("its pickled part alone is too large: pass the bulk as arrays or "
                       "tensors, or through RDMABuffer" if held is not None else
                       "broadcast and send cannot move it over the data plane (no reply "
                       "says when the receivers have it): use call(), or RDMABuffer")
                raise MessageTooLargeError(
                    f"arguments of {self._qualname()}() are {total} bytes, over the message "
                    f"limit of {config.max_message_bytes} bytes (MONARCH_MAX_MESSAGE_BYTES); "
                    f"{how}")
            body, bufs, mine = moved
            held.extend(mine)
        return body, bufs

    def _encode_plain(self, args: tuple, kwargs: dict) -> Optional[bytes]:
        """The pickled arguments when they are plain data that fits the signature (no
        buffers, CUDA tensors or size limit to see to), else None: `_encode` then."""
        if self._sig is not None and not _fast_arity_ok(self._sig, args, kwargs):
            return None
        if not args and not kwargs:
            return _NO_ARGUMENTS
        body = dumps_plain((args, kwargs))
        if body is None or len(body) > config.max_message_bytes:
            return None
        return body

    def _ranks(self) -> list[int]:
        return self._mesh._ranks()

    def _dense_shape(self) -> Shape:
        """The dense Shape of this view's ranks, which call() results are laid out in (one
        per view: value meshes share their base shape anyway)."""
        got = self._mesh.__dict__.get("_dense_shape")
        if got is None:
            shape = self._mesh._shape
            got = self._mesh.__dict__["_dense_shape"] = Shape(shape.labels, shape.sizes_)
        return got

    def _where(self, ranks: list[int]) -> tuple[list, frozenset]:
        """(targets, proc ids) of `ranks`: (address, route) per rank, and their procs; kept
        once every proc has an address (it does not change after)."""
        got = self._targets
        if got is not None and ranks is self._mesh._ranks():
            return got
        rec = self._mesh._rec
        targets = [rec.target(r) for r in ranks]
        got = (targets, frozenset(rec.proc_ids[r] for r in ranks))
        if ranks is self._mesh._ranks() and all(t[0] for t in targets):
            self._targets = got
        return got

    def _call_extra(self) -> Optional[dict]:
        """A CALL header's extra: the slice this view is (for message_rank) and how a
        plain method made an endpoint is called; None when neither applies."""
        view, kind = self._mesh._view_extra(), self._extra
        if view is None or kind is None:
            return view if kind is None else kind
        return {**view, **kind}

    def _check_usable(self, ranks: list[int]) -> None:
        rec = self._mesh._rec
        if rec.stopped:  # in Monarch's words too
            name = f"{rec.owner_name}.<{rec.qual_cls or rec.cls_name} {rec.actor_id}>"
            why = ("actor mesh is stopped due to proc mesh shutdown" if rec.stopped_with_procs
                   else f"Actor {name} exited because of the following reason: stopped\n"
                        f"Supervision event: actor {name} has status:\n  stopped")
            raise MeshStoppedError(f"actor mesh {rec.name!r} was stopped: {why}")
        for r in ranks:
            f = rec.failed.get(r)
            if f is not None:
                if r in rec.init_failed:
                    raise SupervisionError(
                        f"actor mesh {rec.name!r} rank {r} failed in __init__:\n{rec.ready[r]}", f)
                raise SupervisionError(actor_failed_message(
                    rec.cls_name, rec.name, r, f.cause, rec.actor_name(r)) + "\n" + f.report(), f)

    # -- adverbs -------------------------------------------------------------------------------------
    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh]:
        """Call every actor of the mesh; a Future of a ValueMesh of their results."""
        ranks = self._ranks()
        self._check_usable(ranks)
        body = self._encode_plain(args, kwargs)
        if body is not None:  # plain data: nothing to keep alive or release
            return self._start(ranks, "call", body, [])
        keep, held = self._ipc_keep(ranks), []
        fut = self._start(ranks, "call", *self._encode(args, kwargs, keep, held))
        return _releasing(fut, (keep or []) + held)

    def call_one(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Call the mesh's only actor (ValueError if it has several)."""
        ranks = self._ranks()
        if len(ranks) != 1:
            raise ValueError(
                f"call_one() needs a mesh of exactly one actor; {self._mesh._rec.name!r} has "
                f"{len(ranks)} ({self._mesh.sizes}); slice it first, e.g. .slice(...)"
            )
        self._check_usable(ranks)
        body = self._encode_plain(args, kwargs)
        if body is not None:  # plain data: nothing to keep alive or release
            return self._start(ranks, "one", body, [], "call_one")
        keep, held = self._ipc_keep(ranks), []
        fut = self._start(ranks, "one", *self._encode(args, kwargs, keep, held), "call_one")
        return _releasing(fut, (keep or []) + held)

    def choose(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Call one actor of the mesh: the least loaded of those not failed."""
        rec = self._mesh._rec
        ranks = [r for r in self._ranks() if r not in rec.failed]
        if not ranks:
            self._check_usable(self._ranks())
        best = min(ranks, key=lambda r: (rec.inflight[r], (r - rec.rr) % len(rec.inflight)))
        keep, held = self._ipc_keep([best]), []
        body, bufs = self._encode(args, kwargs, keep, held)
        rec.rr = best + 1
        return _releasing(self._start([best], "one", body, bufs, "choose"),
                          (keep or []) + held)

    def _start(self, ranks: list[int], mode: str, body: bytes, bufs: list,
               adverb: str = "call") -> Future:
        """Send one call to `ranks`; a Future of the ValueMesh ("call") or the value ("one")."""
        label = self._labels.get(adverb)
        if label is None:
            label = self._labels[adverb] = f"{self._qualname()}.{adverb}"
        fut: Future = Future(label)
        _Collector(self, ranks, body, bufs, mode, fut).start()
        return fut

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every actor without waiting; an exception there fails the actor."""
        ranks = self._ranks()
        self._check_usable(ranks)
        body, bufs = self._encode(args, kwargs)
        rt = self._mesh._rt
        rec = self._mesh._rec
        h = Header(Kind.CALL, src=rt.proc_id, actor=rec.actor_id, method=self._name,
                   extra=self._call_extra())
        rt.messenger.cast([rec.target(r) for r in ranks], h, body, tuple(bufs))

    def rref(self, *args: Any, **kwargs: Any) -> Any:
        """Monarch's tensor-engine adverb: call the endpoint on the procs of the mesh
        tensors among the arguments, each actor with its proc's shards; its results become
        mesh tensors, shaped by the endpoint's `propagate=` (runtime/tensor/_rref.py)."""
        return _features.call("tensor.rref", self, args, kwargs)  # tensor is above _meshes

    def _send(self, args: tuple, kwargs: dict, port: Any = None,
              selection: str = "all") -> None:
        """Send without waiting; each actor's answer goes to `port` (a `Port`), if given.
        `selection`: "all" actors of the mesh, or "choose" one (the least loaded)."""
        rec = self._mesh._rec
        ranks = self._ranks()
        if selection == "choose":
            alive = [r for r in ranks if r not in rec.failed]
            if alive:
                ranks = [min(alive, key=lambda r: rec.inflight[r])]
        elif selection != "all":
            raise ValueError(f"selection must be 'all' or 'choose', got {selection!r}")
        self._check_usable(ranks)
        body, bufs = self._encode(args, kwargs)
        rt = self._mesh._rt
        h = Header(Kind.CALL, src=rt.proc_id, actor=rec.actor_id, method=self._name,
                   extra=self._call_extra())
        if port is not None:
            h.reply, h.port = port.address, port.port_id
        rt.messenger.cast([rec.target(r) for r in ranks], h, body, tuple(bufs))

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[Any]]:
        """Call every actor; yields one future per actor, in the order replies arrive."""
        ranks = self._ranks()
        self._check_usable(ranks)
        keep, held = self._ipc_keep(ranks), []
        body, bufs = self._encode(args, kwargs, keep, held)
        futs = [Future(f"{self._qualname()}.stream[{i}]") for i in range(len(ranks))]
        _Collector(self, ranks, body, bufs, "stream", futs).start()
        _releasing(futs, (keep or []) + held)
        return iter(futs)


def _releasing(futs: Any, keep: Optional[list]) -> Any:
    """Drop what a call exported for its receivers (CUDA IPC snapshots, arguments left on
    the data plane) once all its futures resolved (every receiver copied them before its
    handler ran, or failed); returns `futs` as given."""
    if keep:
        when_all(futs if isinstance(futs, list) else [futs],
                 lambda: cuda_tensors.release(keep))
    return futs


_NO_ARGUMENTS = dumps(((), {}))[0]

#: how long call() waits for the other ranks after one rank's actor failed
FAILED_RANKS_GRACE_S = 0.5


class _Interrupt:
    """A call's interrupt hook (Ctrl-C in a wait on its future): KeyboardInterrupt in the
    actors of its procs serving its port."""

    __slots__ = ("rt", "procs", "port")

    def __init__(self, rt: Any, procs: frozenset, port: int) -> None:
        self.rt = rt
        self.procs = procs
        self.port = port

    def __call__(self) -> None:
        self.rt.interrupt(self.procs, self.port)


class _Collector:
    """Gathers the replies of one call. Started (and its messages sent) in the caller's
    thread; replies and failures arrive on the I/O thread, in the order their senders sent
    them; `lock` makes each of them one step against the caller's thread."""

    __slots__ = ("ep", "rt", "rec", "ranks", "values", "index", "remaining", "mode", "futs",
                 "fut", "next_stream", "body", "bufs", "port", "error", "done",
                 "lock", "procs")

    def __init__(self, ep: EndpointRef, ranks: list[int], body: bytes, bufs: list, mode: str,
                 futs: "list[Future] | Future") -> None:
        self.ep = ep
        self.rt = ep._mesh._rt
        self.rec = ep._mesh._rec
        self.ranks = ranks
        # call(): the values by rank; one actor: its value (no list: one object less per
        # call for the garbage collector)
        self.values: Any = [None] * len(ranks) if mode != "one" else None
        self.index = {r: i for i, r in enumerate(ranks)} if len(ranks) > 1 else None
        self.remaining = dict.fromkeys(ranks)
        self.mode = mode
        # stream(): a future per rank; else the call's one future (no list around it)
        self.futs = futs
        self.fut: Future = futs[0] if type(futs) is list else futs
        self.next_stream = 0
        self.body = body
        self.bufs = bufs
        self.port = 0
        # call(): the first failed actor's SupervisionError, raised once every rank has
        # answered or failed (so each failure has reached its supervisor by then)
        self.error: Optional[BaseException] = None
        self.done = False
        self.lock = threading.Lock()

    def start(self) -> None:
        rt = self.rt
        rec = self.rec
        ranks = self.ranks
        targets, self.procs = self.ep._where(ranks)
        self.port = port = rt.open_port(self)  # this collector is the port's Waiter
        # Ctrl-C in a wait interrupts the remote call. The hook holds no mesh and not this
        # collector: a future (or one derived from it, which copies the hook) would keep
        # them alive, or in a cycle with it, for the garbage collector
        interrupt = _Interrupt(rt, self.procs, port) if config.interrupt_remote else None
        first = targets[0][0] or (targets[0][1] or ("",))[0]
        for f in (self.futs if type(self.futs) is list else (self.fut,)):
            f._ports = (port,)
            f._on_interrupt = interrupt
        inflight = rec.inflight
        for r in ranks:
            inflight[r] += 1
        h = Header(Kind.CALL, src=rt.proc_id, actor=rec.actor_id, method=self.ep._name,
                   reply=rt.reply_address_for(first),
                   port=port, extra=self.ep._call_extra())
        body, bufs = self.body, self.bufs
        self.body = self.bufs = None
        rt.messenger.cast(targets, h, body, tuple(bufs),
                          gather=self.mode == "call" and self._gatherable())

    def _gatherable(self) -> bool:
        """Whether host agents may gather the replies (runtime/host/gather.py): for call()
        of an endpoint whose replies come back from the actors it reached (not through a
        Port the handler may pass on)."""
        ep = self.ep
        return self.mode == "call" and ep._name not in self.rec.explicit_ports and \
            (ep._extra or {}).get("as") != "port"

    def _finish_rank(self, r: int) -> None:
        del self.remaining[r]
        self.rec.inflight[r] -= 1
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
                return
        if bulk.is_bulk(body):  # a large result left on the data plane: read it off the I/O
            def read() -> None:  # thread, then deliver on it (unless the call ended since)
                value = self._decode(h, r, body, buffers)
                self.rt.loop.call_soon(self._deliver_read, h, r, value)

            bulk.submit(read)
            return
        self._finish_rank(r)
        self._deliver(h, r, self._decode(h, r, body, buffers))

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
            return ActorError(f"cannot unpickle the reply of {self.ep._qualname()}(): "
                              f"{type(e).__name__}: {e}", mesh=self.rec.name, rank=r,
                              endpoint=self.ep._name)

    def _deliver(self, h: Header, r: int, value: Any) -> None:
        if h.status == ERROR and not isinstance(value, BaseException):
            value = ActorError(str(value), mesh=self.rec.name, rank=r, endpoint=self.ep._name)
        if self.mode == "stream":
            f = self.futs[self.next_stream]
            self.next_stream += 1
            if h.status == ERROR:
                self.rt.ports.settle()
                f.set_exception(value)
            else:
                self.rt.ports.settle()
                f.set_result(value)
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
            self._close()
            if self.error is not None:
                self.rt.ports.settle()
                self.fut.set_exception(self.error)
            elif self.mode == "call":
                base = self.ep._dense_shape()
                self.rt.ports.settle()
                self.fut.set_result(ValueMesh(base, self.values, base))
            elif self.mode == "one":
                self.rt.ports.settle()
                self.fut.set_result(self.values)

    def on_fail(self, exc: BaseException, proc: Optional[str] = None,
                actor: Optional[str] = None) -> None:
        """A proc (or, with `actor`, an actor) this call waits on failed (I/O thread). Every
        answer its actor sent before failing has been delivered by now: the failure comes
        after them on the same connection, or after the dead proc's stream was read
        (docs/transport.md)."""
        with self.lock:
            self._on_fail(exc, proc, actor)

    def _on_fail(self, exc: BaseException, proc: Optional[str], actor: Optional[str]) -> None:
        if self.done or (actor is not None and actor != self.rec.actor_id):
            return
        proc_ids = self.rec.proc_ids
        failed_ranks = [r for r in self.remaining if proc is None or proc_ids[r] == proc]
        if not failed_ranks:
            return
        exc = self._monarch_wording(exc, failed_ranks[0])
        if self.mode == "stream":
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
        line = f"Endpoint call {rec.name}.{self.ep._name}() failed, {why}"
        return SupervisionError(f"{exc.args[0]}\n{line}", failure)

    def _close(self) -> None:
        if not self.done:
            self.done = True
            if self.remaining:
                for r in list(self.remaining):
                    self._finish_rank(r)
            self.rt.close_port(self.port)


def send(endpoint: EndpointRef, args: tuple, kwargs: dict, port: Any = None,
         selection: str = "all") -> None:
    """Monarch's `send`: call `endpoint` with `args`/`kwargs` without waiting; each actor's
    answer (or exception) goes to `port` (from `Channel.open()`), none if it is None."""
    remote = sys.modules.get("runtime.tensor._remote")
    if remote is not None and isinstance(endpoint, remote.Remote):
        remote.send_to_port(endpoint, tuple(args), dict(kwargs or {}), port, selection)
        return
    if not isinstance(endpoint, EndpointRef):
        raise TypeError(f"send() needs an endpoint of an actor mesh (mesh.method) or a "
                        f"runtime.remote function, got {endpoint!r}")
    endpoint._send(tuple(args), dict(kwargs or {}), port, selection)


class NotAnEndpoint:
    """`mesh.method` for a public method not marked `@endpoint`: calling it raises;
    `as_endpoint(mesh.method)` makes it callable as an endpoint."""

    def __init__(self, mesh: "ActorMesh", name: str) -> None:
        self._mesh = mesh
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"Actor {self._mesh._rec.cls_name}.{self._name} is not annotated as an endpoint. "
            "To call it as one, add a @endpoint decorator to it, or wrap it: "
            f"as_endpoint(mesh.{self._name}).call(...)")

    def __repr__(self) -> str:
        return f"<not an endpoint: {self._mesh._rec.cls_name}.{self._name}>"


def as_endpoint(not_an_endpoint: Any, *, propagate: Any = None,
                explicit_response_port: bool = False) -> EndpointRef:
    """An endpoint of a spawned actor mesh's plain method (`as_endpoint(mesh.method)`);
    with `explicit_response_port=True` the method gets a Port first and answers through it."""
    if isinstance(not_an_endpoint, EndpointRef):
        return not_an_endpoint
    if not isinstance(not_an_endpoint, NotAnEndpoint):
        raise ValueError("expected a method of a spawned actor mesh (as_endpoint(mesh.method))")
    mesh, name = not_an_endpoint._mesh, not_an_endpoint._name
    sig = mesh._rec.methods.get(name)
    if sig is not None and explicit_response_port:
        params = list(sig.parameters.values())
        if params and params[0].kind != inspect.Parameter.VAR_POSITIONAL:
            sig = sig.replace(parameters=params[1:])
    return EndpointRef(mesh, name, sig, {"as": "port" if explicit_response_port else "call"})


_arity_cache: dict = {}


def _fast_arity_ok(sig: inspect.Signature, args: tuple, kwargs: dict) -> bool:
    """True when positional-only calls certainly fit a plain signature (skips bind())."""
    if kwargs:
        return False
    info = _arity_cache.get(id(sig))
    if info is None or info[0] is not sig:
        P = inspect.Parameter
        params = list(sig.parameters.values())
        plain = all(p.kind == P.POSITIONAL_OR_KEYWORD for p in params)
        required = sum(1 for p in params if p.default is P.empty)
        info = (sig, plain, required, len(params))
        if len(_arity_cache) >= 256:  # bounded: signatures of meshes that came and went
            _arity_cache.clear()
        _arity_cache[id(sig)] = info
    _, plain, required, total = info
    return plain and required <= len(args) <= total


def _unpicklable_argument(bound: Any, args: tuple, kwargs: dict) -> tuple[str, str]:
    """The first argument that cannot be pickled, and why: ("'x'", ": TypeError: ...")."""
    items = list(bound.arguments.items()) if bound is not None else \
        [(f"#{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    for name, value in items:
        try:
            dumps(value)
        except SerializationError as e:
            return repr(name), f": {e.__cause__ or e}"
    return "(unknown)", ""
