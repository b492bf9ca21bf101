"""`runtime.Tensor`: a controller-side handle on a tensor that lives on every proc of a
mesh. It holds shape, dtype, device, mesh and a ref id, never values; each aten op on it
runs on meta tensors here (shapes, dtypes, shape errors at the call site) and is queued
for the procs."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Optional

import torch

from ._engine import Engine, engine_for, free_ref, new_ref, send_command
from ._worker import Ref, local_shard

if TYPE_CHECKING:
    from .._meshes import ActorMesh, ProcMesh

_META = torch.device("meta")
_SCALAR = torch.ops.aten._local_scalar_dense.default
_CPU = torch.device("cpu")


class Tensor(torch.Tensor):
    """A tensor on every proc of `mesh` (each rank its own values); the controller holds its
    shape, dtype, device and mesh only. Fetch values with `runtime.inspect` / `fetch_shard`."""

    mesh: "ProcMesh"
    ref: int
    _meta_t: Optional[torch.Tensor]
    _engine: Engine
    _key: tuple
    _target: "ActorMesh"

    @staticmethod
    def __new__(cls, size: Any, stride: Any, offset: int, dtype: torch.dtype,
                meta: Optional[torch.Tensor], mesh: "ProcMesh", device: torch.device,
                engine: Engine, key: tuple, target: "ActorMesh") -> "Tensor":
        r = torch.Tensor._make_wrapper_subclass(
            cls, size, strides=stride, storage_offset=offset, dtype=dtype, device=device,
            requires_grad=False)
        r._meta_t = meta
        r.mesh = mesh
        r.ref = new_ref()
        r._engine, r._key, r._target = engine, key, target
        weakref.finalize(r, free_ref, engine, key, target, r.ref).atexit = False
        return r

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

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (),
                           kwargs: Optional[dict] = None) -> Any:
        return dispatch(func, args, kwargs or {}, None)

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in self.mesh.sizes.items())
        return (f"runtime.Tensor(shape={tuple(self.shape)}, dtype={self.dtype}, "
                f"device={self.device}, mesh={self.mesh.name!r} ({dims}))")

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def _repr_html_(self) -> str:
        from ._fetch import tensor_html

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


# Output metadata of functional and view ops by input metadata, and in-place ops that
# worked on the same metadata before: running an op on meta tensors costs ~100-300 us in
# Python decompositions; a hit costs a few.
_meta_cache: dict = {}
_functional: dict = {}
_CACHE_MAX = 4096
_HASHABLE = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format,
             torch.layout)


def _key_of(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return (x.dtype, tuple(x.shape), x.stride(), x.storage_offset(), x.device.type)
    if isinstance(x, (list, tuple)):
        return (type(x) is list, tuple(_key_of(v) for v in x))
    if isinstance(x, _HASHABLE):
        return (type(x), x)
    raise TypeError


def _kind(func: Any) -> Optional[str]:
    """'f': functional (new tensors), 'v': views (outputs alias inputs, nothing written),
    'i': in place on its first argument (returns it); None: not cacheable."""
    sch = func._schema
    rets = sch.returns
    if not rets or not all("Tensor" in str(r.type) for r in rets):
        return None
    if not sch.is_mutable:
        if all(r.alias_info is None for r in rets):
            return "f"
        if all(r.alias_info is not None and not r.alias_info.is_write for r in rets):
            return "v"
        return None
    first = sch.arguments[0].alias_info if sch.arguments else None
    if (len(rets) == 1 and rets[0].alias_info is not None and rets[0].alias_info.is_write
            and first is not None and first.is_write
            and all(a.alias_info is None or not a.alias_info.is_write
                    for a in sch.arguments[1:])):
        return "i"
    return None


def _cache_key(func: Any, args: tuple, kwargs: dict) -> Any:
    f = _functional.get(func, 0)
    if f == 0:
        f = _functional[func] = _kind(func)
    if f is None or (f == "i" and not (args and isinstance(args[0], Tensor))):
        return None
    try:
        return (func, _key_of(args), tuple((k, _key_of(v)) for k, v in kwargs.items()))
    except TypeError:
        return None


def _remember(key: Any, out_meta: Any) -> None:
    many = "tuple" if type(out_meta) is tuple else "list" if type(out_meta) is list else ""
    outs = out_meta if many else [out_meta]
    desc = []
    for o in outs:
        if not isinstance(o, torch.Tensor) or o.storage_offset() != 0:
            return
        desc.append((tuple(o.shape), o.stride(), o.dtype))
    if len(_meta_cache) >= _CACHE_MAX:
        _meta_cache.clear()
    _meta_cache[key] = (desc, many)


def same_mesh(found: list, what: str) -> "Tensor":
    """The first of `found` (mesh tensors), after checking they all live on one mesh."""
    first = found[0]
    for x in found:
        if x._key != first._key or x._engine is not first._engine:
            raise ValueError(f"{what} live on different meshes ({first.mesh!r} and "
                             f"{x.mesh!r}); move one first")
    return first


def dispatch(func: Any, args: tuple, kwargs: dict, active: Optional["ProcMesh"]) -> Any:
    """Work out `func`'s outputs' metadata on meta tensors (cached for functional ops),
    queue it for the procs of its inputs' mesh (or `active` for a factory), and return mesh
    tensors for its outputs."""
    found: list = []
    local: list = []
    wire_args = _wire(args, found, local)
    wire_kwargs = {k: _wire(v, found, local) for k, v in kwargs.items()} if kwargs else {}
    if found:
        first = same_mesh(found, f"{func}: inputs")
        engine, key, target, mesh = first._engine, first._key, first._target, first.mesh
    elif active is not None:
        engine = engine_for(active)
        key, target = engine.target(active)
        mesh = active
    else:  # pragma: no cover - the dispatch mode only calls with a mesh
        return func(*args, **kwargs)
    engine.check(key)
    if func is _SCALAR and found:
        from ._fetch import fetch_shard

        return fetch_shard(found[0]).get(timeout=60).item()
    device = _device_of(kwargs, found, local)
    ckey = _cache_key(func, args, kwargs)
    cached = _meta_cache.get(ckey) if ckey is not None else None
    out_ids: list = []
    if cached is not None and cached[1] == "inplace":  # the same metadata worked before
        out = args[0]
        out_ids = [out.ref]
    elif cached is not None:
        desc, many = cached
        results = [Tensor(d[0], d[1], 0, d[2], None, mesh, device, engine, key, target)
                   for d in desc]
        out_ids = [t.ref for t in results]
        out: Any = (tuple(results) if many == "tuple" else results if many == "list"
                    else results[0])
    else:
        by_meta: dict = {}
        inplace = ckey is not None and _functional[func] == "i"
        before = _key_of(args[0]._meta) if inplace else None
        out_meta = _run_meta(func, args, kwargs, by_meta)
        if inplace:  # cache only if it returned its input with the same metadata
            if by_meta.get(id(out_meta)) is args[0] and _key_of(out_meta) == before:
                if len(_meta_cache) >= _CACHE_MAX:
                    _meta_cache.clear()
                _meta_cache[ckey] = ((), "inplace")
        elif ckey is not None:
            _remember(ckey, out_meta)
        out = _wrap(out_meta, by_meta, out_ids, mesh, device, engine, key, target)
    send_command(engine, key, target, ("op", func.name(), wire_args, wire_kwargs, out_ids))
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
