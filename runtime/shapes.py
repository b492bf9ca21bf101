"""Named-dimension shapes: slicing, renaming, splitting, points and rank arithmetic.

Pure logic, no I/O. A `Shape` is a view (offset, sizes, strides) over the global ranks of
the mesh it was cut from, with a name for each dimension.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Any, Union

__all__ = ["Selector", "ShapeError", "Extent", "Shape", "row_major_strides", "Point", "MeshTrait"]

Selector = Union[int, slice]


class ShapeError(ValueError):
    """A slicing, renaming or splitting request does not fit the shape."""


class Extent(dict):
    """Named sizes, Monarch's `Extent`: a dict `{dim: size}` in dimension order that also has
    `.labels`, `.sizes` and `.nelements`. `Extent(["hosts", "gpus"], [2, 8])` or from a dict."""

    def __init__(self, labels: Any = (), sizes: Any = ()) -> None:
        if isinstance(labels, Mapping):
            super().__init__(labels)
            return
        labels, sizes = list(labels), list(sizes)
        if len(labels) != len(sizes):
            raise ShapeError(f"{len(labels)} labels for {len(sizes)} sizes")
        super().__init__(zip(labels, sizes))

    @property
    def labels(self) -> list[str]:
        return list(self)

    @property
    def sizes(self) -> list[int]:
        return list(self.values())

    @property
    def nelements(self) -> int:
        return math.prod(self.values())


class Shape:
    """A strided view over global ranks, with named dimensions (row-major local ranks)."""

    __slots__ = ("labels", "sizes_", "strides", "offset")

    def __init__(self, labels: tuple[str, ...] | list[str], sizes: tuple[int, ...] | list[int],
                 strides: tuple[int, ...] | list[int] | None = None, offset: int = 0) -> None:
        labels = tuple(labels)
        sizes = tuple(int(s) for s in sizes)
        if len(labels) != len(sizes):
            raise ShapeError(f"{len(labels)} labels for {len(sizes)} sizes")
        if len(set(labels)) != len(labels):
            raise ShapeError(f"duplicate dimension names in {labels}")
        for name in labels:
            if not isinstance(name, str) or not name.isidentifier():
                raise ShapeError(f"dimension name {name!r} is not an identifier")
        for name, s in zip(labels, sizes):
            if s < 1:
                raise ShapeError(f"dimension {name!r} has size {s}; sizes must be >= 1")
        if strides is None:
            strides = row_major_strides(sizes)
        self.labels = labels
        self.sizes_ = sizes
        self.strides = tuple(strides)
        self.offset = offset

    @classmethod
    def from_sizes(cls, sizes: Mapping[str, int]) -> "Shape":
        """A dense shape from `{"hosts": 2, "procs": 4}`."""
        return cls(tuple(sizes), tuple(sizes.values()))

    # -- basic facts -------------------------------------------------------------------
    @property
    def sizes(self) -> dict[str, int]:
        return dict(zip(self.labels, self.sizes_))

    @property
    def ndim(self) -> int:
        return len(self.labels)

    def __len__(self) -> int:
        return math.prod(self.sizes_)

    def size(self, dim: str | None = None) -> int:
        """Number of elements along `dim`, or in total when `dim` is None."""
        if dim is None:
            return len(self)
        return self.sizes_[self._index(dim)]

    @property
    def extent(self) -> Extent:
        return Extent(self.labels, self.sizes_)

    def _index(self, dim: str) -> int:
        try:
            return self.labels.index(dim)
        except ValueError:
            raise ShapeError(
                f"no dimension {dim!r}; this shape has {list(self.labels) or 'no dimensions'}"
            ) from None

    # -- ranks and points ----------------------------------------------------------------
    def coords_of(self, local_rank: int) -> dict[str, int]:
        """Coordinates of the `local_rank`-th element (row-major)."""
        n = len(self)
        if not 0 <= local_rank < n:
            raise IndexError(f"rank {local_rank} out of range for a shape of {n}")
        coords = {}
        rest = local_rank
        for name, s in zip(reversed(self.labels), reversed(self.sizes_)):
            coords[name] = rest % s
            rest //= s
        return {name: coords[name] for name in self.labels}

    def local_rank(self, coords: Mapping[str, int]) -> int:
        """Row-major local rank of a full set of coordinates."""
        missing = [d for d in self.labels if d not in coords]
        extra = [d for d in coords if d not in self.labels]
        if missing or extra:
            raise ShapeError(f"coordinates {dict(coords)} do not match dimensions {list(self.labels)}")
        r = 0
        for name, s in zip(self.labels, self.sizes_):
            c = coords[name]
            if not 0 <= c < s:
                raise IndexError(f"{name}={c} out of range 0..{s - 1}")
            r = r * s + c
        return r

    def global_rank(self, local_rank: int) -> int:
        """The rank in the original (unsliced) mesh of the `local_rank`-th element."""
        coords = self.coords_of(local_rank)
        return self.offset + sum(coords[n] * st for n, st in zip(self.labels, self.strides))

    def global_ranks(self) -> list[int]:
        """Global ranks of every element, in local (row-major) order."""
        ranges = [range(s) for s in self.sizes_]
        return [self.offset + sum(i * st for i, st in zip(idx, self.strides))
                for idx in itertools.product(*ranges)]

    def points(self) -> Iterator["Point"]:
        for r in range(len(self)):
            yield Point(r, self)

    # -- transformations -------------------------------------------------------------------
    def slice(self, **selectors: Selector) -> "Shape":
        """Select along named dims: an int drops the dimension, a slice keeps it."""
        labels, sizes, strides = list(self.labels), list(self.sizes_), list(self.strides)
        offset = self.offset
        drop = []
        for dim, sel in selectors.items():
            i = self._index(dim)
            size, stride = sizes[i], strides[i]
            if isinstance(sel, bool) or not isinstance(sel, (int, slice)):
                raise ShapeError(
                    f"{dim}={sel!r}: select with an int or a slice (e.g. {dim}=slice(0, 2))"
                )
            if isinstance(sel, int):
                idx = sel + size if sel < 0 else sel
                if not 0 <= idx < size:
                    raise ShapeError(f"{dim}={sel} out of range for size {size}")
                offset += idx * stride
                drop.append(i)
            else:
                start, stop, step = sel.indices(size)
                if step < 1:
                    raise ShapeError(f"{dim}: negative or zero slice steps are not supported")
                n = len(range(start, stop, step))
                if n == 0:
                    raise ShapeError(f"{dim}={_fmt_slice(sel)} selects nothing from size {size}")
                offset += start * stride
                sizes[i] = n
                strides[i] = stride * step
        keep = [i for i in range(len(labels)) if i not in drop]
        return Shape([labels[i] for i in keep], [sizes[i] for i in keep],
                     [strides[i] for i in keep], offset)

    def rename(self, **names: str) -> "Shape":
        """Rename dimensions: `rename(procs="gpus")`."""
        for old in names:
            self._index(old)
        labels = [names.get(n, n) for n in self.labels]
        return Shape(labels, self.sizes_, self.strides, self.offset)

    def split(self, **kwargs: Any) -> "Shape":
        """Split dims: `split(procs=("dp", "tp"), tp=2)`; one new size may be inferred."""
        plans = {k: v for k, v in kwargs.items() if isinstance(v, (tuple, list))}
        given = {k: v for k, v in kwargs.items() if not isinstance(v, (tuple, list))}
        for k, v in given.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ShapeError(f"split size {k}={v!r} must be a positive int")
        used: set[str] = set()
        labels, sizes, strides = [], [], []
        for name, size, stride in zip(self.labels, self.sizes_, self.strides):
            if name not in plans:
                labels.append(name)
                sizes.append(size)
                strides.append(stride)
                continue
            parts = list(plans[name])
            if not parts:
                raise ShapeError(f"split of {name!r} names no new dimensions")
            known = {p: given[p] for p in parts if p in given}
            unknown = [p for p in parts if p not in given]
            used.update(known)
            prod = math.prod(known.values())
            if len(unknown) > 1:
                raise ShapeError(f"split of {name!r}: give sizes for all but one of {parts}")
            if unknown:
                if size % prod:
                    raise ShapeError(f"split of {name!r} (size {size}) by {known}: not divisible")
                known[unknown[0]] = size // prod
            elif prod != size:
                raise ShapeError(f"split of {name!r}: sizes {known} multiply to {prod}, not {size}")
            part_sizes = [known[p] for p in parts]
            st = stride
            part_strides = []
            for s in reversed(part_sizes):
                part_strides.append(st)
                st *= s
            labels.extend(parts)
            sizes.extend(part_sizes)
            strides.extend(reversed(part_strides))
        for p in plans:
            self._index(p)
        unused = set(given) - used
        if unused:
            raise ShapeError(f"split sizes {sorted(unused)} name no new dimension")
        return Shape(labels, sizes, strides, self.offset)

    def flatten(self, name: str) -> "Shape":
        """Collapse every dimension into one named `name` (the view must be row-major dense)."""
        for i in range(self.ndim - 1):
            if self.sizes_[i + 1] > 1 and self.sizes_[i] > 1 and \
                    self.strides[i] != self.strides[i + 1] * self.sizes_[i + 1]:
                raise ShapeError("cannot flatten a non-contiguous slice")
        inner = self.strides[-1] if self.ndim else 1
        for i in range(self.ndim - 1, -1, -1):
            if self.sizes_[i] > 1:
                inner = self.strides[i]
                break
        return Shape([name], [len(self)], [inner], self.offset)

    # -- misc ------------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shape) and (
            self.labels, self.sizes_, self.strides, self.offset
        ) == (other.labels, other.sizes_, other.strides, other.offset)

    def __hash__(self) -> int:
        return hash((self.labels, self.sizes_, self.strides, self.offset))

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}={s}" for n, s in zip(self.labels, self.sizes_))
        return f"Shape({{{dims}}})"

    def __getstate__(self) -> tuple:
        return (self.labels, self.sizes_, self.strides, self.offset)

    def __setstate__(self, st: tuple) -> None:
        self.labels, self.sizes_, self.strides, self.offset = st


def row_major_strides(sizes: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    out = []
    st = 1
    for s in reversed(sizes):
        out.append(st)
        st *= s
    return tuple(reversed(out))


def _fmt_slice(s: slice) -> str:
    return f"slice({s.start}, {s.stop}" + (f", {s.step})" if s.step is not None else ")")


class Point(Mapping):
    """One position in a mesh: `.rank` (local, row-major) and named coordinates."""

    __slots__ = ("rank", "_coords", "_shape")

    def __init__(self, rank: int, shape: Shape) -> None:
        self.rank = rank
        self._shape = shape
        self._coords = shape.coords_of(rank)

    @property
    def extent(self) -> Extent:
        return self._shape.extent

    @property
    def size(self) -> int:
        return len(self._shape)

    def __getitem__(self, key: str) -> int:
        return self._coords[key]

    def __getattr__(self, key: str) -> int:
        try:
            return self._coords[key]
        except KeyError:
            raise AttributeError(f"point has no dimension {key!r} (has {list(self._coords)})") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._coords)

    def __len__(self) -> int:
        return len(self._coords)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Point):
            return self.rank == other.rank and self._coords == other._coords
        if isinstance(other, Mapping):
            return dict(self._coords) == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.rank, tuple(self._coords.items())))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self._coords.items())
        return f"Point(rank={self.rank}, {inner})" if inner else f"Point(rank={self.rank})"

    def __str__(self) -> str:
        """Monarch's form: `{'hosts': 0/1, 'gpus': 1/2}` (coordinate/size per dimension)."""
        sizes = self._shape.sizes
        return "{" + ", ".join(f"{k!r}: {v}/{sizes[k]}" for k, v in self._coords.items()) + "}"

    def __reduce__(self) -> Any:
        return (Point, (self.rank, self._shape))


class MeshTrait:
    """Slicing operations shared by every mesh-like object; subclasses implement `_new_with_shape`."""

    _shape: Shape

    def _new_with_shape(self, shape: Shape) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def sizes(self) -> dict[str, int]:
        return self._shape.sizes

    @property
    def extent(self) -> Extent:
        return self._shape.extent

    @property
    def _labels(self) -> tuple[str, ...]:
        """The dimension names, in order (Monarch's `mesh._labels`, read by its examples)."""
        return tuple(self._shape.labels)

    def size(self, dim: str | None = None) -> int:
        return self._shape.size(dim)

    def __len__(self) -> int:
        """The number of elements (actors, procs, hosts) in this mesh or slice, as Monarch."""
        return len(self._shape)

    def slice(self, **selectors: Selector) -> Any:
        """A view of part of this mesh: an int drops the dimension, a slice keeps it."""
        return self._new_with_shape(self._shape.slice(**selectors))

    def rename(self, **names: str) -> Any:
        return self._new_with_shape(self._shape.rename(**names))

    def split(self, **kwargs: Any) -> Any:
        return self._new_with_shape(self._shape.split(**kwargs))

    def flatten(self, name: str) -> Any:
        return self._new_with_shape(self._shape.flatten(name))
