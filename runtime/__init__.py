"""monarch-notebook's actor runtime: meshes of processes and actors driven from one
controller (a script or a notebook), with Monarch's API names and semantics.

The root package, above every layer (docs/architecture.md): the public facade. Importing
it runs `runtime._wiring`, which provides the calls lower layers make into upper ones.
"""

import warnings as _warnings

# `python -m runtime.transport.auth keygen PATH` runs a module this package imports: runpy
# warns about that (before it runs the module, after this runs); for that command the
# warning is noise, and nothing else matches it
_warnings.filterwarnings("ignore", message=r"'runtime\.transport\.auth' found in sys\.modules",
                         category=RuntimeWarning)

from .actor import (Actor, ActorContext, CreatorInstance, concurrent_endpoint, context,
                    current_actor_name, current_rank, current_size, endpoint)
from .channel import Channel, Port, PortReceiver
from ._core import get_runtime, shutdown
from .config import (clear_runtime_config, configure, configured, get_global_config,
                     get_runtime_config)
from .errors import (ActorError, CancelledError, InjectedFault, MeshStoppedError, MessageTooLargeError,
                     SerializationError, SupervisionError)
from .future import CallScope, Future, call_scope
from ._meshes.accumulator import Accumulator
from ._meshes import (ActorMesh, Endpoint, HostMesh, NotAnEndpoint, ProcInfo, ProcMesh,
                      active_mesh_names, as_endpoint, attach_to_workers,
                      get_or_spawn_controller, send, this_host, this_proc)
from ._meshes.proc_logs import ProcLog, ProcLogs, read_logs
from ._meshes.proc_stacks import proc_stacks
from ._meshes.diagnose import Diagnosis, diagnose
from ._meshes.proc_timeline import read_timeline
from ._meshes.reattach import LostCallsWarning
from .stacks import ProcStacks, StacksError
from .timeline import Timeline
from .telemetry import get_meter, span, traced
from ._meshes.legacy import proc_mesh
from ._meshes.workspace_sync import (HostSync, ProcReload, SyncResult, WorkspaceSyncError,
                                     reload_actor_class)
from .workspace import Workspace, WorkspaceError, WorkspaceTooLarge
from .host.worker import run_worker_loop_forever
from .shapes import Extent, Point, Shape, ShapeError
from .supervision import MeshFailure, default_unhandled_fault_hook
from .fault_injection import ActorFailurePolicy, inject_actor_failures, inject_raise
from .supervision.health import ActorState
from .value_mesh import ValueMesh
from . import _core, _wiring, hooks  # noqa: F401 - _wiring: provides the upward calls
from .hooks import add_startup_hook, set_display_hook


#: Monarch's name for what `context()` returns.
Context = ActorContext

_TRANSPORTS = ("tcp", "ipc", "metatls", "metatls-hostname", "tls")


def enable_transport(transport: str) -> None:
    """Accepted so Monarch programs run: here transports follow the topology (ipc sockets on
    one host, CurveZMQ tcp across hosts), so this only checks the name it is given."""
    if not isinstance(transport, str):
        raise TypeError(f"enable_transport takes a transport name such as 'tcp', got "
                        f"{transport!r}")
    if transport not in _TRANSPORTS and not transport.startswith(("tcp://", "ipc://")):
        raise ValueError(f"unknown transport {transport!r}; one of {', '.join(_TRANSPORTS)} "
                         f"or a tcp:// / ipc:// address")


def shutdown_context() -> Future:
    """Monarch's `shutdown_context()`: stop everything this process started (the local host
    agent and its procs included); returns a resolved Future[None]."""
    return shutdown()


def current_runtime() -> "_core.Runtime | None":
    """The running runtime of this controller, or None (none started yet, or shut down, or
    this is a proc). Never starts one, unlike `get_runtime()`."""
    rt = _core.current_runtime()
    if rt is None or rt.is_proc:
        return None
    return rt


_TENSOR_NAMES = ("Tensor", "get_active_mesh", "no_mesh", "inspect", "show", "fetch_shard",
                 "RemoteTensorError", "reduce", "reduce_", "to_mesh", "slice_mesh", "mesh_rank",
                 "MeshDimError", "remote", "Remote", "call_on_shard_and_fetch", "grad_generator",
                 "Stream", "get_active_stream", "coalescing")


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
    "active_mesh_names", "Actor", "ActorContext", "Context", "enable_transport", "Endpoint", "NotAnEndpoint",
    "as_endpoint", "concurrent_endpoint", "get_or_spawn_controller", "send", "ActorError", "CallScope", "call_scope", "CancelledError", "Diagnosis", "diagnose",
    "ActorMesh", "ActorState", "Accumulator", "Channel", "Extent", "Future", "HostMesh",
    "MeshFailure", "MeshStoppedError", "MessageTooLargeError", "Point",
    "Port", "PortReceiver", "ProcInfo", "ProcLog", "ProcLogs", "ProcMesh", "SerializationError", "Shape",
    "ShapeError", "SupervisionError", "ValueMesh", "add_startup_hook", "attach_to_workers",
    "clear_runtime_config", "configure", "configured", "get_global_config",
    "get_runtime_config", "context", "CreatorInstance", "current_actor_name",
    "current_rank", "current_runtime", "current_size",
    "endpoint", "get_runtime", "hooks", "set_display_hook", "shutdown", "shutdown_context",
    "proc_mesh", "read_logs", "read_timeline", "proc_stacks", "ProcStacks", "StacksError",
    "Timeline", "run_worker_loop_forever", "get_meter", "span", "traced",
    "this_host", "this_proc", "unhandled_fault_hook",
    "Workspace", "WorkspaceError", "WorkspaceTooLarge", "WorkspaceSyncError", "SyncResult",
    "HostSync", "ProcReload", "reload_actor_class", "ActorFailurePolicy",
    "InjectedFault", "inject_actor_failures", "inject_raise", "LostCallsWarning",
]
