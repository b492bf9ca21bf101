"""`runtime.Tensor`: a controller-side handle on a tensor that lives on every proc of a
mesh. It holds shape, dtype, device, mesh and a ref id, never values; each aten op on it
runs on meta tensors here (shapes, dtypes, shape errors at the call site) and is queued
for the procs."""

from __future__ import annotations

import html
import weakref
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from ..future import Future
from . import _coalescing
from ._engine import Engine, ref_ids, engine_for, send_call, send_command, sender
from ._metacache import ATOMS, cache, cache_key, key_of, lookup, make_key, op_entry, \
    remember, remember_inplace, tensor_key
from ._worker import Ref, RemoteTensorError, local_shard

if TYPE_CHECKING:
    from .._meshes import ActorMesh, ProcMesh

__all__ = ["Tensor", "scan", "same_mesh", "dispatch", "placement", "engine_of", "same_place",
           "fetch_one", "tensor_state", "tensor_html"]

_META = torch.device("meta")
_SCALAR = torch.ops.aten._local_scalar_dense.default
_CPU = torch.device("cpu")


class _Freer(weakref.ref):
    """A weak reference to a mesh tensor, made with `_freed` as its callback, that frees its
    shards on its procs when the tensor dies: what a `weakref.finalize` with atexit=False
    did, at a tenth of its cost (no Python frame to make one)."""

    __slots__ = ("args",)
    args: tuple[Engine, tuple, "ActorMesh", int]  # (engine, key, target, ref)


#: ref id -> its _Freer (a weak reference must outlive its referent for its callback to run)
_live: dict = {}
_finalize = weakref.finalize
_put = sender.put


def _freed(w: _Freer) -> None:
    """A _Freer's callback: queue the free of the tensor's shards on its procs (any thread),
    unless the interpreter is exiting (the at-exit pass of `weakref.finalize` started;
    Engine makes sure it is registered)."""
    engine, key, target, ref = w.args
    if _live.pop(ref, None) is not None and not getattr(_finalize, "_shutdown", False):
        _put(("cmd", engine, key, target, ("free", (ref,)), True))


def _make(size: Any, stride: Any, offset: int, dtype: torch.dtype,
          meta: Optional[torch.Tensor], mesh: "ProcMesh", device: torch.device,
          engine: Engine, key: tuple, target: "ActorMesh") -> "Tensor":
    """A new mesh tensor (`Tensor(...)` without its Python `__new__` and `__init__` frames;
    `device` already names its index where it has one)."""
    if offset:  # torch's defaults (offset 0, no grad) are cheaper left out: once per op
        r = _wrapper(Tensor, size, strides=stride, storage_offset=offset, dtype=dtype,
                     device=device)
    else:
        r = _wrapper(Tensor, size, strides=stride, dtype=dtype, device=device)
    if meta is not None:
        r._meta_t = meta
    r.mesh = mesh
    ref = r.ref = next(ref_ids)
    r._engine, r._key, r._target = engine, key, target
    w = _live[ref] = _Freer(r, _freed)
    w.args = (engine, key, target, ref)
    return r


_wrapper = torch.Tensor._make_wrapper_subclass


