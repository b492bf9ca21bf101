"""Output metadata of aten ops by their input metadata, for the controller's dispatch.

Running an op on meta tensors costs ~70-300 us (Python decompositions); a hit costs a
few. Functional ops remember their outputs' (shape, stride, dtype); in-place ops remember
that the same input metadata gave back the input unchanged. Pure: no mesh, no engine."""

from __future__ import annotations

from typing import Any, Optional

import torch

__all__ = [
    "CACHE_MAX", "cache", "HASHABLE", "ATOMS", "kind", "op_entry", "op_info", "tensor_key",
    "key_of", "atom_key", "make_key", "cache_key", "lookup", "remember", "remember_inplace",
]

CACHE_MAX = 4096
#: cache key -> (output descriptions, "tuple" | "list" | "" | "inplace")
cache: dict = {}
#: id(op) -> (op, kind, name): see `kind` and `op_entry` (keyed by id: an OpOverload's
#: hash is a Python method, two of which cost as much as the rest of a cache hit's lookups)
_ops: dict = {}
HASHABLE = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format,
            torch.layout)
#: exact types whose values are cache-key parts as they are (the fast path's atoms)
ATOMS = frozenset(HASHABLE)


def kind(func: Any) -> Optional[str]:
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


def op_entry(func: Any) -> tuple:
    """(func, `kind(func)`, `func.name()`), worked out once per op."""
    e = _ops.get(id(func))
    if e is None or e[0] is not func:
        e = _ops[id(func)] = (func, kind(func), func.name())
    return e


def op_info(func: Any) -> tuple:
    """(`kind(func)`, `func.name()`), worked out once per op."""
    return op_entry(func)[1:]


def tensor_key(t: torch.Tensor) -> tuple:
    """The cache-key part of a tensor: dtype, shape, stride, storage offset, device type."""
    return (t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), t.device.type)


def key_of(x: Any) -> Any:
    """The cache-key part of an op argument; TypeError if it has none (not cacheable)."""
    if isinstance(x, torch.Tensor):
        return tensor_key(x)
    if isinstance(x, (list, tuple)):
        return (type(x) is list, tuple(key_of(v) for v in x))
    if isinstance(x, HASHABLE):
        return (type(x), x)
    raise TypeError


def atom_key(x: Any) -> tuple:
    """The cache-key part of an atom (a value of an exact type in ATOMS): as `key_of`."""
    return (type(x), x)


def make_key(name: str, arg_parts: tuple, kwarg_parts: tuple) -> tuple:
    """The cache key of the op named `name` (`op_info(func)[1]`, unique per overload) from
    its arguments' key parts (`key_of` of each positional argument, (name, `key_of`) of each
    keyword argument): `cache_key`'s for a tuple of positional arguments."""
    return (name, (False, arg_parts), kwarg_parts)


def cache_key(func: Any, args: tuple, kwargs: dict, first_is_mesh: bool) -> Any:
    """The cache key of a call, or None when it is not cacheable (an op of no kind, an
    in-place op whose first argument is not a mesh tensor, an argument with no key)."""
    _, k, name = op_entry(func)
    if k is None or (k == "i" and not first_is_mesh):
        return None
    try:
        return (name, key_of(args), tuple((n, key_of(v)) for n, v in kwargs.items()))
    except TypeError:
        return None


def lookup(key: Any) -> Optional[tuple]:
    """What `remember` / `remember_inplace` stored for `key` (None: a miss or no key)."""
    return cache.get(key) if key is not None else None


def _store(key: Any, value: tuple) -> None:
    if len(cache) >= CACHE_MAX:
        cache.clear()
    cache[key] = value


def remember(key: Any, out_meta: Any) -> None:
    """Store a functional or view op's output metadata (tensors at offset 0 only)."""
    many = "tuple" if type(out_meta) is tuple else "list" if type(out_meta) is list else ""
    outs = out_meta if many else [out_meta]
    desc = []
    for o in outs:
        if not isinstance(o, torch.Tensor) or o.storage_offset() != 0:
            return
        desc.append((tuple(o.shape), o.stride(), o.dtype))
    _store(key, (desc, many))


def remember_inplace(key: Any) -> None:
    """Store that an in-place op returned its input with the same metadata."""
    _store(key, ((), "inplace"))
