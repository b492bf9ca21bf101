"""The debugger's meta-commands (list, attach, cast, continue, ...): parsing, pure logic.

The same words work in the notebook's pdb prompt (prefixed with '%'), in `%mesh debug`
and in the `monarch-debug` console.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Optional

from .selectors import SelectorError, parse_selector, split_selector

__all__ = ["HELP", "NAMES", "CommandError", "Command", "parse_command"]

HELP = """\
debugger commands (in the pdb prompt prefix them with '%', e.g. %list):
  list                          paused actors (mesh, rank, where, since)
  attach [MESH] RANK            switch the prompt to that actor
  cast [MESH] ranks(SEL) CMD    run pdb command CMD on several ranks, e.g.
                                cast ranks(procs=0:4) p loss    cast all bt
  continue                      let every paused actor continue
  detach                        leave this actor (it continues); next one, if any
  postmortem [MESH] [RANK]      pdb in the frame where an endpoint last raised
  policy fail|continue          what a breakpoint does where no stdin exists
  timeout SECONDS               how long an unattended breakpoint waits
  help                          this text
Ctrl-C at the prompt detaches from the actor (it continues)."""

NAMES = {"list": "list", "ls": "list", "l": "list", "attach": "attach", "a": "attach",
         "cast": "cast", "continue": "continue", "c": "continue", "cont": "continue",
         "detach": "detach", "postmortem": "postmortem", "pm": "postmortem",
         "--postmortem": "postmortem", "policy": "policy", "timeout": "timeout",
         "help": "help", "h": "help", "?": "help", "--help": "help", "-h": "help"}


class CommandError(ValueError):
    """A meta-command that cannot be parsed; the message says what is expected."""


@dataclass
class Command:
    name: str
    mesh: Optional[str] = None
    rank: Optional[int] = None
    selector: str = ""
    text: str = ""  # the pdb command of a cast; the value of policy/timeout
    args: list = field(default_factory=list)


def _mesh_rank(words: list[str], what: str) -> tuple[Optional[str], Optional[int]]:
    if len(words) > 2:
        raise CommandError(f"usage: {what} [MESH] [RANK]; got {' '.join(words)!r}")
    mesh, rank = None, None
    for w in words:
        if w.lstrip("-").isdigit():
            if rank is not None:
                raise CommandError(f"usage: {what} [MESH] [RANK]; two ranks given")
            rank = int(w)
        else:
            if mesh is not None:
                raise CommandError(f"usage: {what} [MESH] [RANK]; two meshes given")
            mesh = w
    return mesh, rank


def parse_command(line: str) -> Command:
    """Parse one meta-command line (without the '%' prefix)."""
    text = line.strip()
    if not text:
        return Command("attach")
    head, _, rest = text.partition(" ")
    name = NAMES.get(head)
    if name is None:
        raise CommandError(f"unknown debugger command {head!r}; try 'help'")
    rest = rest.strip()
    if name == "cast":
        mesh = None
        if rest and not rest.startswith(("ranks(", "all ", "* ")):
            mesh, _, rest = rest.partition(" ")
        try:
            sel, cmd = split_selector(rest)
            parse_selector(sel)
        except SelectorError as e:
            raise CommandError(f"usage: cast [MESH] ranks(SEL) CMD: {e}") from None
        if not cmd:
            raise CommandError("usage: cast [MESH] ranks(SEL) CMD: no pdb command given")
        return Command("cast", mesh=mesh, selector=sel, text=cmd)
    try:
        words = shlex.split(rest)
    except ValueError as e:
        raise CommandError(str(e)) from None
    if name in ("attach", "postmortem"):
        mesh, rank = _mesh_rank(words, name)
        return Command(name, mesh=mesh, rank=rank)
    if name in ("policy", "timeout"):
        if len(words) > 1:
            raise CommandError(f"usage: {name} VALUE")
        return Command(name, text=words[0] if words else "")
    if words:
        raise CommandError(f"{name} takes no arguments; got {rest!r}")
    return Command(name)