class Tensor(torch.Tensor):
    """A tensor on every proc of `mesh` (each rank its own values); the controller holds its
    shape, dtype, device and mesh only. Fetch values with `runtime.inspect` / `fetch_shard`."""

    mesh: "ProcMesh"
    ref: int
    _meta_t: Optional[torch.Tensor] = None
    _engine: Engine
    _key: tuple
    _target: "ActorMesh"
    #: this tensor's part of a metadata cache key (made when first needed)
    _mkey: Optional[tuple] = None
    # Monarch's method forms, set by runtime.tensor._collectives (which imports this module)
    reduce: Callable[..., "Tensor"]
    reduce_: Callable[..., "Tensor"]
    to_mesh: Callable[..., Any]
    slice_mesh: Callable[..., Any]

    @staticmethod
    def __new__(cls, size: Any, stride: Any, offset: int, dtype: torch.dtype,
                meta: Optional[torch.Tensor], mesh: "ProcMesh", device: torch.device,
                engine: Engine, key: tuple, target: "ActorMesh") -> "Tensor":
        if device.index is None and device.type not in ("cpu", "meta"):
            # an accelerator device names its index, as a real tensor's does ("cuda" is each
            # proc's cuda:0): autograd's engine on the controller files work by that index
            device = torch.device(device.type, 0)
        return _make(size, stride, offset, dtype, meta, mesh, device, engine, key, target)

    @property
    def _meta(self) -> torch.Tensor:
        """A meta tensor with this tensor's metadata (made when first needed)."""
        m = self._meta_t
        if m is None:
            m = self._meta_t = torch.empty_strided(self.shape, self.stride(), dtype=self.dtype,
                                                   device=_META)
        return m

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    # a C function (it does not bind); torch's stub declares it a def, which mypy binds
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    # torch.Tensor's is that C function too: mypy, seeing a def, binds away its `func`
    @classmethod
    def __torch_dispatch__(  # type: ignore[override]  # (torch's stub, as above)
            cls, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None
    ) -> Any:
        return dispatch(func, args, kwargs or {}, None)

    # torch's own signature; mypy finds even that incompatible with torch's untyped __repr__
    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        dims = ", ".join(f"{k}={v}" for k, v in self.mesh.sizes.items())
        return (f"runtime.Tensor(shape={tuple(self.shape)}, dtype={self.dtype}, "
                f"device={self.device}, mesh={self.mesh.name!r} ({dims}))")

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def _repr_html_(self) -> str:
        return tensor_html(self)

    def __reduce_ex__(self, proto: Any) -> Any:
        """Passed to an actor on the same procs, a mesh tensor arrives as that proc's shard
        (the ops issued before the call are sent first)."""
        from ..transport.serialization import keep_alive
        from . import _coalescing
        from ._engine import sender

        _coalescing.flush()
        sender.flush()
        keep_alive(self)  # a temporary (`t[0]`) must outlive the call: its free would race
        return (local_shard, (self.ref, self._key))


# -- what the engine's other modules read of a mesh tensor (module-level: a public attribute
# on Tensor would shadow a name of torch.Tensor's or a user's) ------------------------------

def placement(t: Tensor) -> tuple[Engine, tuple, "ActorMesh"]:
    """(engine, key, target) of the mesh tensor `t`: the engine that runs its ops, the key
    of its procs and the worker actors on them (what `send_command` / `send_call` take)."""
    return t._engine, t._key, t._target


def engine_of(t: Tensor) -> Engine:
    """The engine that runs the ops of the mesh tensor `t`."""
    return t._engine


def same_place(a: Tensor, b: Tensor) -> bool:
    """Whether the mesh tensors `a` and `b` live on the same procs of the same engine."""
    return a._key == b._key and a._engine is b._engine


def _device_of(kwargs: dict, found: list, local: list) -> torch.device:
    dev = kwargs.get("device")
    if dev is not None:
        return torch.device(dev)
    if found:
        return found[0].device
    if local:
        return local[0].device
    return _CPU


def _wire(x: Any, found: list, local: list) -> Any:
    """`x` with mesh tensors replaced by Refs (collected in `found`; local tensors in
    `local`)."""
    t = type(x)
    if t is list or t is tuple:
        return t(_wire(v, found, local) for v in x)
    if isinstance(x, torch.Tensor):
        if isinstance(x, Tensor):
            found.append(x)
            return Ref(x.ref)
        local.append(x)
    return x


def scan(x: Any) -> int:
    """0: no tensor in `x`; 1: local tensors only; 2: a mesh tensor."""
    t = type(x)
    if t is list or t is tuple:
        r = 0
        for v in x:
            r = max(r, scan(v))
        return r
    if isinstance(x, torch.Tensor):
        return 2 if isinstance(x, Tensor) else 1
    return 0


