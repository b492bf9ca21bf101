"""The tensor engine: torch tensors that live on every proc of a mesh, driven from the
controller as if they were local (`with procs.activate(): t = torch.rand(3, 4)`).

Public: `Tensor`, `activate`, `get_active_mesh`, `no_mesh`, `fetch_shard`, `inspect`, `show`,
`RemoteTensorError`, `engine_stats`, `tensor_state`, `manual_seed`, `flush`; the collectives
`reduce`, `reduce_`, `to_mesh`, `slice_mesh`, `mesh_rank`; remote functions `remote`,
`Remote`, `call_on_shard_and_fetch`; `grad_generator`; `Stream`, `get_active_stream`, `coalescing`. See docs/tensors.md.

Layer 8 (a feature): may import every layer below (`_meshes`, proc, actor, rdma,
transport, basics); `ProcMesh.activate()` and `.rref()` reach it through `runtime._base.features`.
"""

from ._coalescing import coalescing
from ._collectives import mesh_rank, reduce, reduce_, slice_mesh, to_mesh
from ._context import activate, get_active_mesh, no_mesh
from ._fetch import (RemoteTensorError, engine_stats, fetch_shard, flush, inspect, manual_seed,
                     show, tensor_state)
from ._grad import grad_generator
from ._groups import MeshDimError
from ._remote import Remote, call_on_shard_and_fetch, remote
from ._stream import Borrow, Stream, get_active_stream
from ._tensor import Tensor

__all__ = ["Borrow", "Stream", "coalescing", "get_active_stream", "MeshDimError", "Remote", "RemoteTensorError", "Tensor", "activate",
           "call_on_shard_and_fetch", "engine_stats", "fetch_shard", "flush", "get_active_mesh",
           "grad_generator", "inspect", "manual_seed", "mesh_rank", "no_mesh", "reduce",
           "reduce_", "remote", "show", "slice_mesh", "tensor_state", "to_mesh"]
