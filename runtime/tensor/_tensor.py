"""`runtime.Tensor`: a controller-side handle on a tensor that lives on every proc of a
mesh. It holds shape, dtype, device, mesh and a ref id, never values; each aten op on it
runs on meta tensors here (shapes, dtypes, shape errors at the call site) and is queued
for the procs."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ._engine import Engine, engine_for, free_ref, new_ref, send_command
from ._worker import Ref

if TYPE_CHECKING:
    from .._meshes import ActorMesh, ProcMesh

_META = torch.device("meta")
_CPU = torch.device("cpu")


class Tensor(torch.Tensor):
    """A tensor on every proc of `mesh` (each rank its own values); the controller holds its
    shape, dtype, device and mesh only. Fetch values with `runtime.inspect` / `fetch_shard`."""

    _meta: torch.Tensor
    mesh: "ProcMesh"
    ref: int
    _engine: Engine
    _key: tuple
    _target: "ActorMesh"

    @staticmethod
    def __new__(cls, meta: torch.Tensor, mesh: "ProcMesh", device: torch.device,
                engine: Engine, key: tuple, target: "ActorMesh") -> "Tensor":
        r = torch.Tensor._make_wrapper_subclass(
            cls, meta.size(), strides=meta.stride(), storage_offset=meta.storage_offset(),
            dtype=meta.dtype, layout=meta.layout, device=device, requires_grad=False)
        r._meta = meta
        r.mesh = mesh
        r.ref = new_ref()
        r._engine, r._key, r._target = engine, key, target
        weakref.finalize(r, free_ref, engine, key, target, r.ref)
        return r

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
        raise TypeError("a runtime.Tensor cannot be pickled (fetch its values with "
                        "runtime.inspect or runtime.fetch_shard)")


def _device_of(func: Any, flat: list, kwargs: dict) -> torch.device:
    dev = kwargs.get("device")
    if dev is not None:
        return torch.device(dev)
    for x in flat:
        if isinstance(x, torch.Tensor):
            return x.device
    return _CPU


def dispatch(func: Any, args: tuple, kwargs: dict, active: Optional["ProcMesh"]) -> Any:
    """Run `func` on meta tensors for its outputs' metadata, queue it for the procs of its
    inputs' mesh (or `active` for a factory), and return mesh tensors for its outputs."""
    flat, spec = tree_flatten((args, kwargs))
    mesh_t: Optional[Tensor] = None
    for x in flat:
        if type(x) is Tensor or isinstance(x, Tensor):
            if mesh_t is None:
                mesh_t = x
            elif x._key != mesh_t._key or x._engine is not mesh_t._engine:
                raise ValueError(f"{func}: inputs live on different meshes ({mesh_t.mesh!r} "
                                 f"and {x.mesh!r}); move one first")
    if mesh_t is not None:
        engine, key, target, mesh = mesh_t._engine, mesh_t._key, mesh_t._target, mesh_t.mesh
    elif active is not None:
        engine = engine_for(active)
        key, target = engine.target(active)
        mesh = active
    else:  # pragma: no cover - the dispatch mode only calls with a mesh
        return func(*args, **kwargs)
    engine.check(key)
    if func is torch.ops.aten._local_scalar_dense.default and mesh_t is not None:
        from ._fetch import fetch_shard

        return fetch_shard(mesh_t).get(timeout=60).item()

    meta_flat = []
    by_meta: dict[int, Tensor] = {}
    for x in flat:
        if isinstance(x, Tensor):
            by_meta[id(x._meta)] = x
            meta_flat.append(x._meta)
        elif isinstance(x, torch.Tensor):
            meta_flat.append(x.to(_META))
        else:
            meta_flat.append(x)
    margs, mkwargs = tree_unflatten(meta_flat, spec)
    if "device" in mkwargs:
        mkwargs["device"] = _META
    try:
        out_meta = func(*margs, **mkwargs)
    except NotImplementedError as e:
        raise NotImplementedError(f"{func} cannot run on a mesh tensor: it has no meta "
                                  f"(shape) implementation on the controller: {e}") from None
    device = _device_of(func, flat, kwargs)
    out_flat, out_spec = tree_flatten(out_meta)
    out_ids: list = []
    results: list = []
    for o in out_flat:
        if isinstance(o, torch.Tensor):
            same = by_meta.get(id(o))
            if same is not None and same._meta is o:  # in place: the input itself
                out_ids.append(same.ref)
                results.append(same)
            else:
                t = Tensor(o, mesh, device, engine, key, target)
                out_ids.append(t.ref)
                results.append(t)
        else:
            results.append(o)
    wire_args, wire_kwargs = tree_unflatten(
        [Ref(x.ref) if isinstance(x, Tensor) else x for x in flat], spec)
    send_command(engine, key, target, ("op", func.name(), wire_args, wire_kwargs, out_ids))
    return tree_unflatten(results, out_spec)
