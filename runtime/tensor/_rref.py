"""Monarch's `rref` adverb: `actors.method.rref(*args)` calls the endpoint on every proc of
the mesh tensors' mesh, each actor with its proc's shards, and its results become mesh
tensors (their shapes from the endpoint's `propagate=`), in order with the engine's ops."""

from __future__ import annotations

from typing import Any

from .._meshes.actor_mesh import ref_of, view_of
from .._meshes.adverbs import endpoint_parts
from ..shapes import Shape
from ._remote import Remote

__all__ = ["call_local_actor", "rref"]


def call_local_actor(actors: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """On a proc: call `method` of the actor of `actors` that lives on this proc, and wait
    (the engine's worker runs this, so the call happens in the op stream's order)."""
    from ..actor import context

    ctx = context()
    rec = ref_of(actors).rec
    proc_ids = rec.proc_ids
    if ctx is None or ctx.proc_id not in proc_ids:
        raise RuntimeError(f"rref: actor mesh {rec.name!r} has no actor on proc "
                           f"{ctx.proc_id if ctx else '?'} (spawn it on the mesh tensors' "
                           "proc mesh)")
    mine = view_of(actors, Shape((), (), (), proc_ids.index(ctx.proc_id)))
    return getattr(mine, method).call_one(*args, **kwargs).get()


def rref(endpoint: Any, args: tuple, kwargs: dict) -> Any:
    """Mesh tensors of `endpoint`'s results (see the module docstring)."""
    mesh, ref, method = endpoint_parts(endpoint)
    rec = ref.rec
    name = f"{rec.cls_name}.{method}"
    prop = rec.propagates.get(method)
    if prop is None or isinstance(prop, str):
        raise ValueError(f"{name}.rref() needs the shapes of the endpoint's results: declare "
                         f"it with @endpoint(propagate=fn), fn taking the endpoint's "
                         f"arguments (as fake tensors) and returning results of the right "
                         f"shapes{'' if prop is None else f' (propagate={prop!r} is not supported here)'}")

    def shapes(actors: Any, method: str, *a: Any, **k: Any) -> Any:
        return prop(*a, **k)

    return Remote(call_local_actor, propagate=shapes)(mesh, method, *args, **kwargs)
