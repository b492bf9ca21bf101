"""Collectives of mesh tensors, issued from the controller: `reduce` / `reduce_` over mesh
dimensions, `to_mesh` (copy to another mesh of the same shape, rank by rank) and
`slice_mesh` (the tensor on a slice of its mesh). Each is one command queued in order with
the ops; the procs run it on torch.distributed process groups (see _comm.py)."""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, Optional

import torch

from .._meshes.proc_mesh import all_procs, runtime_of
from ..gpus import GPU_DIMS
from ..shapes import row_major_strides
from . import _coalescing as coalescing
from ._engine import Engine, engine_for, send_command
from ._groups import (Dims, check_inplace, group_size, normalize_dims, reduce_groups,
                      reduce_shape, transfer_pairs)
from ._tensor import Tensor, engine_of, placement, same_place

if TYPE_CHECKING:
    from .._meshes import ProcMesh

__all__ = [
    "reduce", "reduce_", "slice_to", "slice_mesh", "to_mesh", "mesh_rank", "backend_for",
    "renew_groups",
]

_seq = itertools.count(1)
_lock = threading.Lock()


class _Comm:
    """Per engine: where its procs meet to make process groups, and the id of each group
    (a new id after a failure, so that survivors never rejoin a broken rendezvous)."""

    def __init__(self, engine: Engine) -> None:
        root = engine.root
        rt = runtime_of(root)
        self.gids: dict[tuple, str] = {}
        self.token = os.urandom(4).hex()
        self.dir: Optional[str] = None
        self.store: Any = None
        if all(p.host == rt.host for p in root.procs):
            from .. import rundir

            self.dir = rundir.make_dir("collectives")
            self.rdv: tuple = ("file", self.dir)
            weakref.finalize(engine, rundir.remove_dir, self.dir)  # also run at exit
        else:  # procs on other hosts: a TCPStore they reach, as torch.distributed uses
            from ..config import config

            if not config.collectives_across_hosts:
                raise RuntimeError(
                    f"{root!r} has procs on other hosts: collectives between them use "
                    "torch.distributed's TCPStore and gloo/NCCL, which listen on the cluster "
                    "network without authentication. On a trusted network, allow it with "
                    "runtime.configure(collectives_across_hosts=True) (or "
                    "MONARCH_COLLECTIVES_ACROSS_HOSTS=1); see docs/tensors.md")
            import torch.distributed as dist
            from urllib.parse import urlparse

            from .._meshes.host_mesh import local_ip_for

            far, agent = next((p, p.agent) for p in all_procs(root)
                              if p.host != rt.host and p.agent is not None)
            u = urlparse(agent.address)
            host = local_ip_for(u.hostname or far.host, u.port or 0)
            self.store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
            self.rdv = ("tcp", host, self.store.port)

    def gid(self, members: tuple, backend: str) -> str:
        """The id of the group of these procs (stable until it fails)."""
        g = self.gids.get((members, backend))
        if g is None:
            g = self.gids[(members, backend)] = f"{self.token}-{next(_seq)}"
        return g

    def close(self) -> None:
        """Remove the rendezvous directory / stop the store (the engine's mesh stopped)."""
        if self.dir is not None:
            from .. import rundir

            rundir.remove_dir(self.dir)
        self.store = None

    def renew(self) -> None:
        """Name every group anew (after a collective failed: their procs forget them)."""
        self.gids.clear()


def _comm(engine: Engine) -> _Comm:
    c = engine.__dict__.get("comm")
    if c is None:
        with _lock:
            c = engine.__dict__.get("comm")
            if c is None:
                c = engine.comm = _Comm(engine)
    return c


def _check_tensor(t: Any, what: str) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{what} needs a mesh tensor (runtime.Tensor, made under "
                        f"`with mesh.activate():`), got {type(t).__name__}")
    if t.requires_grad:
        raise ValueError(f"{what} does not record autograd: use a tensor that does not "
                         "require grad (t.detach(), or the gradients of grad_generator)")
    return t


def _new_tensor(shape: tuple, like: Tensor, mesh: "ProcMesh") -> Tensor:
    engine = engine_of(like)
    key, target = engine.target(mesh)
    stride = row_major_strides(shape)  # (not torch.empty: under an active mesh it is an op)
    return Tensor(shape, stride, 0, like.dtype, None, mesh, like.device, engine, key, target)


