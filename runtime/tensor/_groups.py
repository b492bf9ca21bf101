"""Pure logic of the tensor engine's collectives: which procs reduce together over which
mesh dimensions, the shape a reduction gives, and which proc sends to which in `to_mesh`.
No I/O; tested directly (tests/test_tensor_groups.py)."""

from __future__ import annotations

import itertools
from typing import Sequence, Union

from ..shapes import Shape

__all__ = [
    "REDUCTIONS", "Dims", "MeshDimError", "normalize_dims", "reduce_groups", "group_size",
    "reduce_shape", "check_inplace", "transfer_pairs", "product_coords",
]

REDUCTIONS = ("sum", "avg", "product", "min", "max", "stack")
Dims = Union[str, Sequence[str]]


class MeshDimError(KeyError):
    """A collective names a dimension the tensor's mesh does not have."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def normalize_dims(shape: Shape, dims: Dims, reduction: str, scatter: bool) -> tuple[str, ...]:
    """`dims` as a tuple of the mesh's dimension names (all of them when empty), checked
    against `shape` and the reduction (Monarch's rules: `stack` and `scatter` take one dim)."""
    if isinstance(dims, str):
        dims = (dims,)
    dims = tuple(dims)
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction {reduction!r} is not supported; the reductions are "
                         f"{', '.join(REDUCTIONS)}")
    for d in dims:
        if not isinstance(d, str) or d not in shape.labels:
            raise MeshDimError(f"the mesh has no dimension {d!r}; its dimensions are "
                               f"{dict(shape.sizes)}")
    if not dims:
        dims = shape.labels
    if len(set(dims)) != len(dims):
        raise ValueError(f"reducing the same dimension twice: {dims}")
    if len(dims) > 1 and (reduction == "stack" or scatter):
        raise ValueError(f"reduction={reduction!r}, scatter={scatter} reduce over one "
                         f"dimension only; got {dims}")
    return dims


def reduce_groups(shape: Shape, dims: Sequence[str]) -> list[list[int]]:
    """The groups of local ranks (row-major ranks of `shape`) that reduce together over
    `dims`: ranks with equal coordinates on every other dimension. Within a group, ranks are
    in row-major order of their coordinates on `dims`."""
    others = [d for d in shape.labels if d not in dims]
    groups: dict[tuple, list[int]] = {}
    for r in range(len(shape)):
        c = shape.coords_of(r)
        groups.setdefault(tuple(c[d] for d in others), []).append(r)
    return list(groups.values())


def group_size(shape: Shape, dims: Sequence[str]) -> int:
    """How many procs reduce together over `dims`."""
    n = 1
    for d in dims:
        n *= shape.size(d)
    return n


def reduce_shape(shape: Sequence[int], n: int, reduction: str, scatter: bool) -> tuple[int, ...]:
    """The shape of a reduction's output from the input's `shape` over a group of `n`:
    `stack` adds a leading dimension of n; `scatter` takes a leading dimension of n (each
    rank gets its row of the result; `stack` with scatter is an all-to-all, same shape)."""
    shape = tuple(shape)
    if scatter:
        if not shape or shape[0] != n:
            raise ValueError(f"reduce(..., scatter=True): the outermost dimension of a tensor "
                             f"of shape {list(shape)} must equal the group size {n}")
        return shape if reduction == "stack" else shape[1:]
    if reduction == "stack":
        return (n, *shape)
    return shape


def check_inplace(reduction: str, scatter: bool) -> None:
    """`reduce_` needs an output of the input's shape."""
    if scatter and reduction != "stack":
        raise ValueError(f"reduce_(..., scatter=True) with reduction={reduction!r} changes the "
                         "shape; use reduce(...)")
    if reduction == "stack" and not scatter:
        raise ValueError("reduce_(..., reduction='stack') adds a dimension; use reduce(...)")


def transfer_pairs(src: Shape, dst: Shape) -> list[tuple[int, int]]:
    """(source local rank, destination local rank) for `to_mesh`: ranks match by their
    coordinates on the source's dimensions; destination dimensions the source lacks are
    broadcast (every destination rank gets the matching source rank's shard)."""
    for d in src.labels:
        if d not in dst.labels:
            raise MeshDimError(f"to_mesh: the destination mesh {dict(dst.sizes)} has no "
                               f"dimension {d!r} of the source {dict(src.sizes)}")
        if src.size(d) != dst.size(d):
            raise ValueError(f"to_mesh: dimension {d!r} has size {src.size(d)} on the source "
                             f"{dict(src.sizes)} and {dst.size(d)} on the destination "
                             f"{dict(dst.sizes)}")
    pairs = []
    for r in range(len(dst)):
        c = dst.coords_of(r)
        pairs.append((src.local_rank({d: c[d] for d in src.labels}), r))
    return pairs


def product_coords(shape: Shape, dims: Sequence[str]) -> list[dict[str, int]]:
    """Every combination of coordinates along `dims` (for tests and slicing loops)."""
    ranges = [range(shape.size(d)) for d in dims]
    return [dict(zip(dims, c)) for c in itertools.product(*ranges)]
