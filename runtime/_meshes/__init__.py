"""The user-facing meshes (private modules; the names are re-exported by `runtime`).

User objects ask the runtime's state table and submit changes to it; they never write it.
"""

from .actor_mesh import ActorMesh
from .adverbs import EndpointRef
from .host_mesh import HostMesh, attach_to_workers, child_env, this_host
from .proc_mesh import ProcInfo, ProcMesh


def this_proc() -> ProcMesh:
    """Not supported in this runtime: actors live in procs started by a host mesh."""
    raise NotImplementedError("this_proc() is not supported; use this_host().spawn_procs()")


__all__ = ["ActorMesh", "EndpointRef", "HostMesh", "ProcInfo", "ProcMesh", "attach_to_workers",
           "child_env", "this_host", "this_proc"]
