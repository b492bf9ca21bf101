"""Actor base class, the @endpoint decorator, and the per-actor context.

User code subclasses `Actor` and marks methods with `@endpoint`. Inside an actor,
`current_rank()`, `current_size()` and `context()` describe where it runs.

Layer 5 (on the core): imports `runtime._core` and the basics; `context().proc`
reaches `this_proc()` (in `_meshes`, above) through `runtime._base.features`.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar, overload

from ._base import context as _context, features as _features
from .shapes import Point, Shape

__all__ = [
    "F", "Actor", "EndpointDef", "endpoint", "concurrent_endpoint", "endpoints_of", "methods_of",
    "plain_signature", "ROOT_ID", "qualified_class", "CreatorInstance", "root_creator",
    "creator_record", "message_view", "ActorContext", "context", "current_rank",
    "current_actor_name", "current_size",
]

F = TypeVar("F", bound=Callable[..., Any])


class Actor:
    """Base class of actors. Define `@endpoint` methods; optionally `__supervise__(failure)`
    to handle failures of meshes this actor owns, and `__cleanup__(exc)` run at stop."""

    @functools.cached_property
    def logger(self) -> logging.Logger:
        """A logger named after the actor's class (Monarch's `Actor.logger`); its records carry
        `actor_name` and `rank` and print on the proc's stderr, which reaches the controller
        as `[mesh rank] LEVEL message`."""
        from .logs import actor_logger

        return actor_logger(type(self).__name__)


class EndpointDef:
    """An endpoint method on an Actor class (a descriptor).

    `explicit_response_port`: the method receives a `Port` as its first argument and
    answers through it (later, or from another actor) instead of returning the answer.
    `concurrent`: an async method run as a task on the actor's event loop, so the actor
    takes its next message while this one waits (`@concurrent_endpoint`).
    `propagate` (Monarch's keyword) gives the shapes of the results for `rref`, the tensor
    engine's adverb; `instrument` is kept for Monarch's code and changes nothing (no
    tracing spans)."""

    def __init__(self, fn: Callable[..., Any], propagate: Any = None,
                 explicit_response_port: bool = False, instrument: bool = True,
                 concurrent: bool = False) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.is_async = inspect.iscoroutinefunction(fn)
        self.propagate = propagate
        self.explicit_response_port = bool(explicit_response_port)
        self.instrument = bool(instrument)
        self.concurrent = bool(concurrent)
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__
        self.__wrapped__ = fn

    @property
    def _explicit_response_port(self) -> bool:
        """Monarch's attribute: true for explicit-port and for concurrent endpoints (which
        Monarch implements as explicit-port endpoints)."""
        return self.explicit_response_port or self.concurrent

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return self.fn.__get__(obj, objtype)  # inside the actor: a plain bound method

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def _check_propagate(propagate: Any) -> None:
    if propagate is None or propagate in ("cached", "inspect", "mocked") or callable(propagate):
        return
    raise ValueError(f"propagate={propagate!r}: expected None, 'cached', 'inspect', 'mocked' "
                     "or a callable")


@overload
def endpoint(fn: F) -> F: ...
@overload
def endpoint(*, propagate: Any = None, explicit_response_port: bool = False,
             instrument: bool = True) -> Callable[[F], F]: ...


def endpoint(fn: Any = None, *, propagate: Any = None, explicit_response_port: bool = False,
             instrument: bool = True) -> Any:
    """Mark an Actor method as callable from other processes (sync or async). With
    `explicit_response_port=True` the method gets a `Port` first and answers through it."""
    _check_propagate(propagate)

    def make(f: Any) -> EndpointDef:
        if isinstance(f, EndpointDef):  # applied twice: the outer options win
            f = f.fn
        return EndpointDef(f, propagate, explicit_response_port, instrument)

    if fn is None:
        return make
    return make(fn)


def concurrent_endpoint(fn: Any = None, *, propagate: Any = None,
                        explicit_response_port: bool = False, instrument: bool = True) -> Any:
    """An async endpoint run as a task on the actor's event loop: the actor handles its
    next message while this one awaits. Plain endpoints keep one-at-a-time order."""
    _check_propagate(propagate)

    def make(f: Any) -> EndpointDef:
        if isinstance(f, EndpointDef):
            raise ValueError("concurrent_endpoint does not wrap @endpoint; pass endpoint "
                             "options to @concurrent_endpoint")
        if not inspect.iscoroutinefunction(f):
            raise ValueError("concurrent_endpoint can only wrap async endpoints "
                             f"({getattr(f, '__name__', f)!r} is not `async def`)")
        return EndpointDef(f, propagate, explicit_response_port, instrument, concurrent=True)

    if fn is None:
        return make
    return make(fn)


def endpoints_of(cls: type) -> dict[str, EndpointDef]:
    """Every endpoint of an Actor class, including inherited ones."""
    out: dict[str, EndpointDef] = {}
    for klass in reversed(cls.__mro__):
        for name, v in vars(klass).items():
            if isinstance(v, EndpointDef):
                out[name] = v
            elif name in out:
                del out[name]  # overridden by a plain attribute
    return out


def methods_of(cls: type) -> list[str]:
    """The public methods of an Actor class that are not endpoints (`as_endpoint` can call
    them)."""
    out = []
    for name in dir(cls):
        if name.startswith("_") or hasattr(Actor, name):
            continue
        v = inspect.getattr_static(cls, name, None)
        if isinstance(v, EndpointDef) or not callable(v):
            continue
        out.append(name)
    return out


def plain_signature(fn: Callable[..., Any]) -> inspect.Signature:
    """The signature without `self` and without annotations (cheap to pickle)."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())[1:]
    params = [p.replace(annotation=inspect.Parameter.empty) for p in params]
    return sig.replace(parameters=params, return_annotation=inspect.Signature.empty)


