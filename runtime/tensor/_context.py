"""The active mesh of the calling thread: `ProcMesh.activate()`, `get_active_mesh()`,
`no_mesh()`, and the dispatch mode that turns torch factories into mesh tensors."""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any, Iterator, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ._engine import engine_for
from ._tensor import Tensor, dispatch, scan

if TYPE_CHECKING:
    from .._meshes import ProcMesh

__all__ = ["get_active_mesh", "activate", "no_mesh"]

_local = threading.local()
_aten = torch.ops.aten
#: ops with tensor inputs that still create a tensor on the active mesh from a local one
_TO_MESH = {_aten.lift_fresh.default, _aten.lift_fresh_copy.default}
_LIKE_NAMES = ("empty_like", "zeros_like", "ones_like", "full_like", "rand_like",
               "randn_like", "randint_like")


_makes: dict = {}


def _makes_tensors(func: Any) -> bool:
    """Whether an op returns tensors (profiler ops and the like do not: they run locally)."""
    r = _makes.get(func)
    if r is None:
        r = _makes[func] = any("Tensor" in str(ret.type) for ret in func._schema.returns)
    return r


def _stack() -> list:
    s = getattr(_local, "stack", None)
    if s is None:
        s = _local.stack = []
    return s


def get_active_mesh() -> Optional["ProcMesh"]:
    """The proc mesh active in this thread (innermost `activate()`), or None."""
    s = _stack()
    return s[-1] if s else None


class _MeshMode(TorchDispatchMode):
    """Under an active mesh: ops with mesh-tensor inputs go to the mesh (as they would
    anyway), factories and `torch.tensor` of local data become mesh tensors, and other ops
    on local tensors run locally."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No dynamo-disabling wrapper around `__torch_dispatch__` (~1 us per op): the mode
        runs what a mesh tensor's own `__torch_dispatch__` runs, which torch does not
        wrap either."""
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if args and type(args[0]) is Tensor:  # the common case: a method of a mesh tensor
            return dispatch(func, args, kwargs, None)
        has = max(scan(args), scan(tuple(kwargs.values())) if kwargs else 0)
        if has == 2:
            return dispatch(func, args, kwargs, None)
        mesh = get_active_mesh()
        if mesh is None:
            return func(*args, **kwargs)
        if not _makes_tensors(func):
            return func(*args, **kwargs)
        if not has or func in _TO_MESH or func.__name__.split(".")[0] in _LIKE_NAMES:
            return dispatch(func, args, kwargs, mesh)
        return func(*args, **kwargs)


@contextlib.contextmanager
def activate(mesh: "ProcMesh") -> Iterator["ProcMesh"]:
    """Make `mesh` the active mesh of the calling thread (re-entrant); its tensor-engine
    workers start on first use."""
    from .._meshes import ProcMesh

    if not isinstance(mesh, ProcMesh):
        raise TypeError(f"activate() needs a ProcMesh, got {type(mesh).__name__}")
    if mesh.stopped:
        from ..errors import MeshStoppedError

        raise MeshStoppedError(f"{mesh!r} is stopped; it cannot be activated")
    engine_for(mesh)
    s = _stack()
    s.append(mesh)
    mode = _MeshMode()
    try:
        with mode:
            yield mesh
    finally:
        s.pop()


@contextlib.contextmanager
def no_mesh() -> Iterator[None]:
    """Run torch locally in this block, even under an active mesh."""
    s = _stack()
    s.append(None)
    try:
        yield
    finally:
        s.pop()
