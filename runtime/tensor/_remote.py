"""`runtime.remote`: a function that runs on every proc of a mesh with the local shards of
its mesh-tensor arguments, as Monarch's `monarch.remote`. With `propagate` (a function run
on fake tensors, or "inspect" to run the function itself on them) a call returns mesh
tensors at once; without it, a call returns a Future of a ValueMesh of the values.

The controller's half; the procs run the calls in `_worker` (`run_call`, `call_value`)."""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ..future import Future
from ..value_mesh import map_values
from ._engine import engine_for, send_call, send_command, then
from ._tensor import Tensor, placement, same_mesh
from ._worker import Ref, RemoteTensorError, resolve_path

if TYPE_CHECKING:
    from ..value_mesh import ValueMesh

__all__ = ["Propagator", "Remote", "remote", "call_on_shard_and_fetch", "send_to_port"]

Propagator = Union[None, str, Callable[..., Any]]


def _name_of(fn: Any) -> str:
    if isinstance(fn, str):
        return fn
    mod = getattr(fn, "__module__", None) or ""
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    if qual.startswith("_VariableFunctionsClass."):  # torch.matmul and the like
        mod, qual = "torch", qual.partition(".")[2]
    return f"{mod}.{qual}" if mod else qual


def _spec_of(fn: Any, name: str) -> tuple:
    """What goes to the procs: ("path", 'mod.fn') or ("pickled", bytes). The function is
    pickled here (by value when it lives in a notebook or is local), so a function that
    cannot be pickled fails at the call site."""
    if isinstance(fn, str):
        return ("path", fn)
    import cloudpickle

    try:
        return ("pickled", cloudpickle.dumps(fn))
    except Exception as e:
        from ..errors import SerializationError

        raise SerializationError(f"remote({name}) cannot be sent to the procs: the function "
                                 f"cannot be pickled: {type(e).__name__}: {e}") from e


class Remote:
    """A function callable on every proc of a mesh (see `remote`)."""

    def __init__(self, fn: Union[str, Callable[..., Any]], propagate: Propagator) -> None:
        if not (isinstance(fn, str) or callable(fn)):
            raise TypeError(f"remote() takes a function or a 'module.function' path, got "
                            f"{type(fn).__name__}")
        if not (propagate is None or propagate == "inspect" or callable(propagate)):
            raise ValueError(f"propagate must be None, 'inspect' or a function, got "
                             f"{propagate!r}")
        self._fn = fn
        self._propagate = propagate
        self.name = _name_of(fn)
        if callable(fn):
            functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"runtime.remote({self.name!r}, propagate={self._propagate!r})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """With propagate: mesh tensors (nothing waits). Without: a Future of a ValueMesh
        of every rank's return value (as `call`)."""
        propagate = self._propagate
        if propagate is None:
            return self.call(*args, **kwargs)
        return self._rref(propagate, args, kwargs)

    def _local_fn(self) -> Callable[..., Any]:
        return resolve_path(self._fn) if isinstance(self._fn, str) else self._fn

    def _rref(self, propagate: Union[str, Callable[..., Any]], args: tuple, kwargs: dict
              ) -> Any:
        engine, key, target, mesh, found = _where(self.name, args, kwargs)
        # a string is "inspect" (__init__ takes no other)
        prop = self._local_fn() if isinstance(propagate, str) else propagate
        fake_out = _run_fake(prop, args, kwargs, self.name)
        out_ids: list = []
        expect: list = []

        def wrap(o: Any) -> Any:
            if isinstance(o, torch.Tensor):
                t = Tensor(o.shape, o.stride(), 0, o.dtype, None, mesh, o.device, engine, key,
                           target)
                out_ids.append(t.ref)
                expect.append((tuple(o.shape), o.dtype))
                return t
            return o

        out = tree_map(wrap, fake_out)
        spec = _spec_of(self._fn, self.name)
        wargs, wkwargs = _wire((args, kwargs))
        send_command(engine, key, target, ("call", spec, wargs, wkwargs, out_ids, expect,
                                           self.name))
        return out

    def call(self, *args: Any, **kwargs: Any) -> Future:
        """Run on every proc of the mesh (the mesh tensors' mesh, else the active one); a
        Future of a ValueMesh of the return values (tensors come back as CPU tensors). A
        rank that raised makes the Future raise RemoteTensorError."""
        engine, key, target, mesh, found = _where(self.name, args, kwargs)
        spec = _spec_of(self._fn, self.name)
        wargs, wkwargs = _wire((args, kwargs))
        return send_call(engine, key, lambda: target.call_value.call(spec, wargs, wkwargs,
                                                                     self.name),
                         f"remote({self.name}).call", _values, keepalive=found)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Run on every proc for its effects only (Monarch's `broadcast`): nothing comes
        back; a failure goes to the proc's log (use `call` to see it here)."""
        engine, key, target, mesh, found = _where(self.name, args, kwargs)
        spec = _spec_of(self._fn, self.name)
        wargs, wkwargs = _wire((args, kwargs))
        send_command(engine, key, target, ("call", spec, wargs, wkwargs, [], None, self.name))

    def call_one(self, *args: Any, **kwargs: Any) -> Future:
        """`call` on a mesh of one proc: a Future of its return value."""
        engine, key, target, mesh, found = _where(self.name, args, kwargs)
        if len(key) != 1:
            raise ValueError(f"call_one() needs a mesh of one proc; {mesh.name!r} has "
                             f"{len(key)} ({mesh.sizes}); use call() or "
                             "call_on_shard_and_fetch")
        return _then(self.call(*args, **kwargs), lambda vm: next(iter(vm.values())))


_then = then


def _values(vm: "ValueMesh") -> "ValueMesh":
    """The workers' ("ok", value) replies unwrapped; the first ("failed", Failure) raises."""
    def value(v: tuple) -> Any:
        if v[0] == "failed":
            raise RemoteTensorError(v[1])
        return v[1]

    return map_values(vm, value)


def remote(function: Any = None, *, propagate: Propagator = None) -> Any:
    """Monarch's `remote`: `remote(fn_or_path, propagate=...)`, or as a decorator
    (`@remote` / `@remote(propagate=...)`); returns a `Remote`."""
    if function is None:
        return functools.partial(remote, propagate=propagate)
    return Remote(function, propagate)


def call_on_shard_and_fetch(fn: Any, *args: Any, shard: Optional[dict] = None,
                            **kwargs: Any) -> Future:
    """Monarch's `call_on_shard_and_fetch`: run `fn` (a `Remote`, a function or a path) on
    the one proc at `shard`'s coordinates of the mesh (those not given are 0); a Future of
    its return value."""
    if not isinstance(fn, Remote):
        fn = Remote(fn, None)
    engine, key, _, mesh, found = _where(fn.name, args, kwargs)
    coords = dict(shard or {})
    unknown = set(coords) - set(mesh.sizes)
    if unknown:
        raise KeyError(f"{sorted(unknown)} are not dimensions of {mesh!r} "
                       f"(its dimensions: {list(mesh.sizes)})")
    one = engine.target(mesh.slice(**{d: coords.get(d, 0) for d in mesh.sizes}))[1]
    spec = _spec_of(fn._fn, fn.name)
    wargs, wkwargs = _wire((args, kwargs))
    return send_call(engine, key, lambda: one.call_value.call(spec, wargs, wkwargs, fn.name),
                     f"call_on_shard_and_fetch({fn.name})",
                     lambda vm: next(iter(_values(vm).values())), keepalive=found)


def _where(name: str, args: tuple, kwargs: dict) -> tuple:
    """(engine, key, target, mesh, mesh tensors) of a call: the mesh of its mesh-tensor
    arguments, else the active mesh."""
    from ._context import get_active_mesh

    found = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, Tensor)]
    if found:
        first = same_mesh(found, f"remote({name}): arguments")
        engine, key, target = placement(first)
        mesh = first.mesh
    else:
        active = get_active_mesh()
        if active is None:
            raise RuntimeError(f"remote({name}) needs an active mesh (`with mesh.activate():`) "
                               "or mesh tensors among its arguments")
        mesh = active
        engine = engine_for(mesh)
        key, target = engine.target(mesh)
    engine.check(key)
    return engine, key, target, mesh, found


