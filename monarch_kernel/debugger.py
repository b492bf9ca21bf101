"""Kernel-side glue of the remote debugger: `%mesh debug ...` and the stdin bridge.

`install(shell)` makes breakpoints of actors open pdb in the cell waiting on the call
(lines travel through the kernel's stdin channel, so the execute request must allow
stdin), and prints a note in the notebook for a breakpoint hit while no cell waits.
`debug_magic(line, shell)` implements `%mesh debug [list|attach|cast|continue|...]`.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

from runtime.debugging.commands import HELP, CommandError, parse_command
from runtime.debugging.console import DebugConsole
from runtime.debugging.registry import DebugError, DebugRegistry

__all__ = ["USAGE", "attach_from_view", "install", "debug_magic"]

USAGE = """\
%mesh debug                         attach to the paused actors, one at a time
%mesh debug list                    list paused actors
%mesh debug attach [MESH] RANK      attach to one
%mesh debug cast [MESH] ranks(SEL) CMD   run a pdb command on several ranks
%mesh debug continue                let every paused actor continue
%mesh debug --postmortem [MESH] [RANK]   pdb in the frame of the last ActorError
%mesh debug policy fail|continue    where no stdin exists: fail the call, or continue
%mesh debug timeout SECONDS         how long an unattended breakpoint waits
"""

_installed: dict = {}


def _shell_of(shell_or_kernel: Any) -> Any:
    return getattr(shell_or_kernel, "shell", None) or shell_or_kernel


def _registry() -> DebugRegistry:
    from runtime.debugging import get_registry

    reg = get_registry(create=False)  # never start a runtime just to look
    if reg is None:
        raise DebugError("no paused actors (no runtime is running in this kernel)")
    _wire(reg)
    return reg


def _wire(reg: DebugRegistry) -> None:
    """Notes about unattended breakpoints go to the notebook's stderr (the active cell)."""
    if _installed.get("reg") is reg:
        return
    _installed["reg"] = reg

    def note(text: str) -> None:
        stream = sys.stderr
        try:
            stream.write(text + "\n")
            stream.flush()
        except Exception:
            pass

    reg.notify = note


def _on_pre_run_cell(*_: Any) -> None:
    # the runtime may have been started by plain code in a previous cell
    mod = sys.modules.get("runtime")  # never import (nor start) the runtime just to look
    current = getattr(mod, "current_runtime", None)
    if current is not None and current() is not None:
        try:
            _registry()
        except DebugError:
            pass


def _in_execute_request(shell: Any) -> bool:
    """True inside a cell whose request allows stdin (where input() reaches the user)."""
    get_parent = getattr(shell, "get_parent", None)
    try:
        parent = get_parent() if get_parent is not None else None
    except Exception:
        parent = None
    if not parent:
        return shell is not None and getattr(shell, "kernel", None) is None  # plain IPython
    return parent.get("msg_type") == "execute_request" and \
        bool(parent.get("content", {}).get("allow_stdin", True))


def _find_for_view(reg: DebugRegistry, mesh: str, rank: int) -> Any:
    """The session of `mesh[rank]`; `mesh` may be the health-model name (e.g. "name~2")."""
    from runtime import current_runtime

    rt = current_runtime()
    names = {mesh}
    for rec in (getattr(rt, "actor_meshes", {}) or {}).values():
        if getattr(rec, "health_name", "") == mesh:
            names.add(rec.name)
    for s in reg.sessions():
        if s.mesh in names and s.rank == rank:
            return s
    return reg.find(rank, mesh)  # raises DebugError naming what is paused


def attach_from_view(mesh: str, rank: int) -> str:
    """The dashboard's "attach" button and `%mesh attach MESH RANK`: open pdb on that actor
    in the running cell; outside a cell, say how to."""
    reg = _registry()
    s = _find_for_view(reg, mesh, int(rank))
    shell = _installed.get("shell")
    if not _in_execute_request(shell):
        return (f"{s.label} is paused at {s.where}: run `%mesh debug attach {s.mesh} {s.rank}` "
                "in a cell to open its pdb prompt there")
    DebugConsole(reg).run(session=s)
    return f"done with {s.label}"


def install(shell_or_kernel: Any) -> None:
    """Wire the debugger into an IPython kernel (idempotent).

    The wait hook (installed with the controller's runtime) reads lines with the kernel's
    `input()`, which ipykernel routes through the stdin channel when the request allowed
    stdin and turns into StdinNotImplementedError otherwise (then the policy applies)."""
    shell = _shell_of(shell_or_kernel)
    if _installed.get("shell") is shell:
        return
    _installed["shell"] = shell
    try:  # the dashboard's attach button and `%mesh attach` come here
        from monarch_widgets import controls

        controls.set_attach_handler(attach_from_view)
    except ImportError:
        pass
    events = getattr(shell, "events", None)
    if events is not None:
        events.register("pre_run_cell", _on_pre_run_cell)
    _on_pre_run_cell()


def _postmortem_target(cmd: Any) -> tuple[str, int]:
    """(actor_id, rank) for `--postmortem [MESH] [RANK]`: the last ActorError by default."""
    from runtime import get_runtime
    from runtime.errors import ActorError

    mesh, rank = cmd.mesh, cmd.rank
    last = getattr(sys, "last_value", None)
    if isinstance(last, ActorError):
        mesh = mesh or last.mesh
        rank = last.rank if rank is None else rank
    if not mesh:
        raise DebugError("no ActorError to debug; use %mesh debug --postmortem MESH RANK")
    rt = get_runtime()
    recs = [r for r in rt.actor_meshes.values() if r.name == mesh and not r.stopped]
    if not recs:
        raise DebugError(f"no live actor mesh named {mesh!r}")
    return recs[-1].actor_id, int(rank or 0)


def debug_magic(line: str, shell: Any = None, console: Optional[DebugConsole] = None) -> None:
    """`%mesh debug ...`: list, attach, cast, continue, post-mortem, policy, timeout."""
    try:
        cmd = parse_command(line)
    except CommandError as e:
        print(f"%mesh debug: {e}\n{USAGE}", file=sys.stderr)
        return
    if cmd.name == "help":
        print(USAGE + "\n" + HELP)
        return
    try:
        if cmd.name in ("policy", "timeout"):  # settings: no runtime needed
            (console or DebugConsole(None)).execute(cmd)  # type: ignore[arg-type]
            return
        reg = _registry()
        con = console or DebugConsole(reg)
        if cmd.name == "attach":
            if not reg.sessions():
                print("no paused actors")
                return
            first = reg.find(cmd.rank, cmd.mesh) if (cmd.rank, cmd.mesh) != (None, None) \
                else None
            con.run(session=first)
        elif cmd.name == "postmortem":
            actor_id, rank = _postmortem_target(cmd)
            con.run(session=reg.postmortem(actor_id, rank))
        else:
            con.execute(cmd)
    except (DebugError, ValueError) as e:
        print(f"%mesh debug: {e}", file=sys.stderr)