def reduce(t: Tensor, dims: Dims = (), reduction: str = "sum", scatter: bool = False,
           mesh: Optional["ProcMesh"] = None, out: Optional[Tensor] = None,
           _inplace: bool = False) -> Tensor:
    """Reduce `t` over the mesh dimensions `dims` (one name or several; all when empty):
    every proc gets the reduction over the procs that differ from it only on `dims`.
    `reduction` is sum, avg, product, min, max or stack (gather along a new leading
    dimension); `scatter=True` is reduce-scatter (the leading dimension, of the group's
    size, is split: each proc keeps its row). `mesh`: keep the result on that slice only."""
    what = "reduce_" if _inplace else "reduce"
    t = _check_tensor(t, what)
    shape = t.mesh.shape
    dims = normalize_dims(shape, dims, reduction, scatter)
    if reduction == "avg" and not (t.dtype.is_floating_point or t.dtype.is_complex):
        raise TypeError(f"{what}(reduction='avg') needs a floating-point tensor, got {t.dtype}")
    n = group_size(shape, dims)
    out_shape = reduce_shape(t.shape, n, reduction, scatter)
    if _inplace:
        if out is not None:
            raise ValueError("reduce_() writes into its input; `out` cannot be given")
        check_inplace(reduction, scatter)
    if out is not None:
        out = _check_tensor(out, f"{what}(out=...)")
        if not same_place(out, t):
            raise ValueError(f"{what}(out=...): out lives on {out.mesh!r}, the input on "
                             f"{t.mesh!r}")
        if tuple(out.shape) != out_shape or out.dtype != t.dtype:
            raise ValueError(f"{what}(out=...): out has shape {list(out.shape)} and dtype "
                             f"{out.dtype}; the result has shape {list(out_shape)} and dtype "
                             f"{t.dtype}")
    if mesh is not None:
        _check_submesh(mesh, t.mesh, what)
    engine, key, target = placement(t)
    engine.check(key)
    procs = [p.proc_id for p in t.mesh.procs]
    comm = _comm(engine)
    backend = backend_for(t)
    groups = []
    for g in reduce_groups(shape, dims):
        members = tuple(procs[r] for r in g)
        groups.append((comm.gid(members, backend), members))
    into = t.ref if _inplace else out.ref if out is not None else None
    result = t if _inplace else out if out is not None else _new_tensor(out_shape, t, t.mesh)
    spec = {"groups": groups, "rdv": comm.rdv, "backend": backend, "cuda": t.is_cuda,
            "reduction": reduction, "scatter": scatter, "into": into,
            "meta": (tuple(t.shape), t.dtype),
            "label": f"{what}({', '.join(dims)}, reduction={reduction!r}"
                     f"{', scatter=True' if scatter else ''})"}
    if mesh is not None or not coalescing.defer(engine, key, target, t, result, spec):
        send_command(engine, key, target, ("coll", "reduce", t.ref, result.ref, spec))
    if mesh is not None:
        return slice_to(result, mesh)
    return result


def reduce_(t: Tensor, dims: Dims = (), reduction: str = "sum", scatter: bool = False,
            mesh: Optional["ProcMesh"] = None) -> Tensor:
    """`reduce` in place: `t` itself holds the result (same shape: no `stack` without
    scatter, no scatter of the other reductions)."""
    return reduce(t, dims, reduction, scatter, mesh, None, _inplace=True)


def _check_submesh(sub: "ProcMesh", mesh: "ProcMesh", what: str) -> None:
    from .._meshes import ProcMesh

    if not isinstance(sub, ProcMesh):
        raise TypeError(f"{what}: mesh must be a ProcMesh, got {type(sub).__name__}")
    ids = {p.proc_id for p in mesh.procs}
    if sub.root is not mesh.root or not {p.proc_id for p in sub.procs} <= ids:
        raise ValueError(f"{what}: {sub!r} is not a slice of the tensor's mesh {mesh!r}")


def slice_to(t: Tensor, mesh: "ProcMesh") -> Tensor:
    """`t` seen on `mesh`, a slice of its mesh: a new handle on the same shards (a view:
    in-place changes through either show in both)."""
    engine = engine_of(t)
    key, target = engine.target(mesh)
    r = Tensor(t.shape, t.stride(), t.storage_offset(), t.dtype, None, mesh, t.device,
               engine, key, target)
    send_command(engine, key, target, ("alias", t.ref, r.ref))
    return r


def _tree(fn: Any, obj: Any, what: str) -> Any:
    """`fn` applied to the mesh tensors of `obj` (a tensor or a pytree of them, as Monarch's
    functions take)."""
    if isinstance(obj, Tensor):
        return fn(obj)
    from torch.utils._pytree import tree_flatten, tree_unflatten

    leaves, spec = tree_flatten(obj)
    if not any(isinstance(x, Tensor) for x in leaves):
        raise TypeError(f"{what} needs a mesh tensor (or a structure holding some), got "
                        f"{type(obj).__name__}")
    return tree_unflatten([fn(x) if isinstance(x, Tensor) else x for x in leaves], spec)


def slice_mesh(t: Any, **coords: Any) -> Any:
    """`t` restricted to the slice `t.mesh.slice(**coords)` (e.g. `slice_mesh(t, pp=0)`):
    a mesh tensor on those procs, sharing their shards. `t` may be a pytree of them."""
    return _tree(lambda x: slice_to(x, x.mesh.slice(**coords)), t, "slice_mesh")


