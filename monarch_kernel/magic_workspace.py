"""`%mesh sync` (HostMesh.sync_workspace, progress per host in the cell) and `%mesh reload`
(a re-defined notebook class applied to live actors, `runtime.reload_actor_class`)."""

from __future__ import annotations

import os
import threading
from typing import Any

from IPython.core.error import UsageError

from monarch_kernel import args as margs
from monarch_kernel.folding import MeshCommandFailed
from monarch_kernel.magic_context import MagicContext

__all__ = ["WorkspaceCommands"]


class WorkspaceCommands:
    """The %mesh sync and %mesh reload commands."""

    def __init__(self, ctx: MagicContext) -> None:
        self.ctx = ctx

    def _hosts(self, var: Any) -> Any:
        from runtime import ActorMesh, HostMesh, ProcMesh, this_host

        if var is None:
            return this_host()
        obj = self.ctx.lookup(var, "a HostMesh or ProcMesh")
        if isinstance(obj, ActorMesh):
            obj = obj.proc_mesh
        if isinstance(obj, ProcMesh):
            return obj.host_mesh
        if isinstance(obj, HostMesh):
            return obj
        raise UsageError(f"%mesh sync: {var!r} is a {type(obj).__name__}, not a HostMesh or "
                         "ProcMesh")

    def sync(self, cmd: margs.SyncArgs) -> Any:
        """Sync the workspace to MESH's hosts; print progress per host and the summary."""
        from runtime import Workspace, WorkspaceError, WorkspaceSyncError

        self.ctx.runtime()
        hosts = self._hosts(cmd.mesh)
        dirs: Any = cmd.names or [os.getcwd()]  # {directory: name on the hosts}
        lock = threading.Lock()
        shown: dict[str, int] = {}

        def progress(host: str, files: int, of: int, nbytes: int, of_bytes: int) -> None:
            step = 4 * files // of if of else 4  # start, each quarter, done
            with lock:
                if shown.get(host) == step:
                    return
                shown[host] = step
                print(f"[sync {host}] {files}/{of} files, {nbytes / 1e6:.1f}/"
                      f"{of_bytes / 1e6:.1f} MB", flush=True)

        try:
            result = hosts.sync_workspace(Workspace(dirs=dirs), auto_reload=cmd.reload,
                                          progress=progress, timeout=cmd.timeout)
        except WorkspaceSyncError as e:  # a host, proc or module failed: not bad usage
            print(e.result)
            raise MeshCommandFailed(f"%mesh sync: {e}") from None
        except WorkspaceError as e:
            raise UsageError(f"%mesh sync: {e}") from None
        print(result)
        return None

    def reload(self, cmd: margs.ReloadArgs) -> Any:
        """Give the live actors of ACTORS their class as the notebook defines it now."""
        from runtime import ActorMesh, reload_actor_class

        actors = self.ctx.lookup(cmd.actors, "an ActorMesh")
        if not isinstance(actors, ActorMesh):
            raise UsageError(f"%mesh reload: {cmd.actors!r} is a {type(actors).__name__}, not "
                             "an ActorMesh")
        expr = cmd.cls or actors.class_name
        try:
            cls = eval(expr, self.ctx.ns)  # noqa: S307 - the user's own notebook expression
        except Exception as e:  # noqa: BLE001
            raise UsageError(f"%mesh reload: cannot find the class {expr!r} in the notebook: "
                             f"{e}") from None
        try:
            reload_actor_class(actors, cls)
        except TypeError as e:  # not an Actor class
            raise UsageError(f"%mesh reload: {e}") from None
        except RuntimeError as e:  # some actors could not take it
            raise MeshCommandFailed(f"%mesh reload: {e}") from None
        print(f"{actors.name}: {len(actors)} live actors now run {cls.__qualname__} "
              "(state kept)")
        return None