def _to_meta(x: Any, by_meta: dict) -> Any:
    t = type(x)
    if t is list or t is tuple:
        return t(_to_meta(v, by_meta) for v in x)
    if isinstance(x, torch.Tensor):
        if isinstance(x, Tensor):
            m = x._meta
            by_meta[id(m)] = x
            return m
        return x.to(_META)
    return x


def _run_meta(func: Any, args: tuple, kwargs: dict, by_meta: dict) -> Any:
    margs = _to_meta(args, by_meta)
    mkwargs = {k: _to_meta(v, by_meta) for k, v in kwargs.items()}
    if "device" in mkwargs:
        mkwargs["device"] = _META
    try:
        return func(*margs, **mkwargs)
    except NotImplementedError as e:
        raise NotImplementedError(f"{func} cannot run on a mesh tensor: it has no meta "
                                  f"(shape) implementation on the controller: {e}") from None


def same_mesh(found: list, what: str) -> "Tensor":
    """The first of `found` (mesh tensors), after checking they all live on one mesh."""
    first = found[0]
    for x in found:
        if x._key != first._key or x._engine is not first._engine:
            raise ValueError(f"{what} live on different meshes ({first.mesh!r} and "
                             f"{x.mesh!r}); move one first")
    return first


def _flat(seq: Any, found: list, wire: list, parts: list) -> bool:
    """The fast path's walk of positional arguments: append each one's wire form and cache
    key part; False at the first that is neither a mesh tensor nor an atom (a nested list, a
    local tensor, another object: the general path takes the call)."""
    for x in seq:
        t = type(x)
        if t is Tensor:
            found.append(x)
            wire.append(Ref(x.ref))
            k = x._mkey
            if k is None:
                k = x._mkey = tensor_key(x)
            parts.append(k)
        elif t in ATOMS:
            wire.append(x)
            parts.append((t, x))
        else:
            return False
    return True


def _flat_kwargs(kwargs: dict, found: list, wire: dict, parts: list) -> bool:
    """`_flat` for keyword arguments: (name, key part) pairs."""
    one: list = []
    for name, v in kwargs.items():
        w: list = []
        if not _flat((v,), found, w, one):
            return False
        wire[name] = w[0]
        parts.append((name, one.pop()))
    return True


_LATER = object()


def _prepare(name: str, kind: Optional[str], args: tuple, kwargs: dict) -> tuple:
    """(wire args, wire kwargs, mesh tensors, local tensors, cache key or None or _LATER,
    plain): plain when the command holds only refs and atoms (it pickles with the C
    pickler); _LATER: the general path's key, worked out after the checks."""
    if kind is not None and type(args) is tuple:
        found: list = []
        wire: list = []
        parts: list = []
        wkw: dict = {}
        kparts: list = []
        if (_flat(args, found, wire, parts)
                and (not kwargs or _flat_kwargs(kwargs, found, wkw, kparts))):
            first_is_mesh = bool(args) and type(args[0]) is Tensor
            ckey = (None if kind == "i" and not first_is_mesh
                    else make_key(name, tuple(parts), tuple(kparts)))
            return tuple(wire), wkw, found, [], ckey, True
    local: list = []
    found = []
    wire_args = _wire(args, found, local)
    wire_kwargs = {k: _wire(v, found, local) for k, v in kwargs.items()} if kwargs else {}
    return wire_args, wire_kwargs, found, local, _LATER, False


_MISS = object()


def _outputs(cached: tuple, out_ids: list, mesh: "ProcMesh", device: torch.device,
             engine: Engine, key: tuple, target: "ActorMesh") -> Any:
    """New mesh tensors for a cache hit's output descriptions (their refs appended to
    `out_ids`), as the op returns them: one, a tuple or a list."""
    desc, many = cached
    dev_type = device.type
    results = []
    for d in desc:
        r = _make(d[0], d[1], 0, d[2], None, mesh, device, engine, key, target)
        r._mkey = (d[2], d[0], d[1], 0, dev_type)  # tensor_key of r
        results.append(r)
        out_ids.append(r.ref)
    return tuple(results) if many == "tuple" else results if many == "list" else results[0]


