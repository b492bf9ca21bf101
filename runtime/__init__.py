"""monarch-notebook's actor runtime: meshes of processes and actors driven from one
controller (a script or a notebook), with Monarch's API names and semantics."""

from .actor import Actor, ActorContext, context, current_rank, current_size, endpoint
from .channel import Accumulator, Channel, Port, PortReceiver
from ._core import get_runtime, shutdown
from .config import configure, configured
from .errors import (ActorError, MeshStoppedError, MessageTooLargeError, SerializationError,
                     SupervisionError)
from .future import Future
from ._meshes import (ActorMesh, HostMesh, ProcInfo, ProcMesh, attach_to_workers, this_host,
                      this_proc)
from .shapes import Point, Shape, ShapeError
from .supervision import MeshFailure, default_unhandled_fault_hook
from .supervision.health import ActorState
from .value_mesh import ValueMesh
from . import _core, hooks
from .hooks import add_startup_hook, set_display_hook


def current_runtime() -> "_core.Runtime | None":
    """The running runtime of this controller, or None (none started yet, or shut down, or
    this is a proc). Never starts one, unlike `get_runtime()`."""
    rt = _core.current_runtime()
    if rt is None or rt.is_proc:
        return None
    return rt


_TENSOR_NAMES = ("Tensor", "get_active_mesh", "no_mesh", "inspect", "show", "fetch_shard",
                 "RemoteTensorError")


def __getattr__(name: str):
    """Lazy names: the data plane (`runtime.RDMABuffer`) and the tensor engine
    (`runtime.Tensor`, `runtime.inspect`, ...) are imported only when used."""
    if name in ("RDMABuffer", "get_rdma_backend", "is_rdma_available"):
        from . import rdma

        return getattr(rdma, name)
    if name in _TENSOR_NAMES:  # the tensor engine imports torch: only when used
        from . import tensor

        return getattr(tensor, name)
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")


#: Called at the root with a MeshFailure nobody handled; replace it to change the policy.
unhandled_fault_hook = default_unhandled_fault_hook

__all__ = [
    "Actor", "ActorContext", "ActorError", "ActorMesh", "ActorState", "Accumulator", "Channel",
    "Future", "HostMesh", "MeshFailure", "MeshStoppedError", "MessageTooLargeError", "Point",
    "Port", "PortReceiver", "ProcInfo", "ProcMesh", "SerializationError", "Shape",
    "ShapeError", "SupervisionError", "ValueMesh", "add_startup_hook", "attach_to_workers",
    "configure", "configured", "context", "current_rank", "current_runtime", "current_size",
    "endpoint", "get_runtime", "hooks", "set_display_hook", "shutdown", "this_host",
    "this_proc", "unhandled_fault_hook",
]