# -- the context of the running actor ---------------------------------------------------
#: the actor id of the controller (Monarch's root client actor, printed `<root>`)
ROOT_ID = "controller"


def _qualified_name(ins: Any) -> str:
    """Monarch's actor name: `<root>.<module.Class name{'dim': i/n}>`, each creator's part
    before its child's (the root, the controller, is `<root>`)."""
    names = []
    while ins is not None:
        if ins.actor_id == ROOT_ID:
            break
        cls = getattr(ins, "qualified_class", None) or ins.class_name
        cls = f"{cls} " if cls else ""
        names.append(f"<{cls}{ins.name}{ins.rank if len(ins.rank) else ''}>")
        ins = ins.creator
    names.append("<root>")
    return ".".join(reversed(names))


def qualified_class(cls: type) -> str:
    """`module.QualName` of an actor class, as Monarch names actors."""
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True, repr=False)
class CreatorInstance:
    """The actor that spawned another (Monarch's `CreatorInstance`): mesh name, class name,
    rank and actor id; `creator` is its own creator, None for one spawned by the controller."""

    name: str
    class_name: Optional[str]
    rank: Point
    actor_id: str
    creator: Optional["CreatorInstance"] = None
    qualified_class: Optional[str] = None

    def __repr__(self) -> str:
        return _qualified_name(self)


def root_creator() -> CreatorInstance:
    """The creator of actors the controller spawned: Monarch's root client (`<root>`)."""
    return CreatorInstance("root", None, Point(0, Shape((), ())), ROOT_ID)


def creator_record(ins: Any) -> Optional[dict]:
    """A spawner (ActorContext or CreatorInstance) as msgpack-able data for SPAWN_ACTOR."""
    if ins is None:
        return None
    ext = ins.rank.extent
    return {"name": ins.name, "cls": ins.class_name, "actor_id": ins.actor_id,
            "qcls": getattr(ins, "qualified_class", None),
            "rank": ins.rank.rank, "labels": list(ext), "sizes": list(ext.values()),
            "creator": creator_record(ins.creator)}


#: the view (Shape) the message being handled was sent to; None: the whole mesh
message_view: contextvars.ContextVar[Optional[Shape]] = contextvars.ContextVar(
    "runtime.message_view", default=None)