def _hit(name: str, args: tuple) -> Any:
    """The hot path of `dispatch`: positional arguments only, the first a mesh tensor, the
    others mesh tensors of its mesh or atoms, and the output metadata cached; queue the op
    and return its outputs. _MISS when any of that does not hold (nothing queued)."""
    first = args[0]
    engine, key = first._engine, first._key
    found: list = []
    wire: list = []
    parts: list = []
    if not _flat(args, found, wire, parts):
        return _MISS
    for x in found:
        if x._key != key or x._engine is not engine:
            return _MISS  # the general path names both meshes
    cached = cache.get((name, (False, tuple(parts)), ()))
    if cached is None:
        return _MISS
    if engine.broken:
        engine.check(key)
    target = first._target
    if cached[1] == "inplace":
        out: Any = first
        out_ids = [first.ref]
    else:
        out_ids = []
        out = _outputs(cached, out_ids, first.mesh, first.device, engine, key, target)
    if _coalescing.blocks and _coalescing.active():
        _coalescing.flush()  # reductions held for fusion go first: program order
    _put(("cmd", engine, key, target, ("op", name, tuple(wire), {}, out_ids), True))
    return out


def dispatch(func: Any, args: tuple, kwargs: dict, active: Optional["ProcMesh"]) -> Any:
    """Work out `func`'s outputs' metadata on meta tensors (cached by input metadata),
    queue it for the procs of its inputs' mesh (or `active` for a factory), and return mesh
    tensors for its outputs."""
    _, kind, name = op_entry(func)
    if kind is not None and not kwargs and args and type(args[0]) is Tensor:
        out = _hit(name, args)
        if out is not _MISS:
            return out
    wire_args, wire_kwargs, found, local, ckey, plain = _prepare(name, kind, args, kwargs)
    if found:
        first = found[0]
        for x in found:
            if x._key != first._key or x._engine is not first._engine:
                same_mesh(found, f"{func}: inputs")  # raises, naming both meshes
        engine, key, target, mesh = first._engine, first._key, first._target, first.mesh
    elif active is not None:
        engine = engine_for(active)
        key, target = engine.target(active)
        mesh = active
    else:  # pragma: no cover - the dispatch mode only calls with a mesh
        return func(*args, **kwargs)
    engine.check(key)
    if func is _SCALAR and found:
        return fetch_one(found[0], {}).get(timeout=60).item()
    device = _device_of(kwargs, found, local)
    if ckey is _LATER:
        ckey = cache_key(func, args, kwargs, bool(args) and isinstance(args[0], Tensor))
    cached = lookup(ckey)
    out_ids: list = []
    if cached is not None and cached[1] == "inplace":  # the same metadata worked before
        out = args[0]
        out_ids = [out.ref]
    elif cached is not None:
        if device.index is None and device.type not in ("cpu", "meta"):
            device = torch.device(device.type, 0)  # as Tensor.__new__ does
        out = _outputs(cached, out_ids, mesh, device, engine, key, target)
    else:
        by_meta: dict = {}
        inplace = ckey is not None and kind == "i"
        before = tensor_key(args[0]._meta) if inplace else None
        out_meta = _run_meta(func, args, kwargs, by_meta)
        if inplace:  # cache only if it returned its input with the same metadata
            if by_meta.get(id(out_meta)) is args[0] and key_of(out_meta) == before:
                remember_inplace(ckey)
        elif ckey is not None:
            remember(ckey, out_meta)
        out = _wrap(out_meta, by_meta, out_ids, mesh, device, engine, key, target)
    send_command(engine, key, target, ("op", name, wire_args, wire_kwargs, out_ids), plain)
    return out


