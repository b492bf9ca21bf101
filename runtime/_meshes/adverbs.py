"""Adverbs on a mesh's endpoint: call, call_one, choose, broadcast, stream.

`mesh.method` is an `EndpointRef`. Arguments are checked against the endpoint's signature
and pickled in the caller's thread (`arguments`: errors name the argument), which also sends
the messages (one per proc, or one per remote host agent); the I/O thread collects the
replies into futures (`collector`).
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Iterator, Optional, Protocol

from .._base import features as _features
from ..errors import MeshStoppedError, SupervisionError, actor_failed_message
from ..future import Future
from ..shapes import Shape
from ..transport.framing import Header, Kind
from ..value_mesh import ValueMesh
from .arguments import ArgumentEncoder, releasing
from .collector import Fold, ReplyCollector, take_room

__all__ = ["EndpointMesh", "MeshRef", "EndpointRef", "send", "fold_call", "NotAnEndpoint",
           "as_endpoint", "endpoint_parts"]


class EndpointMesh(Protocol):
    """What an endpoint uses of the actor mesh it belongs to (an ActorMesh): its sizes, for
    errors, and its repr."""

    @property
    def sizes(self) -> Any: ...


class MeshRef:
    """One view of an actor mesh as the code that calls its actors sees it, in public fields:
    the runtime, the mesh's record, the view's shape, the proc mesh it was spawned on (None
    where unpickled) and the actor class (None where not local). Its ActorMesh holds one (the
    handle's attribute names are its endpoints') and hands it to its endpoints; the view's
    caches (its ranks, its CALL extra, the dense shape of call() results) live here."""

    __slots__ = ("rt", "rec", "shape", "proc_mesh", "actor_class", "_ranks", "_view",
                 "_dense")

    def __init__(self, rt: Any, rec: Any, shape: Shape, proc_mesh: Any,
                 actor_class: Optional[type]) -> None:
        self.rt = rt
        self.rec = rec
        self.shape = shape
        self.proc_mesh = proc_mesh
        self.actor_class = actor_class
        self._ranks: Optional[list[int]] = None
        self._view: Any = False
        self._dense: Optional[Shape] = None

    def ranks(self) -> list[int]:
        """The global ranks of this view (one list, kept)."""
        r = self._ranks
        if r is None:
            r = self._ranks = self.shape.global_ranks()
        return r

    def view_extra(self) -> Optional[dict]:
        """For a CALL header: the slice this view is, so each actor knows its
        `context().message_rank`; None for the whole mesh (nothing to send)."""
        v = self._view
        if v is False:
            sh, sizes = self.shape, self.rec.sizes
            whole = Shape(list(sizes), list(sizes.values()))
            v = None if sh == whole else {"view": [list(sh.labels), list(sh.sizes_),
                                                   list(sh.strides), sh.offset]}
            self._view = v
        return v

    def dense_shape(self) -> Shape:
        """The dense Shape of this view's ranks, which call() results are laid out in (one
        per view: value meshes share their base shape anyway)."""
        got = self._dense
        if got is None:
            got = self._dense = Shape(self.shape.labels, self.shape.sizes_)
        return got


class EndpointRef:
    """An endpoint of an actor mesh (or of a slice of it); exported as `runtime.Endpoint`
    too (Monarch's name), and `Endpoint[P, R]` is the class itself."""

    def __class_getitem__(cls, item: Any) -> type:
        return cls

    def __init__(self, mesh: EndpointMesh, ref: MeshRef, name: str,
                 signature: Optional[inspect.Signature], extra: Optional[dict] = None) -> None:
        self._mesh = mesh
        self._ref = ref  # the mesh's runtime, record and view
        self._name = name
        self._sig = signature
        self._args = ArgumentEncoder(signature, f"{ref.rec.cls_name}.{name}")  # checks and pickles arguments
        self._extra = extra  # {"as": "call"|"port"} for as_endpoint() of a plain method
        self._targets: Optional[tuple] = None  # (targets, proc ids) once all are known
        self._labels: dict[str, str] = {}  # adverb -> its futures' label

    def __repr__(self) -> str:
        return f"<endpoint {self._ref.rec.cls_name}.{self._name} of {self._mesh!r}>"

    #: The adverbs, in the order completion offers them.
    ADVERBS = ("call", "call_one", "choose", "broadcast", "stream", "rref")

    def getdoc(self) -> str:
        """What IPython's `?` and Shift-Tab show (it calls `obj.getdoc()` first): the
        endpoint's signature, its docstring where the class is local, and the adverbs."""
        sig = "(...)" if self._sig is None else str(self._sig)
        cls = self._ref.actor_class
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
        return f"{self._ref.rec.cls_name}.{self._name}"

    def _ipc_keep(self, ranks: list[int]) -> Optional[list]:
        """A list for CUDA IPC snapshots when every target proc shares this host (ipc://
        addresses), else None: CUDA tensors are then staged through pinned host memory."""
        rec = self._ref.rec
        if all(str(rec.target(r)[0]).startswith("ipc://") for r in ranks):
            return []
        return None

    def _ranks(self) -> list[int]:
        return self._ref.ranks()

    def _dense_shape(self) -> Shape:
        """The dense Shape of this view's ranks, which call() results are laid out in (one
        per view: value meshes share their base shape anyway)."""
        return self._ref.dense_shape()

    def _where(self, ranks: list[int]) -> tuple[list, frozenset]:
        """(targets, proc ids) of `ranks`: (address, route) per rank, and their procs; kept
        for the view's own ranks (a record's addresses and routes never change), so a mesh's
        casts reuse one targets list and with it its cast tree (`Messenger.tree_for`)."""
        got = self._targets
        if got is not None and ranks is self._ref.ranks():
            return got
        rec = self._ref.rec
        targets = [rec.target(r) for r in ranks]
        got = (targets, frozenset(rec.proc_ids[r] for r in ranks))
        if ranks is self._ref.ranks():
            self._targets = got
        return got

    def _call_extra(self) -> Optional[dict]:
        """A CALL header's extra: the slice this view is (for message_rank) and how a
        plain method made an endpoint is called; None when neither applies."""
        view, kind = self._ref.view_extra(), self._extra
        if view is None or kind is None:
            return view if kind is None else kind
        return {**view, **kind}

    def _check_usable(self, ranks: list[int]) -> None:
        rec = self._ref.rec
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
                    raise SupervisionError(_init_failed_message(rec, ranks), f)
                raise SupervisionError(actor_failed_message(
                    rec.cls_name, rec.name, r, f.cause, rec.actor_name(r)) + "\n" + f.report(), f)

    # -- adverbs -------------------------------------------------------------------------------------
    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh]:
        """Call every actor of the mesh; a Future of a ValueMesh of their results."""
        ranks = self._ranks()
        self._check_usable(ranks)
        body = self._args.plain(args, kwargs)
        if body is not None:  # plain data: nothing to keep alive or release
            return self._start(ranks, "call", body, [])
        keep = self._ipc_keep(ranks)
        held: list = []
        fut = self._start(ranks, "call", *self._args.encode(args, kwargs, keep, held))
        return releasing(fut, (keep or []) + held)

    def call_one(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Call the mesh's only actor (ValueError if it has several)."""
        ranks = self._ranks()
        if len(ranks) != 1:
            raise ValueError(
                f"call_one() needs a mesh of exactly one actor; {self._ref.rec.name!r} has "
                f"{len(ranks)} ({self._mesh.sizes}); slice it first, e.g. .slice(...)"
            )
        self._check_usable(ranks)
        body = self._args.plain(args, kwargs)
        if body is not None:  # plain data: nothing to keep alive or release
            return self._start(ranks, "one", body, [], "call_one")
        keep = self._ipc_keep(ranks)
        held: list = []
        fut = self._start(ranks, "one", *self._args.encode(args, kwargs, keep, held), "call_one")
        return releasing(fut, (keep or []) + held)

    def choose(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Call one actor of the mesh: the least loaded of those not failed."""
        rec = self._ref.rec
        ranks = [r for r in self._ranks() if r not in rec.failed]
        if not ranks:
            self._check_usable(self._ranks())
        best = min(ranks, key=lambda r: (rec.inflight[r], (r - rec.rr) % len(rec.inflight)))
        keep = self._ipc_keep([best])
        held: list = []
        body, bufs = self._args.encode(args, kwargs, keep, held)
        rec.rr = best + 1
        return releasing(self._start([best], "one", body, bufs, "choose"),
                          (keep or []) + held)

    def _start(self, ranks: list[int], mode: str, body: bytes, bufs: list,
               adverb: str = "call") -> Future:
        """Send one call to `ranks`; a Future of the ValueMesh ("call") or the value ("one")."""
        label = self._labels.get(adverb)
        if label is None:
            label = self._labels[adverb] = f"{self._qualname()}.{adverb}"
        fut: Future = Future(label)
        self._collector(ranks, body, bufs, mode, fut).start()
        return fut

    def _collector(self, ranks: list[int], body: bytes, bufs: list, mode: str,
                   futs: "list[Future] | Future", fold: Optional[Fold] = None
                   ) -> ReplyCollector:
        """What gathers the replies of one call of this endpoint to `ranks`."""
        return ReplyCollector(self._ref.rt, self._ref.rec, self._name, self._qualname(),
                              self._call_extra(), self._where(ranks),
                              self._dense_shape() if mode == "call" else None, ranks, body,
                              bufs, mode, futs, fold)

    def _fold(self, args: tuple, kwargs: dict, fold: Fold) -> Future:
        """Call every actor; a Future of their results folded with `fold` (host agents
        fold on the way up: runtime/host/folds.py)."""
        ranks = self._ranks()
        self._check_usable(ranks)
        keep = self._ipc_keep(ranks)
        held: list = []
        body, bufs = self._args.encode(args, kwargs, keep, held)
        fut: Future = Future(f"{self._qualname()}.accumulate")
        self._collector(ranks, body, bufs, "call", fut, fold).start()
        return releasing(fut, (keep or []) + held)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every actor without waiting; an exception there fails the actor."""
        ranks = self._ranks()
        self._check_usable(ranks)
        body, bufs = self._args.encode(args, kwargs)
        self._cast_unanswered(ranks, body, bufs)

    def rref(self, *args: Any, **kwargs: Any) -> Any:
        """Monarch's tensor-engine adverb: call the endpoint on the procs of the mesh
        tensors among the arguments, each actor with its proc's shards; its results become
        mesh tensors, shaped by the endpoint's `propagate=` (runtime/tensor/_rref.py)."""
        return _features.call("tensor.rref", self, args, kwargs)  # tensor is above _meshes

    def _send(self, args: tuple, kwargs: dict, port: Any = None,
              selection: str = "all") -> None:
        """Send without waiting; each actor's answer goes to `port` (a `Port`), if given.
        `selection`: "all" actors of the mesh, or "choose" one (the least loaded)."""
        rec = self._ref.rec
        ranks = self._ranks()
        if selection == "choose":
            alive = [r for r in ranks if r not in rec.failed]
            if alive:
                ranks = [min(alive, key=lambda r: rec.inflight[r])]
        elif selection != "all":
            raise ValueError(f"selection must be 'all' or 'choose', got {selection!r}")
        self._check_usable(ranks)
        body, bufs = self._args.encode(args, kwargs)
        self._cast_unanswered(ranks, body, bufs, port)

    def _cast_unanswered(self, ranks: list[int], body: bytes, bufs: list,
                         port: Any = None) -> None:
        """Send a call whose answer does not come back to this process (none, or to `port`):
        it counts in the call window like a call until each actor confirms it took it
        (TAKEN), so a flood of broadcasts to a slow actor waits here instead of filling its
        mailbox (docs/transport.md, "Full queues")."""
        rt = self._ref.rt
        rec = self._ref.rec
        targets = self._where(ranks)[0]  # kept: one cast tree per mesh, not one per send
        size = len(body) + sum(memoryview(b).nbytes for b in bufs)
        take_room(rt, rec, ranks, size, confirm=True)
        first = targets[0][0] or (targets[0][1] or ("",))[0] if targets else ""
        extra = {**(self._call_extra() or {}), "taken": rt.reply_address_for(first)}
        h = Header(Kind.CALL, src=rt.proc_id, actor=rec.actor_id, method=self._name,
                   extra=extra)
        if port is not None:
            h.reply, h.port = port.address, port.port_id
        try:
            rt.messenger.cast(targets, h, body, tuple(bufs),
                              base=rec.agents() if rec.routes else None)
        except BaseException:  # not sent: nothing of it stays in the window
            for r in ranks:
                rec.unconfirmed[r].pop()
                rec.release(r, 1, size)
            raise

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[Any]]:
        """Call every actor; yields one future per actor, in the order replies arrive."""
        ranks = self._ranks()
        self._check_usable(ranks)
        keep = self._ipc_keep(ranks)
        held: list = []
        body, bufs = self._args.encode(args, kwargs, keep, held)
        futs: list[Future] = [Future(f"{self._qualname()}.stream[{i}]")
                              for i in range(len(ranks))]
        self._collector(ranks, body, bufs, "stream", futs).start()
        releasing(futs, (keep or []) + held)
        return iter(futs)


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


def fold_call(endpoint: EndpointRef, args: tuple, kwargs: dict, fold: Fold) -> Future:
    """`Accumulator(endpoint, ..., associative=True).accumulate(*args, **kwargs)`: one call
    of every actor whose results are folded on the way up (runtime/_meshes/accumulator.py)."""
    return endpoint._fold(tuple(args), dict(kwargs or {}), fold)


class NotAnEndpoint:
    """`mesh.method` for a public method not marked `@endpoint`: calling it raises;
    `as_endpoint(mesh.method)` makes it callable as an endpoint."""

    def __init__(self, mesh: EndpointMesh, ref: MeshRef, name: str) -> None:
        self._mesh = mesh
        self._ref = ref
        self._name = name

    #: what an endpoint offers: on a plain method each raises the same helpful error
    ADVERBS = frozenset({"call", "call_one", "choose", "broadcast", "stream", "send",
                         "rref", "ref"})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse("call")

    def _refuse(self, adverb: str) -> None:
        raise RuntimeError(
            f"Actor {self._ref.rec.cls_name}.{self._name} is not annotated as an endpoint. "
            "To call it as one, add a @endpoint decorator to it (outermost: above @traced), "
            f"or wrap it: as_endpoint(mesh.{self._name}).{adverb}(...)")

    def __getattr__(self, name: str) -> Any:
        if name in NotAnEndpoint.ADVERBS:  # mesh.method.call_one(): the same message
            def refuse(*args: Any, **kwargs: Any) -> Any:
                self._refuse(name)

            return refuse
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"<not an endpoint: {self._ref.rec.cls_name}.{self._name}>"


def as_endpoint(not_an_endpoint: Any, *, propagate: Any = None,
                explicit_response_port: bool = False) -> EndpointRef:
    """An endpoint of a spawned actor mesh's plain method (`as_endpoint(mesh.method)`);
    with `explicit_response_port=True` the method gets a Port first and answers through it."""
    if isinstance(not_an_endpoint, EndpointRef):
        return not_an_endpoint
    if not isinstance(not_an_endpoint, NotAnEndpoint):
        raise ValueError("expected a method of a spawned actor mesh (as_endpoint(mesh.method))")
    mesh, ref, name = not_an_endpoint._mesh, not_an_endpoint._ref, not_an_endpoint._name
    sig = ref.rec.methods.get(name)
    if sig is not None and explicit_response_port:
        params = list(sig.parameters.values())
        if params and params[0].kind != inspect.Parameter.VAR_POSITIONAL:
            sig = sig.replace(parameters=params[1:])
    return EndpointRef(mesh, ref, name, sig, {"as": "port" if explicit_response_port else "call"})


def endpoint_parts(endpoint: EndpointRef) -> tuple[Any, MeshRef, str]:
    """(the actor mesh, its MeshRef, the endpoint's name) of `endpoint` (the `rref` adverb)."""
    return endpoint._mesh, endpoint._ref, endpoint._name


def _init_failed_message(rec: Any, ranks: list[int]) -> str:
    """Every rank of `ranks` whose `__init__` failed, each distinct error once with the
    ranks that raised it (not only the first failed rank)."""
    from ..supervision.fold import ranks_phrase

    failed = [r for r in ranks if r in rec.init_failed]
    texts: dict[str, list[int]] = {}
    for r in failed:
        texts.setdefault(str(rec.ready[r]), []).append(r)
    head = (f"actor mesh {rec.name!r} {ranks_phrase(failed)} ({len(failed)} of "
            f"{len(rec.proc_ids)}) failed in __init__:")
    if len(texts) == 1:
        return f"{head}\n{next(iter(texts))}"
    return "\n".join([head] + [f"--- {ranks_phrase(rs)} ---\n{t}" for t, rs in texts.items()])

