"""`%mesh status|stop|attach|admin` without a kernel session: the views' subcommands, their
grammar and their actions, for a plain IPython (`%load_ext monarch_widgets` registers them
through `register_magic`).

The grammar is the one the Monarch kernel's full `%mesh` (`monarch_kernel.args`) is built
on: its errors (`MagicArgError`, `MagicHelp`), its parser class, and these four
subcommands' parsers and commands. The actions are the views' (`dashboard`, `render_text`,
`controls`).
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass
from typing import Any, NoReturn, Optional, Union

__all__ = [
    "MagicArgError", "MagicHelp", "MagicParser", "split_line", "StatusArgs", "StopArgs",
    "AttachArgs", "AdminArgs", "ViewCommand", "VIEW_COMMANDS", "VIEW_USAGE", "view_parsers",
    "view_command", "parse_view_line", "Text", "handle", "run", "register_magic",
]


# -- the grammar ------------------------------------------------------------------------------

class MagicArgError(ValueError):
    """A magic's arguments are wrong; the message is one line naming the problem."""


class MagicHelp(Exception):
    """`--help` was asked for; `text` is the help to show."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class MagicParser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of printing and exiting."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        kw.setdefault("add_help", True)
        kw.setdefault("allow_abbrev", False)
        super().__init__(*args, **kw)

    def error(self, message: str) -> NoReturn:
        raise MagicArgError(f"{self.prog}: {message}".replace("\n", " "))

    def print_help(self, file: Any = None) -> None:
        raise MagicHelp(self.format_help())

    def print_usage(self, file: Any = None) -> None:
        raise MagicHelp(self.format_usage())

    def exit(self, status: int = 0, message: Optional[str] = None) -> NoReturn:
        if status:
            raise MagicArgError((message or f"{self.prog}: error").strip())
        raise MagicHelp(message or self.format_help())


def split_line(line: str) -> list[str]:
    """A magic's line as shell words; MagicArgError when it cannot be split."""
    try:
        return shlex.split(line, posix=True)
    except ValueError as e:
        raise MagicArgError(f"cannot split arguments: {e}") from None


@dataclass
class StatusArgs:
    name: Optional[str] = None
    text: bool = False


@dataclass
class StopArgs:
    names: list[str]
    all: bool = False


@dataclass
class AttachArgs:
    mesh: str
    rank: int


@dataclass
class AdminArgs:
    pass


ViewCommand = Union[StatusArgs, StopArgs, AttachArgs, AdminArgs]

#: The `%mesh` subcommands that need no kernel session (what `%load_ext monarch_widgets`
#: offers in a plain IPython): the views' status, stop, attach and admin.
VIEW_COMMANDS = ("status", "stop", "attach", "admin")

VIEW_USAGE = """usage:
  %mesh status [--text] [NAME]   live dashboard (or a text status) of every mesh, or of NAME
  %mesh stop NAME ...            stop meshes (actor meshes or proc meshes) by name
  %mesh attach MESH RANK         attach the debugger to a paused actor
  %mesh admin                    how to attach the terminal admin (monarch-admin)"""


def view_parsers() -> dict[str, MagicParser]:
    """The parsers of the view subcommands, by name (the kernel's `%mesh` has them too)."""
    ps: dict[str, MagicParser] = {}
    st = ps["status"] = MagicParser(
        prog="%mesh status",
        description="Show the health dashboard of one mesh or all (a text table where "
                    "widgets are not available).")
    st.add_argument("name", metavar="NAME", nargs="?", help="a mesh name (default: all)")
    st.add_argument("--text", action="store_true", help="a text table, not the live widget")

    sp = ps["stop"] = MagicParser(prog="%mesh stop",
                                  description="Stop meshes this notebook created, and their "
                                              "procs.")
    sp.add_argument("names", metavar="NAME", nargs="*",
                    help="meshes to stop: notebook variables, or mesh names")
    sp.add_argument("--all", action="store_true", help="stop every mesh")

    at = ps["attach"] = MagicParser(
        prog="%mesh attach",
        description="Attach the debugger to rank RANK of actor mesh MESH, paused at a "
                    "breakpoint (the debugger registers how).")
    at.add_argument("mesh", metavar="MESH", help="the actor mesh's name")
    at.add_argument("rank", metavar="RANK", type=int, help="the rank (an integer)")

    ps["admin"] = MagicParser(
        prog="%mesh admin",
        description="Serve the admin endpoint of this controller and print how to attach "
                    "the terminal admin (monarch-admin) to it.")
    return ps


_PARSERS = view_parsers()


