"""The wiring of `runtime._base.features`: what lower layers call in upper ones at run time.

Above every layer (docs/architecture.md): imported once, by the facade `runtime/__init__.py`.
The features are imported when first called: `import runtime` loads no rdma, tensor or
debugger.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from . import _core
from ._base import features as _features
from ._core import Runtime
from ._meshes import ProcMesh, this_proc

if TYPE_CHECKING:  # loaded when first called (below), not by `import runtime`
    from .rdma import RDMABuffer

__all__: list[str] = []


def _rdma_buffer(view: Any) -> RDMABuffer:
    from .rdma import RDMABuffer

    return RDMABuffer(view)


def _rdma_read_ipc(buf: RDMABuffer, out: Any, timeout: float) -> None:
    from .rdma.buffer import read_ipc

    read_ipc(buf, out, timeout)


def _rdma_close_ipc(buf: RDMABuffer) -> None:
    from .rdma.buffer import close_ipc

    close_ipc(buf)


def _install_debugger_in_controller(rt: Runtime) -> None:
    from .debugging import install_in_controller

    install_in_controller(rt)


def _install_debugger_in_proc(rt: Runtime) -> None:
    from .debugging import install_in_proc

    install_in_proc(rt)


def _start_admin_endpoint(rt: Runtime) -> None:
    from .admin import serve
    from .debugging.admin import register

    register(serve(rt))


def _debugging_spawn_env() -> dict:
    from .debugging.proc_side import spawn_env

    return spawn_env()


def _tensor_activate(mesh: ProcMesh) -> object:
    from .tensor import activate

    return activate(mesh)


def _tensor_rref(endpoint: object, args: tuple, kwargs: dict) -> object:
    from .tensor._rref import rref

    return rref(endpoint, args, kwargs)


def _stacks_of_proc(rt: Runtime, proc_id: str, native: bool, timeout: float) -> object:
    from ._meshes.proc_stacks import stacks_of_proc

    return stacks_of_proc(rt, proc_id, native, timeout)


def _stop_owned_meshes(rt: Runtime, actor_id: str, timeout: float) -> None:
    from ._meshes.proc_mesh import stop_owned_meshes

    stop_owned_meshes(rt, actor_id, timeout)


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
_features.provide("meshes.stop_owned", _stop_owned_meshes)  # proc: an actor's stop
_features.provide("runtime.shutdown", _shutdown_runtime)  # supervision: fail fast
_features.provide("stacks.of_proc", _stacks_of_proc)    # admin: py_spy_stack
# the user may replace `runtime.unhandled_fault_hook` (below): read it at each failure
_features.provide("unhandled_fault_hook",  # _core
                  lambda: getattr(sys.modules["runtime"], "unhandled_fault_hook", None))
