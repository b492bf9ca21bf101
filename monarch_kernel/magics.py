"""The %mesh line magic and the %%mesh cell magic.

`%mesh alloc|spawn|list|status|stop|interrupt ...` manages meshes, `%mesh chaos` kills
random procs of one on purpose; `%mesh activate NAME`
and `%mesh deactivate` make torch in later cells run on a mesh (the tensor engine);
`%%mesh MESH` runs the cell's code on every proc of MESH. Bad arguments raise IPython's
UsageError, which the notebook shows as one line, never a traceback.
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand

from monarch_kernel import args as margs
from monarch_kernel.magic_alloc import AllocCommands
from monarch_kernel.magic_cells import CellCommands
from monarch_kernel.magic_chaos import ChaosCommands
from monarch_kernel.magic_context import MagicContext
from monarch_kernel.magic_inventory import InventoryCommands
from monarch_kernel.magic_workspace import WorkspaceCommands
from monarch_kernel.magic_logs import LogsCommands
from monarch_kernel.magic_observe import ObserveCommands

__all__ = ["MeshMagics"]


@magics_class
class MeshMagics(Magics):
    """%mesh and %%mesh; state lives in the NotebookSession passed in."""

    def __init__(self, shell: Any, session: Any) -> None:
        super().__init__(shell)
        self.session = session
        self.ctx = MagicContext(shell, session)
        alloc, inventory = AllocCommands(self.ctx), InventoryCommands(self.ctx)
        workspace = WorkspaceCommands(self.ctx)
        self.cells = CellCommands(self.ctx)
        observe = ObserveCommands(self.ctx)
        self.chaos = ChaosCommands(self.ctx)
        self._handlers = {
            "alloc": alloc.alloc, "joballoc": alloc.joballoc, "attachjob": alloc.attach_job,
            "spawn": alloc.spawn, "activate": alloc.activate,
            "deactivate": alloc.deactivate, "list": inventory.list,
            "status": inventory.status, "stop": inventory.stop, "cancel": inventory.cancel, "kill": inventory.kill, "why": inventory.why,
            "attach": inventory.attach, "admin": inventory.admin,
            "interrupt": inventory.interrupt, "logs": LogsCommands(self.ctx).logs,
            "sync": workspace.sync, "reload": workspace.reload,
            "timeline": observe.timeline, "stacks": observe.stacks,
            "chaos": self.chaos.chaos,
        }

    # -- entry points ----------------------------------------------------------------------
    @line_magic("mesh")
    def mesh_line(self, line: str) -> Any:
        """%mesh COMMAND ...: alloc, spawn, list, status, stop, interrupt, debug (see --help)."""
        head, _, rest = line.strip().partition(" ")
        if head == "debug":  # the debugger parses its own line: ranks(procs=0:2) has parens
            from monarch_kernel.debugger import debug_magic

            return debug_magic(rest.strip() or "help", self.shell)
        try:
            cmd = margs.parse_mesh_line(line)
        except margs.MagicHelp as h:
            print(h.text.rstrip("\n"))
            return None
        except margs.MagicArgError as e:
            raise UsageError(str(e)) from None
        return self._handlers[type(cmd).__name__[:-4].lower()](cmd)

    @no_var_expand  # {x} and $x belong to the remote code, not to the controller
    @cell_magic("mesh")
    def mesh_cell(self, line: str, cell: str) -> Any:
        """%%mesh MESH [--ranks ...]: run the cell on every selected proc (see --help)."""
        try:
            cmd = margs.parse_mesh_cell(line)
        except margs.MagicHelp as h:
            print(h.text.rstrip("\n"))
            return None
        except margs.MagicArgError as e:
            raise UsageError(str(e)) from None
        return self.cells.run_cell(cmd, cell)

    def completer_for(self, procs: Any) -> Any:
        """The CellCompleter mesh on `procs`, or None (see CellCommands.completer_for)."""
        return self.cells.completer_for(procs)
