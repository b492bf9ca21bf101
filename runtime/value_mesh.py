"""ValueMesh: one value per point of a mesh, sliceable like the mesh it came from."""

from __future__ import annotations

from typing import Any, Callable, Generic, Iterator, Sequence, TypeVar

from .shapes import MeshTrait, Point, Shape

__all__ = ["T", "ValueMesh", "map_values"]

T = TypeVar("T")


class ValueMesh(MeshTrait, Generic[T]):
    """Values indexed by mesh points. `values[i]` belongs to the dense shape's rank `i`.
    `ValueMesh[T]` is the class itself (Monarch's generic annotation)."""

    def __class_getitem__(cls, item: Any) -> type:
        return cls

    def __init__(self, shape: Shape, values: Sequence[T], _base: Shape | None = None) -> None:
        self._shape = shape
        self._values = list(values)
        # `_base` is the dense shape `values` is laid out in; `shape` may be a view of it.
        self._base = _base if _base is not None else Shape(shape.labels, shape.sizes_)
        if _base is None:
            self._shape = self._base
        if len(self._values) != len(self._base):
            raise ValueError(f"{len(self._values)} values for a mesh of {len(self._base)}")

    def _new_with_shape(self, shape: Shape) -> "ValueMesh[T]":
        return ValueMesh(shape, self._values, self._base)

    def _value_at(self, local_rank: int) -> T:
        return self._values[self._shape.global_rank(local_rank)]

    def items(self) -> Iterator[tuple[Point, T]]:
        """Yield `(point, value)` pairs in rank order."""
        for r in range(len(self._shape)):
            yield Point(r, self._shape), self._value_at(r)

    def values(self) -> Iterator[T]:
        for r in range(len(self._shape)):
            yield self._value_at(r)

    def item(self, **coords: int) -> T:
        """The value at the given coordinates (every dimension must be named)."""
        if not coords and len(self._shape) == 1:
            return self._value_at(0)
        return self._value_at(self._shape.local_rank(coords))

    def __len__(self) -> int:
        return len(self._shape)

    def __iter__(self) -> Iterator[tuple[Point, T]]:
        return self.items()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ValueMesh):
            return self.sizes == other.sizes and list(self.values()) == list(other.values())
        return NotImplemented

    def __repr__(self) -> str:
        body = ", ".join(
            f"{{{', '.join(f'{k}={v}' for k, v in p.items())}}}: {val!r}"
            for p, val in list(self.items())[:8]
        )
        more = ", ..." if len(self) > 8 else ""
        return f"ValueMesh({self.sizes}, {{{body}{more}}})"

    def __reduce__(self) -> Any:
        return (ValueMesh, (self._shape, self._values, self._base))


def map_values(vm: ValueMesh[Any], fn: Callable[[Any], Any]) -> ValueMesh[Any]:
    """A ValueMesh of `fn` of each value of `vm`, over the same view and layout: `fn` runs
    on every value `vm` holds, in its layout's rank order (those outside `vm`'s view too).
    A function, not a method: a new public name on ValueMesh could shadow a user's."""
    return ValueMesh(vm._shape, [fn(v) for v in vm._values], vm._base)
