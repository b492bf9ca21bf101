"""What every %mesh command shares: the shell, the notebook session, the kernel's own
cell-runner meshes (internal meshes: `ProcMesh.spawn_internal`, so no view lists them), and
the lookups of notebook variables (errors as UsageError)."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError

__all__ = ["MagicContext"]


class MagicContext:
    """The state and lookups the %mesh command groups share."""

    def __init__(self, shell: Any, session: Any) -> None:
        self.shell = shell
        self.session = session
        #: id(root ProcMesh) -> (root, CellRunner mesh, CellCompleter mesh)
        self.runners: dict[int, Any] = {}

    @property
    def ns(self) -> dict:
        """The notebook's namespace."""
        return self.shell.user_ns

    def lookup(self, var: str, what: str) -> Any:
        """The notebook variable `var`, or a UsageError saying `what` was expected."""
        if var not in self.ns:
            raise UsageError(f"%mesh: no variable {var!r} in the notebook ({what} expected)")
        return self.ns[var]

    def proc_mesh(self, var: str, cmd: str) -> Any:
        """The live ProcMesh in `var` (or under the ActorMesh in it), else a UsageError."""
        from runtime import ActorMesh, ProcMesh

        obj = self.lookup(var, "a ProcMesh")
        if isinstance(obj, ActorMesh):
            obj = obj.proc_mesh
            if obj is None:
                raise UsageError(f"{cmd}: {var!r} is an ActorMesh without its ProcMesh here")
        if not isinstance(obj, ProcMesh):
            raise UsageError(f"{cmd}: {var!r} is a {type(obj).__name__}, not a ProcMesh "
                             "(create one with %mesh alloc)")
        if obj.stopped:
            raise UsageError(f"{cmd}: proc mesh {obj.name!r} was stopped")
        return obj

    def runtime(self) -> Any:
        """The runtime, with remote output routed into cells."""
        from runtime import get_runtime

        self.session.install_sink()
        return get_runtime()
