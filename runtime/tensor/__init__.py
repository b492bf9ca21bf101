"""The tensor engine: torch tensors that live on every proc of a mesh, driven from the
controller as if they were local (`with procs.activate(): t = torch.rand(3, 4)`).

Public: `Tensor`, `activate`, `get_active_mesh`, `no_mesh`, `fetch_shard`, `inspect`, `show`,
`RemoteTensorError`, `engine_stats`, `tensor_state`, `manual_seed`, `flush`, and the
collectives `reduce`, `reduce_`, `to_mesh`, `slice_mesh`. See docs/tensors.md."""

from ._collectives import mesh_rank, reduce, reduce_, slice_mesh, to_mesh
from ._context import activate, get_active_mesh, no_mesh
from ._fetch import (RemoteTensorError, engine_stats, fetch_shard, flush, inspect, manual_seed,
                     show, tensor_state)
from ._groups import MeshDimError
from ._tensor import Tensor

__all__ = ["MeshDimError", "RemoteTensorError", "Tensor", "activate", "engine_stats",
           "fetch_shard", "flush", "get_active_mesh", "inspect", "manual_seed", "mesh_rank", "no_mesh",
           "reduce", "reduce_", "show", "slice_mesh", "tensor_state", "to_mesh"]
