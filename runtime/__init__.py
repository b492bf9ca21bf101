"""monarch-notebook's actor runtime: meshes of processes and actors driven from one
controller (a script or a notebook), with Monarch's API names and semantics.

The root package, above every layer (docs/architecture.md): the public facade, and
the wiring of `runtime._features`, the calls lower layers make into upper ones at run time.
"""

from .actor import (Actor, ActorContext, CreatorInstance, concurrent_endpoint, context,
                    current_actor_name, current_rank, current_size, endpoint)
from .channel import Accumulator, Channel, Port, PortReceiver
from ._core import get_runtime, shutdown
from .config import (clear_runtime_config, configure, configured, get_global_config,
                     get_runtime_config)
from .errors import (ActorError, MeshStoppedError, MessageTooLargeError, SerializationError,
                     SupervisionError)
from .future import Future
from ._meshes import (ActorMesh, Endpoint, HostMesh, NotAnEndpoint, ProcInfo, ProcMesh,
                      active_mesh_names, as_endpoint, attach_to_workers,
                      get_or_spawn_controller, send, this_host, this_proc)
from ._meshes.proc_logs import ProcLog, ProcLogs, read_logs
from ._meshes.proc_stacks import proc_stacks
from ._meshes.proc_timeline import read_timeline
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
from .supervision.health import ActorState
from .value_mesh import ValueMesh
from . import _core, _features, hooks
from .hooks import add_startup_hook, set_display_hook


# -- wiring: what lower layers call in upper ones at run time (runtime/_features.py) --------
# This package is the one place above every layer (docs/architecture.md). The features are
# imported when first called, as before: `import runtime` loads no rdma, tensor or debugger.

def _rdma_buffer(view: object) -> object:
    from .rdma import RDMABuffer

    return RDMABuffer(view)


def _rdma_read_ipc(buf: object, out: object, timeout: float) -> None:
    from .rdma import _read_ipc

    _read_ipc(buf, out, timeout)


def _rdma_close_ipc(buf: object) -> None:
    from .rdma import _close_ipc

    _close_ipc(buf)


def _install_debugger_in_controller(rt: object) -> None:
    from .debugging import install_in_controller

    install_in_controller(rt)


def _install_debugger_in_proc(rt: object) -> None:
    from .debugging import install_in_proc

    install_in_proc(rt)


def _start_admin_endpoint(rt: object) -> None:
    from .admin import serve
    from .debugging.admin import register

    register(serve(rt))


def _debugging_spawn_env() -> dict:
    from .debugging.proc_side import spawn_env

    return spawn_env()


def _tensor_activate(mesh: object) -> object:
    from .tensor import activate

    return activate(mesh)


def _tensor_rref(endpoint: object, args: tuple, kwargs: dict) -> object:
    from .tensor._rref import rref

    return rref(endpoint, args, kwargs)


def _stacks_of_proc(rt: object, proc_id: str, native: bool, timeout: float) -> object:
    from ._meshes.proc_stacks import stacks_of_proc

    return stacks_of_proc(rt, proc_id, native, timeout)


def _shutdown_runtime(timeout: float) -> None:
    _core.get_runtime().shutdown(timeout=timeout)


# name: what calls it
_features.provide("rdma.buffer", _rdma_buffer)          # transport.bulk, transport.cuda_tensors
_features.provide("rdma.read_ipc", _rdma_read_ipc)      # transport.cuda_tensors
_features.provide("rdma.close_ipc", _rdma_close_ipc)    # transport.cuda_tensors
_features.provide("debugging.install_in_controller", _install_debugger_in_controller)  # _core
_features.provide("debugging.install_in_proc", _install_debugger_in_proc)  # proc.main
_features.provide("debugging.spawn_env", _debugging_spawn_env)  # _meshes: spawn_procs
_features.provide("admin.start", _start_admin_endpoint)  # _core, the first mesh
_features.provide("tensor.activate", _tensor_activate)  # _meshes: ProcMesh.activate()
_features.provide("tensor.rref", _tensor_rref)          # _meshes: endpoint.rref()
_features.provide("this_proc", this_proc)               # actor: context().actor_instance.proc
_features.provide("runtime.shutdown", _shutdown_runtime)  # supervision: fail fast
_features.provide("stacks.of_proc", _stacks_of_proc)    # admin: py_spy_stack
# the user may replace `runtime.unhandled_fault_hook` (below): read it at each failure
_features.provide("unhandled_fault_hook", lambda: globals().get("unhandled_fault_hook"))  # _core


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
    "as_endpoint", "concurrent_endpoint", "get_or_spawn_controller", "send", "ActorError",
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
    "HostSync", "ProcReload", "reload_actor_class",
]