def _wire(tree: Any) -> Any:
    return tree_map(lambda x: Ref(x.ref) if isinstance(x, Tensor) else x, tree)


def _run_fake(prop: Callable[..., Any], args: tuple, kwargs: dict, name: str) -> Any:
    """Run the propagator on fake tensors with the arguments' metadata (shape errors raise
    here, before anything is sent)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ._context import no_mesh

    mode = FakeTensorMode(allow_non_fake_inputs=False)
    quiet = logging.getLogger("torch._subclasses.fake_tensor")  # it logs every shape error
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        with no_mesh(), mode:
            return _call_fake(mode, prop, args, kwargs, name)
    finally:
        quiet.setLevel(level)


def _call_fake(mode: Any, prop: Callable[..., Any], args: tuple, kwargs: dict,
               name: str) -> Any:
    def fake(x: Any) -> Any:
        if isinstance(x, Tensor):
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
        if isinstance(x, torch.Tensor):
            return mode.from_tensor(x)
        return x

    fargs, fkwargs = tree_map(fake, (args, kwargs))
    try:
        return prop(*fargs, **fkwargs)
    except Exception as e:
        e.add_note(f"(raised by remote({name})'s propagate, run on fake tensors on the "
                   "controller; nothing was sent)")
        raise


def send_to_port(fn: "Remote", args: tuple, kwargs: dict, port: Any, selection: str) -> None:
    """Monarch's `send(remote_fn, args, kwargs, port=...)`: run `fn` on every proc of the
    mesh (or, with selection="choose", on one of them) without waiting; each proc's return
    value (or its RemoteTensorError) goes to `port`, when given."""
    if selection not in ("all", "choose"):
        raise ValueError(f"selection must be 'all' or 'choose', got {selection!r}")
    if port is None:
        fn.broadcast(*args, **kwargs)
        return
    fut = fn.call(*args, **kwargs)

    def done(f: Future) -> None:
        e = f.exception(0)
        if e is not None:
            port.exception(e)
            return
        values = list(f.result(0).values())
        for v in values[:1] if selection == "choose" else values:
            port.send(v)

    fut.add_done_callback(done)