@dataclass(frozen=True)
class ActorContext:
    """Where an actor runs: its id, mesh name, rank (a Point), and proc. Also Monarch's
    `Context` and `Instance` in one: `context().actor_instance` is this object."""

    actor_id: str
    name: str
    rank: Point
    proc_id: str
    host: str
    pid: int
    class_name: Optional[str] = None
    creator: Optional[CreatorInstance] = None
    qualified_class: Optional[str] = None

    @property
    def size(self) -> dict[str, int]:
        return dict(self.rank.extent)

    @property
    def actor_instance(self) -> "ActorContext":
        """Monarch's `context().actor_instance` (`.rank`, `.actor_id`, `.name`, `.creator`,
        `.class_name`, `.proc`): this same object."""
        return self

    @property
    def message_rank(self) -> Point:
        """This actor's point in the slice the current message was sent to (Monarch's
        `context().message_rank`); its own `rank` when the message went to the whole mesh."""
        view = message_view.get()
        if view is None:
            return self.rank
        return Point(view.global_ranks().index(self.rank.rank), view)

    def abort(self, reason: Optional[str] = None) -> None:
        """Monarch's `actor_instance.abort(reason)`: the actor fails once the message it is
        handling is done (that call still answers); its owner gets a supervision event."""
        inst = _context.current_instance()
        if inst is None or inst.actor_id != self.actor_id:
            raise RuntimeError("abort() is called from inside the actor's own endpoints")
        inst.abort_reason = reason if reason is not None else "no reason provided"

    def stop(self, reason: Optional[str] = None) -> None:
        """Monarch's `actor_instance.stop(reason)`: this actor stops (running `__cleanup__`)
        once the message it is handling is done; no failure is reported, later calls to it
        raise. Called from inside the actor's own endpoints."""
        inst = _context.current_instance()
        if inst is None or inst.actor_id != self.actor_id:
            raise RuntimeError("stop() is called from inside the actor's own endpoints "
                               "(to stop a mesh from outside, call mesh.stop())")
        inst.stop_self(reason if reason is not None else "stopped by itself")

    @property
    def proc_mesh(self) -> Any:
        """Monarch's `context().actor_instance.proc_mesh`: this actor's proc (`this_proc()`)."""
        return self.proc

    @property
    def proc(self) -> Any:
        """This actor's proc as a one-proc ProcMesh (`this_proc()`)."""
        return _features.call("this_proc")  # _meshes is above this layer

    def __str__(self) -> str:
        return _qualified_name(self)


# The running actor's context is a thread-local of runtime._base.context (the bottom layer), so
# that logs and rdma can read it without importing this module.
_set_context = _context.set_context
_get_context = _context.get_context


def context() -> ActorContext:
    """The running actor's context; outside an actor, the controller's (rank 0 of 1)."""
    ctx = _get_context()
    if ctx is not None:
        return ctx
    import os

    from ._base.process import hostname
    from ._core import get_runtime

    rt = get_runtime()
    return ActorContext("controller", "controller", Point(0, Shape((), ())), rt.proc_id,
                        hostname(), os.getpid())


def current_rank() -> Point:
    """This actor's point in the slice the current message was sent to (Monarch's
    `current_rank()`, i.e. `context().message_rank`); its point in its whole mesh when the
    message went to the whole mesh, and in `__init__`. The spawn rank is always
    `context().actor_instance.rank`."""
    return context().message_rank


def current_actor_name() -> str:
    """The running actor's own name (Monarch's `current_actor_name()`): its mesh's id and
    its rank, `mesh-1a2b3c4d[3]`, distinct for every actor; "controller" outside an actor."""
    ins = context().actor_instance
    if ins.actor_id == ROOT_ID:
        return ROOT_ID
    return f"{ins.actor_id}[{ins.rank.rank}]"


def current_size() -> dict[str, int]:
    """The sizes of the slice the current message was sent to, by dimension (Monarch's
    `current_size()`); of the whole mesh outside a sliced call."""
    return dict(context().message_rank.extent)