def to_mesh(t: Any, mesh: "ProcMesh") -> Any:
    """A copy of `t` on `mesh` (another mesh of the same shape from the same proc mesh,
    typically another slice: a pipeline stage). Ranks match by their coordinates; a
    dimension of `mesh` that `t`'s mesh lacks gets the shard broadcast along it. `t` may be
    a pytree of mesh tensors."""
    return _tree(lambda x: _to_mesh(x, mesh), t, "to_mesh")


def _to_mesh(t: Tensor, mesh: "ProcMesh") -> Tensor:
    from .._meshes import ProcMesh

    t = _check_tensor(t, "to_mesh")
    if not isinstance(mesh, ProcMesh):
        raise TypeError(f"to_mesh: expected a ProcMesh, got {type(mesh).__name__}")
    if mesh.root is not t.mesh.root:
        raise ValueError(f"to_mesh: {mesh!r} and the tensor's mesh {t.mesh!r} come from "
                         "different proc meshes; copy through fetch_shard instead")
    pairs = transfer_pairs(t.mesh.shape, mesh.shape)
    src = [p.proc_id for p in t.mesh.procs]
    dst = [p.proc_id for p in mesh.procs]
    engine, key, target = placement(t)
    engine.check(key)
    result = _new_tensor(tuple(t.shape), t, mesh)
    _, result_key, result_target = placement(result)
    engine.check(result_key)
    members = tuple(sorted(set(src + dst)))
    comm = _comm(engine)
    backend = backend_for(t)
    spec = {"gid": comm.gid(members, backend), "members": members,
            "rdv": comm.rdv, "backend": backend, "cuda": t.is_cuda,
            "pairs": [(src[s], dst[d]) for s, d in pairs], "seq": next(_seq),
            "meta": (tuple(t.shape), t.dtype, t.device), "label": "to_mesh"}
    if comm.rdv[0] == "file" and not t.is_cuda and _vm_ok():
        spec["pids"] = {p.proc_id: p.pid for p in t.mesh.procs}
    cmd = ("coll", "p2p", t.ref, result.ref, spec)
    send_command(engine, key, target, cmd)
    if result_key != key:
        send_command(engine, result_key, result_target, cmd)
    return result


def mesh_rank(dims: Dims = (), mesh: Optional["ProcMesh"] = None) -> Tensor:
    """A 0-d int64 mesh tensor holding each proc's rank along `dims` of `mesh` (the active
    mesh by default; row-major over several dims, all of them when empty): Monarch's
    `mesh.rank(dims)`, the usual way to make per-rank values."""
    from ._context import get_active_mesh

    mesh = mesh if mesh is not None else get_active_mesh()
    if mesh is None:
        raise ValueError("mesh_rank(): no mesh given and none active (use "
                         "`with procs.activate():` or pass mesh=)")
    shape = mesh.shape
    dims = normalize_dims(shape, dims, "sum", False)
    values = {}
    for r, p in enumerate(mesh.procs):
        c = shape.coords_of(r)
        v = 0
        for d in dims:
            v = v * shape.size(d) + c[d]
        values[p.proc_id] = v
    engine = engine_for(mesh)
    key, target = engine.target(mesh)
    engine.check(key)
    out = Tensor((), (), 0, torch.int64, None, mesh, torch.device("cpu"), engine, key, target)
    send_command(engine, key, target, ("rank", out.ref, values))
    return out


def backend_for(t: Tensor) -> str:
    """NCCL for CUDA tensors on procs that each have their own GPU (their proc mesh has a
    `gpu`/`gpus` dimension); gloo otherwise, CUDA tensors included (procs sharing a GPU)."""
    if t.is_cuda and any(d in GPU_DIMS for d in t.mesh.root.shape.labels):
        return "nccl"
    return "gloo"


def _vm_ok() -> bool:
    """Same-host copies may read another proc's memory (process_vm_readv), unless the RDMA
    transport is forced to something else."""
    from ..config import config
    from ..rdma import vm

    return vm.available() and config.rdma_transport in ("auto", "vm")


def renew_groups(mesh: "ProcMesh") -> None:
    """Forget the process groups of `mesh`'s engine: the next collective makes new ones
    (after a collective failed)."""
    c = engine_for(mesh).__dict__.get("comm")
    if c is not None:
        c.renew()


def _attach() -> None:
    """Monarch's method forms: t.reduce(...), t.reduce_(...), t.to_mesh(m), t.slice_mesh()."""
    Tensor.reduce = reduce  # (declared on Tensor)
    Tensor.reduce_ = reduce_
    Tensor.to_mesh = to_mesh
    Tensor.slice_mesh = slice_mesh


_attach()