def view_command(cmd: str, ns: argparse.Namespace) -> ViewCommand:
    """The command of view subcommand `cmd` parsed into `ns` by its parser."""
    if cmd == "status":
        return StatusArgs(name=ns.name, text=ns.text)
    if cmd == "stop":
        if ns.all and ns.names:
            raise MagicArgError("%mesh stop: give mesh names or --all, not both")
        if not ns.all and not ns.names:
            raise MagicArgError("%mesh stop: give a mesh name, or --all")
        return StopArgs(names=list(ns.names), all=ns.all)
    if cmd == "attach":
        return AttachArgs(mesh=ns.mesh, rank=ns.rank)
    if cmd == "admin":
        return AdminArgs()
    raise MagicArgError(f"not a view subcommand: {cmd!r}")  # pragma: no cover


def parse_view_line(line: Union[str, list[str]]) -> ViewCommand:
    """Parse `%mesh status|stop|attach|admin ...` with the same grammar as the kernel's
    `%mesh` (StatusArgs, StopArgs, AttachArgs or AdminArgs). An empty line or `--help`
    raises MagicHelp(VIEW_USAGE); errors end with the subcommand's usage line."""
    tokens = split_line(line) if isinstance(line, str) else [str(t) for t in line]
    if not tokens or tokens[0] in ("-h", "--help", "help"):
        raise MagicHelp(VIEW_USAGE)
    cmd = tokens[0]
    if cmd not in VIEW_COMMANDS:
        raise MagicArgError(f"unknown %mesh subcommand {cmd!r} (the Monarch kernel's %mesh, "
                            f"%load_ext monarch_kernel, has the others)\n{VIEW_USAGE}")
    try:
        return view_command(cmd, _PARSERS[cmd].parse_args(tokens[1:]))
    except MagicArgError as e:
        msg = str(e) if str(e).startswith("%mesh") else f"%mesh {cmd}: {e}"
        raise MagicArgError(f"{msg}\n{_PARSERS[cmd].format_usage().strip()}") from None


# -- the actions ------------------------------------------------------------------------------

class Text(str):
    """A str that notebooks display as preformatted text (no quotes)."""

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))


def handle(argv: list[str] | str, runtime: Any = None, widgets: bool = True) -> Any:
    """Run one view subcommand (`"status --text"`, `["stop", "trainers"]`, ...); returns
    what the cell should display. Bad arguments raise `MagicArgError` (a ValueError)."""
    try:
        cmd = parse_view_line(argv)
    except MagicHelp as h:
        return Text(h.text.rstrip("\n"))
    return run(cmd, runtime=runtime, widgets=widgets)


def run(cmd: Any, runtime: Any = None, widgets: bool = True) -> Any:
    """Run a parsed view subcommand (StatusArgs, StopArgs, AttachArgs or AdminArgs)."""
    from monarch_widgets import controls

    if isinstance(cmd, StatusArgs):
        rt = _rt(runtime)
        if cmd.text or not widgets:
            from monarch_widgets.render import render_text

            snap = rt.health.snapshot()
            if cmd.name is not None:
                snap = [m for m in snap if cmd.name in (m.name, m.proc_mesh)]
            return Text(render_text(snap))
        if cmd.name is not None:
            raise ValueError("the dashboard shows every mesh; use --text to show one")
        from monarch_widgets.live import dashboard

        return dashboard(rt)
    if isinstance(cmd, StopArgs):
        rt = _rt(runtime)
        names = list(cmd.names)
        if cmd.all:
            names = sorted({m.name for m in rt.meshes()})
        done = []
        for name in names:
            if cmd.all and name not in {m.name for m in rt.meshes()}:
                continue  # stopped with its proc mesh
            done.append(controls.stop_mesh(name, runtime=rt))
        return Text("\n".join(done) or "no live meshes")
    if isinstance(cmd, AttachArgs):
        return Text(controls.attach(cmd.mesh, cmd.rank))
    if isinstance(cmd, AdminArgs):
        return Text(controls.serve_admin(_rt(runtime)))
    raise ValueError(f"not a view subcommand: {cmd!r}")


def _rt(runtime: Any) -> Any:
    if runtime is not None:
        return runtime
    from runtime import get_runtime

    return get_runtime()


def register_magic(ip: Any) -> None:
    """Register a `%mesh` line magic with the view subcommands in `ip`, unless a `%mesh`
    is registered already (the Monarch kernel's, which has them all)."""
    if "mesh" in ip.magics_manager.magics.get("line", {}):
        return
    from IPython.core.error import UsageError  # import cost (IPython)

    def mesh(line: str) -> Optional[Any]:
        try:
            return handle(line)
        except (ValueError, KeyError, RuntimeError) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            raise UsageError(str(msg)) from None

    mesh.__doc__ = VIEW_USAGE
    ip.register_magic_function(mesh, "line", "mesh")