def _wrap(o: Any, by_meta: dict, out_ids: list, *where: Any) -> Any:
    t = type(o)
    if t is list or t is tuple:
        return t(_wrap(v, by_meta, out_ids, *where) for v in o)
    if isinstance(o, torch.Tensor):
        same = by_meta.get(id(o))
        if same is not None and same._meta is o:  # in place: the input itself
            out_ids.append(same.ref)
            return same
        r = Tensor(o.shape, o.stride(), o.storage_offset(), o.dtype, o, *where)
        out_ids.append(r.ref)
        return r
    return o


# -- one tensor's shards and state, read back (fetch_shard, the notebook display) ------------

def _one_proc(t: Tensor, coords: dict) -> "ProcMesh":
    mesh = t.mesh
    unknown = set(coords) - set(mesh.sizes)
    if unknown:
        raise KeyError(f"{sorted(unknown)} are not dimensions of {mesh!r} "
                       f"(its dimensions: {list(mesh.sizes)})")
    sel = {d: coords.get(d, 0) for d in mesh.sizes}
    for d, v in sel.items():
        if not isinstance(v, int):
            raise TypeError(f"fetch_shard wants one proc: {d}={v!r} is not an int")
    return mesh.slice(**sel)


def fetch_one(t: Tensor, coords: dict) -> Future:
    """A Future of the shard of mesh tensor `t` on the proc at `coords` (its other
    dimensions 0), as a CPU torch.Tensor; RemoteTensorError when it failed there."""
    view = _one_proc(t, coords)
    engine, key = t._engine, t._key
    engine.check(key)
    target = engine.target(view)[1]
    ref = t.ref

    def finish(reply: tuple) -> torch.Tensor:
        if reply[0] == "failed":
            if reply[1].op.startswith(("reduce", "to_mesh")):
                comm = engine.__dict__.get("comm")
                if comm is not None:  # the procs drop a failed group: name new ones
                    comm.renew()
            raise RemoteTensorError(reply[1])
        return reply[1]

    return send_call(engine, key, lambda: target.fetch.call_one(ref),
                     f"fetch_shard({coords or 'rank 0'})", finish, keepalive=t)


def tensor_state(t: Tensor, timeout: float = 1.0) -> list[str]:
    """Per rank of `t`'s mesh: 'ready', 'failed: <op>', or 'pending' when the procs have
    not reached it within `timeout` seconds (they are still running earlier ops)."""
    engine, key, target = t._engine, t._key, t._target
    n = len(key)
    try:
        engine.check(key)
    except BaseException as e:
        return [f"failed: {type(e).__name__}"] * n
    ref = t.ref
    fut = send_call(engine, key, lambda: target.state.call(ref), "tensor_state",
                    lambda vm: list(vm.values()), keepalive=t)
    try:
        return fut.get(timeout=timeout)
    except TimeoutError:
        return ["pending"] * n
    except BaseException as e:
        return [f"failed: {type(e).__name__}"] * n


def tensor_html(t: Tensor) -> str:
    """A mesh tensor's notebook display: shape, dtype, device, the mesh's dimensions and
    each rank's state (ready, failed, pending)."""
    dims = ", ".join(f"{k}: {v}" for k, v in t.mesh.sizes.items())
    states = tensor_state(t)
    counts: dict[str, int] = {}
    for s in states:
        counts[s] = counts.get(s, 0) + 1
    cells = "".join(f"<td title='rank {r}'>{html.escape(s)}</td>" for r, s in
                    enumerate(states[:64]))
    summary = ", ".join(f"{v} {html.escape(k)}" for k, v in counts.items())
    return (f"<div><b>runtime.Tensor</b> <code>{tuple(t.shape)}</code> {t.dtype} on "
            f"{t.device}, mesh <code>{html.escape(t.mesh.name)}</code> ({html.escape(dims)})"
            f"; ranks: {summary}<table><tr>{cells}</tr></table></div>")
