"""The user-facing meshes (private modules; the names are re-exported by `runtime`).

User objects ask the runtime's state table and submit changes to it; they never write it.

Layer 7 (the user API): may import every layer below (host, proc, actor, channel,
admin, _core, transport, basics); the tensor engine, above it, through `runtime._base.features`.
"""

from .actor_mesh import ActorMesh
from .adverbs import EndpointRef, NotAnEndpoint, as_endpoint, send

Endpoint = EndpointRef  # Monarch's name for the type of `mesh.method`
from .host_mesh import HostMesh, attach_to_workers, child_env, this_host
from .local import get_or_spawn_controller, set_this_host, this_proc
from .proc_mesh import ProcInfo, ProcMesh, active_mesh_names
from .proc_logs import ProcLog, ProcLogs, read_logs
from .workspace_sync import (HostSync, ProcReload, SyncResult, WorkspaceSyncError,
                             reload_actor_class)

__all__ = ["ActorMesh", "Endpoint", "EndpointRef", "HostMesh", "NotAnEndpoint", "ProcInfo", "ProcLog",
           "ProcLogs", "ProcMesh", "active_mesh_names", "as_endpoint", "attach_to_workers", "child_env",
           "get_or_spawn_controller", "read_logs", "send", "this_host", "this_proc", "HostSync",
           "ProcReload", "SyncResult", "WorkspaceSyncError", "reload_actor_class"]

set_this_host(this_host)  # this_proc().host_mesh (local is below host_mesh)
