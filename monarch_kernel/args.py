"""Argument parsing for the %mesh magics: pure, no I/O, tested directly.

Every parser raises `MagicArgError` (one line, names the problem) on bad input and
`MagicHelp` (the help text) on `--help`, instead of printing and exiting. The grammar is
built on the views' (`monarch_widgets.views`: the errors, the parser class, and the
subcommands a plain IPython has too: status, stop, attach, admin).
"""

from __future__ import annotations

import argparse
import ast
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from monarch_widgets.views import (VIEW_COMMANDS, VIEW_USAGE, AdminArgs, AttachArgs,
                                   MagicArgError, MagicHelp, MagicParser, StatusArgs, StopArgs,
                                   parse_view_line, split_line, view_command, view_parsers)

__all__ = [
    "MagicArgError", "MagicHelp", "parse_identifier", "parse_sizes", "RankSel", "parse_ranks",
    "parse_env", "parse_duration", "AllocArgs", "JobAllocArgs", "SpawnArgs", "ListArgs",
    "AttachJobArgs", "StatusArgs", "StopArgs", "CancelArgs", "KillArgs", "WhyArgs",
    "InterruptArgs", "AttachArgs", "AdminArgs", "ActivateArgs", "DeactivateArgs", "SyncArgs",
    "sync_names", "ReloadArgs", "LogsArgs", "TimelineArgs", "ChaosArgs", "StacksArgs", "CellArgs",
    "MeshCommand", "line_help", "cell_help", "parse_mesh_line", "VIEW_COMMANDS", "VIEW_USAGE",
    "parse_view_line", "parse_mesh_cell", "parse_alloc", "split_call_args",
]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KWARG = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(?!=)(.*)$", re.S)
_Parser = MagicParser


# -- value parsers ------------------------------------------------------------------------

def parse_identifier(text: str, what: str = "name") -> str:
    """Check that `text` is a Python identifier (a name the notebook can bind)."""
    if not _IDENT.match(text or ""):
        raise MagicArgError(f"{what} {text!r} is not a valid Python identifier")
    return text


def parse_sizes(text: str) -> dict[str, int]:
    """Parse `procs=4` or `hosts=2,gpus=8` into an ordered dict of dimension sizes."""
    out: dict[str, int] = {}
    for part in _split_commas(text):
        name, sep, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name:
            raise MagicArgError(f"expected DIM=SIZE, got {part!r}")
        parse_identifier(name, "dimension")
        if name in out:
            raise MagicArgError(f"dimension {name!r} given twice")
        try:
            size = int(value)
        except ValueError:
            raise MagicArgError(f"size of {name!r} must be an integer, got {value!r}") from None
        if size < 1:
            raise MagicArgError(f"size of {name!r} must be at least 1, got {size}")
        out[name] = size
    if not out:
        raise MagicArgError("expected at least one DIM=SIZE")
    return out


RankSel = Union[int, slice]


def parse_ranks(text: str) -> dict[str, RankSel]:
    """Parse `procs=0:2` or `hosts=1,procs=::2` into {dim: int | slice} for mesh slicing."""
    out: dict[str, RankSel] = {}
    for part in _split_commas(text):
        name, sep, spec = part.partition("=")
        name, spec = name.strip(), spec.strip()
        if not sep or not name or not spec:
            raise MagicArgError(f"expected DIM=INDEX or DIM=START:STOP[:STEP], got {part!r}")
        parse_identifier(name, "dimension")
        if name in out:
            raise MagicArgError(f"dimension {name!r} given twice")
        out[name] = _parse_index(name, spec)
    if not out:
        raise MagicArgError("expected at least one DIM=INDEX")
    return out


def _parse_index(name: str, spec: str) -> RankSel:
    pieces = spec.split(":")
    if len(pieces) > 3:
        raise MagicArgError(f"bad slice {spec!r} for {name!r}: at most START:STOP:STEP")
    nums: list[Optional[int]] = []
    for p in pieces:
        p = p.strip()
        if p == "":
            nums.append(None)
            continue
        try:
            nums.append(int(p))
        except ValueError:
            raise MagicArgError(f"bad index {p!r} for {name!r}: expected an integer") from None
    if len(nums) == 1:
        if nums[0] is None:
            raise MagicArgError(f"empty index for {name!r}")
        return nums[0]
    if len(nums) == 3 and nums[2] == 0:
        raise MagicArgError(f"slice step for {name!r} cannot be zero")
    return slice(*nums)


def _parse_hosts_var(text: str) -> str:
    if text.isdigit():
        raise MagicArgError(f"{text!r} is a number: --hosts names a HostMesh variable here; "
                            "for N hosts of a new job add --job KIND")
    return parse_identifier(text, "variable")


def parse_env(items: list[str]) -> dict[str, str]:
    """Parse repeated `KEY=VALUE` options into a dict."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise MagicArgError(f"expected KEY=VALUE for --env, got {item!r}")
        out[key] = value
    return out


def _split_commas(text: str) -> list[str]:
    return [p for p in (s.strip() for s in (text or "").split(",")) if p]


def _non_negative_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise MagicArgError(f"expected an integer >= 0, got {text!r}") from None
    if n < 0:
        raise MagicArgError(f"expected an integer >= 0, got {text!r}")
    return n


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return v


def parse_duration(text: str) -> float:
    """Seconds from `5s`, `500ms`, `2m` or a plain number of seconds; positive and finite."""
    t = text.strip().lower()
    scale = 1.0
    for unit, mult in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if t.endswith(unit):
            t, scale = t[:-len(unit)], mult
            break
    try:
        v = float(t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 5s, 500ms or 2m, got {text!r}") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive duration, got {text!r}")
    return v


def _arg_type(fn: Any) -> Any:
    """Wrap a MagicArgError-raising parser as an argparse type (message kept on one line)."""

    def conv(text: str) -> Any:
        try:
            return fn(text)
        except MagicArgError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    conv.__name__ = fn.__name__.replace("parse_", "")
    return conv


# -- parsed forms ---------------------------------------------------------------------------

@dataclass
class AllocArgs:
    name: str
    per_host: dict[str, int]
    hosts: Optional[str] = None
    mesh_name: Optional[str] = None
    env: dict[str, str] = field(default_factory=dict)
    progress: bool = True
    timeout: Optional[float] = None


@dataclass
class JobAllocArgs:
    """`%mesh alloc NAME --job KIND ...`: the job's arguments, for `parse_alloc`."""

    name: str
    argv: list[str]  # for parse_alloc (NAME first)
    progress: bool = True


@dataclass
class SpawnArgs:
    mesh: str
    actor_class: str
    name: Optional[str] = None
    var: Optional[str] = None
    args: list[str] = field(default_factory=list)  # Python expressions
    kwargs: dict[str, str] = field(default_factory=dict)  # name -> Python expression


@dataclass
class ListArgs:
    pass


@dataclass
class AttachJobArgs:
    """`%mesh attach-job PATH [--takeover]`: reattach to a kept job saved at PATH."""

    path: str
    takeover: bool = False


@dataclass
class CancelArgs:
    names: list[str]


@dataclass
class KillArgs:
    names: list[str]


@dataclass
class WhyArgs:
    name: Optional[str] = None


@dataclass
class InterruptArgs:
    mode: Optional[str] = None  # "remote" | "local" | None (show)


@dataclass
class ActivateArgs:
    name: str


@dataclass
class DeactivateArgs:
    pass


@dataclass
class SyncArgs:
    """`%mesh sync [MESH] [--dir D ...] [--reload]`."""

    mesh: Optional[str] = None  # a HostMesh or ProcMesh variable (default: this host)
    dirs: list[str] = field(default_factory=list)  # default: the working directory
    reload: bool = False
    timeout: Optional[float] = None
    #: {local directory: its name on the hosts}, from `--dir NAME=DIR` and DIR's own name
    names: dict[str, str] = field(default_factory=dict)


def sync_names(dirs: list[str]) -> dict[str, str]:
    """`--dir [NAME=]DIR` values -> {DIR: NAME on the hosts} (NAME defaults to DIR's own
    name; a DIR that exists as written is never split at `=`); MagicArgError when two land
    on one name, saying how to rename one."""
    import os

    out: dict[str, str] = {}
    owner: dict[str, str] = {}
    for value in dirs:
        name, sep, path = value.partition("=")
        if not sep or os.path.exists(os.path.expanduser(value)) or "/" in name or not name:
            name, path = "", value
        full = os.path.abspath(os.path.expanduser(path))
        name = name or os.path.basename(full.rstrip("/"))
        if name in owner and owner[name] != full:
            raise MagicArgError(
                f"%mesh sync: --dir {owner[name]} and --dir {full} would both land on "
                f"{name!r} on the hosts; name one: --dir OTHER_NAME={path}")
        owner[name] = full
        out[full] = name
    return out


@dataclass
class ReloadArgs:
    """`%mesh reload ACTORS [--class EXPR]`."""

    actors: str
    cls: Optional[str] = None  # default: the notebook name of the mesh's class


@dataclass
class LogsArgs:
    """`%mesh logs MESH [--rank R] [--tail N | --all] [--grep PAT] [--job VAR | --hosts VAR]`."""

    mesh: str
    rank: Optional[int] = None
    tail: Optional[int] = None
    grep: Optional[str] = None
    job: Optional[str] = None
    hosts: Optional[str] = None
    all: bool = False  # every line (no default tail)


@dataclass
class TimelineArgs:
    """`%mesh timeline [MESH] [--last S] [--save PATH] [--text]`."""

    mesh: Optional[str] = None  # default: every live proc mesh
    last: float = 300.0
    save: Optional[str] = None
    text: bool = False


@dataclass
class ChaosArgs:
    """`%mesh chaos MESH --kill-every DUR [--for DUR]` (SIGKILL random procs),
    `%mesh chaos MESH --raise --every DUR [--for DUR]` (random actors raise InjectedFault
    at their next call) / `%mesh chaos MESH --stop`. One of `kill_every` and `raise_every`
    is set, unless `stop`."""

    mesh: str
    kill_every: Optional[float] = None
    duration: Optional[float] = None
    stop: bool = False
    raise_every: Optional[float] = None


@dataclass
class StacksArgs:
    """`%mesh stacks MESH [--rank R] [--native] [--timeout S]`."""

    mesh: str
    rank: Optional[int] = None
    native: bool = False
    timeout: float = 10.0


@dataclass
class CellArgs:
    mesh: str
    ranks: Optional[dict[str, RankSel]] = None
    noblock: bool = False
    out: Optional[str] = None
    timeout: Optional[float] = None
    quiet: bool = False


MeshCommand = Union[AllocArgs, JobAllocArgs, SpawnArgs, ListArgs, StatusArgs, StopArgs, InterruptArgs,
                    AttachArgs, AdminArgs, ActivateArgs, DeactivateArgs, SyncArgs, ReloadArgs,
                    LogsArgs, TimelineArgs, StacksArgs, ChaosArgs, KillArgs, AttachJobArgs]


_COMMANDS = {
    "alloc": "allocate a process mesh and bind it to NAME",
    "spawn": "spawn an actor mesh on a process mesh",
    "list": "table of the meshes this notebook created",
    "attach-job": "reattach to a kept job (after a kernel restart): bind its live meshes",
    "status": "live dashboard of one mesh or all",
    "stop": "stop a mesh, or all of them",
    "cancel": "cancel the calls in flight to a mesh (its actors stop them and stay usable)",
    "kill": "SIGKILL the procs hosting a mesh, for a handler cancel cannot stop (stuck in C)",
    "why": "why is it stuck: what busy actors run, what waits, the cycles and their fix",
    "interrupt": "what Ctrl-C does to remote work (remote or local)",
    "attach": "attach the debugger to an actor paused at a breakpoint",
    "debug": "list, attach, cast to, continue paused actors; --postmortem (see '%mesh debug help')",
    "admin": "serve the admin endpoint for the terminal admin (monarch-admin)",
    "activate": "make a proc mesh active: torch in the cells that follow runs on its procs",
    "deactivate": "end '%mesh activate': torch runs locally again",
    "sync": "copy the workspace to the hosts of a mesh; --reload: live procs run the new code",
    "reload": "live actors of a mesh take their class as re-defined in the notebook",
    "logs": "what a mesh's procs wrote, from their log files (exited procs too)",
    "timeline": "per rank, the endpoint calls and spans of the last minutes; --save: a Chrome trace",
    "stacks": "every thread of a mesh's procs, taken from outside by py-spy (GIL holder, --native)",
    "chaos": "SIGKILL a random proc of a mesh at an interval while you work (--raise: a "
             "random actor raises instead; --stop ends it)",
}


def _line_help() -> str:
    rows = "\n".join(f"  {k:<10} {v}" for k, v in _COMMANDS.items())
    return (
        "usage: %mesh COMMAND [options]\n\n"
        "Manage process and actor meshes from the notebook.\n\n"
        f"commands:\n{rows}\n\n"
        "Run '%mesh COMMAND --help' for a command's options.\n"
        "'%%mesh MESH' runs a cell on every proc of MESH (see '%%mesh --help').\n"
    )


def _command_parsers() -> dict[str, _Parser]:
    ps: dict[str, _Parser] = {}
    a = ps["alloc"] = _Parser(
        prog="%mesh alloc",
        description="Allocate a process mesh and bind it to NAME in the notebook's namespace.",
        epilog="On a new multi-host job instead: %mesh alloc NAME --job local|process|slurm|ssh|"
               "kubernetes --hosts N [--per-host DIM=N] [--partition P] [--time T] "
               "[--account A] [--qos Q] [--gpus-per-node G] [--ssh-hosts H ...] [--image I] "
               "[--namespace NS] [--gateway [tcp://H:P]] [--timeout S] [--no-progress]; "
               "--gateway (slurm, ssh) drives the job through one port of its first host "
               "(ssh: an ssh -L the job opens); the Job is bound to NAME_job, and "
               "'%mesh stop NAME' also ends the job (see docs/multihost.md).")
    a.add_argument("name", metavar="NAME", type=_arg_type(parse_identifier),
                   help="variable to bind the ProcMesh to (also its mesh name)")
    a.add_argument("--per-host", dest="per_host", type=_arg_type(parse_sizes),
                   default={"procs": 1}, metavar="DIM=N[,DIM=N]",
                   help="procs per host, as named dimensions (default procs=1)")
    a.add_argument("--hosts", metavar="VAR", type=_arg_type(_parse_hosts_var),
                   help="a HostMesh variable (e.g. a job's hosts) to allocate on "
                        "(default: this host)")
    a.add_argument("--mesh-name", dest="mesh_name", metavar="LABEL",
                   help="the mesh's name in output and dashboards (default NAME)")
    a.add_argument("--env", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="environment variables for the procs (--env A=1 B=2, or repeated)")
    a.add_argument("--no-progress", dest="progress", action="store_false",
                   help="do not show the start-up progress display")
    a.add_argument("--timeout", type=_positive_float, metavar="SECONDS",
                   help="give up if the procs are not up within this time")

    s = ps["spawn"] = _Parser(
        prog="%mesh spawn",
        usage="%(prog)s [-h] [--name N] [--as VAR] MESH ActorClass [ARGS ...]",
        description="Spawn an actor mesh of ActorClass on the procs of MESH. ARGS are the "
                    "constructor's arguments: Python expressions evaluated in the notebook, "
                    "NAME=EXPR for a keyword argument; put '--' before ARGS that start "
                    "with '-'.")
    s.add_argument("mesh", metavar="MESH", type=_arg_type(parse_identifier),
                   help="the ProcMesh variable")
    s.add_argument("actor_class", metavar="ActorClass",
                   help="an Actor subclass (a notebook name or a dotted path)")
    s.add_argument("--name", metavar="N", help="the actor mesh's name (default: VAR, "
                                               "or the class name in lower case)")
    s.add_argument("--as", dest="var", metavar="VAR", type=_arg_type(parse_identifier),
                   help="variable to bind the ActorMesh to (default: the name)")

    aj = ps["attach-job"] = _Parser(
        prog="%mesh attach-job",
        description="Reattach to a job kept after its kernel went away (%mesh alloc ... "
                    "--job process --keep 30m saves it at .monarch/jobs/NAME.pkl): bind "
                    "each live proc mesh and actor mesh to a variable of its name, and the "
                    "job to NAME_job; calls the old kernel had in flight are listed as lost.")
    aj.add_argument("path", metavar="PATH", help="the saved job file")
    aj.add_argument("--takeover", action="store_true",
                    help="take the job over from a controller that is still alive")
    ps["list"] = _Parser(prog="%mesh list",
                         description="Show a table of meshes: name, kind, shape, state.")

    views = view_parsers()  # status, stop, attach, admin: the views' grammar
    ps["status"] = views["status"]
    ps["stop"] = views["stop"]

    cn = ps["cancel"] = _Parser(
        prog="%mesh cancel",
        description="Cancel every call this notebook has in flight to the actors of these "
                    "meshes, as Future.cancel() does: a running handler is interrupted (an "
                    "async one cancelled at its next await), a queued call is not run, the "
                    "calls raise CancelledError, and the actors stay usable.")
    cn.add_argument("names", metavar="NAME", nargs="+",
                    help="meshes: notebook variables, or mesh names")

    kl = ps["kill"] = _Parser(
        prog="%mesh kill",
        description="SIGKILL the procs that host these meshes (ActorMesh.kill(), "
                    "ProcMesh.kill()), for a handler that cancel cannot stop (one blocked in "
                    "a C call: %mesh why says so): every actor on those procs fails, and the "
                    "failure report says the user killed it. %mesh stop ends procs cleanly.")
    kl.add_argument("names", metavar="NAME", nargs="+",
                    help="meshes: notebook variables, or mesh names")

    wy = ps["why"] = _Parser(
        prog="%mesh why",
        description="Why is it stuck? For each actor of MESH (all meshes without it) that is "
                    "busy or has messages waiting: what it runs and for how long, what waits "
                    "behind it, what its handler waits on, and the cycles that cannot resolve "
                    "with what would fix them (runtime.diagnose).")
    wy.add_argument("name", metavar="MESH", nargs="?",
                    help="a mesh: a notebook variable, or a mesh name")

    it = ps["interrupt"] = _Parser(
        prog="%mesh interrupt",
        description="'remote' (default): interrupting a cell also sends SIGINT to the remote "
                    "actors of the call it waits on; 'local': only the wait is cancelled. "
                    "Without MODE, show the current mode.")
    it.add_argument("mode", nargs="?", choices=["remote", "local"])

    ps["attach"] = views["attach"]
    ps["admin"] = views["admin"]
    ac = ps["activate"] = _Parser(
        prog="%mesh activate",
        description="Make proc mesh NAME active for the cells that follow, as `with "
                    "NAME.activate():` would: torch factories and ops on its tensors run on "
                    "its procs (docs/tensors.md). Replaces a mesh activated before.")
    ac.add_argument("name", metavar="NAME", type=_arg_type(parse_identifier),
                    help="a ProcMesh variable (a slice bound to a variable works too)")
    ps["deactivate"] = _Parser(prog="%mesh deactivate",
                               description="End '%mesh activate': torch runs locally again.")
    sy = ps["sync"] = _Parser(
        prog="%mesh sync",
        description="Copy the workspace directories to every host of MESH "
                    "(HostMesh.sync_workspace): only changed files travel; progress per host.")
    sy.add_argument("mesh", metavar="MESH", nargs="?", type=_arg_type(parse_identifier),
                    help="a HostMesh or ProcMesh variable (default: this host)")
    sy.add_argument("--dir", dest="dirs", action="append", default=[], metavar="[NAME=]DIR",
                    help="a workspace directory (repeatable; default: the working directory); "
                         "NAME=DIR: under NAME on the hosts (default: DIR's own name)")
    sy.add_argument("--reload", action="store_true",
                    help="live procs on those hosts reload the changed modules")
    sy.add_argument("--timeout", type=_positive_float, metavar="SECONDS",
                    help="how long to wait for each host (default: workspace_timeout)")
    rl = ps["reload"] = _Parser(
        prog="%mesh reload",
        description="The live actors of ACTORS take their class as the notebook defines it "
                    "now (re-run its cell first); their state is kept.")
    rl.add_argument("actors", metavar="ACTORS", type=_arg_type(parse_identifier),
                    help="an ActorMesh variable")
    rl.add_argument("--class", dest="cls", metavar="EXPR",
                    help="the new class (default: the notebook name of the mesh's class)")
    tl = ps["timeline"] = _Parser(
        prog="%mesh timeline",
        description="Draw, one lane per rank, the endpoint calls and user spans "
                    "(runtime.span, @traced) the procs of MESH recorded in the last seconds; "
                    "failed ones in red. --save writes a Chrome trace (chrome://tracing, "
                    "ui.perfetto.dev).")
    tl.add_argument("mesh", metavar="MESH", nargs="?", default=None,
                    help="a ProcMesh or ActorMesh variable, or a proc mesh's name "
                         "(default: every live proc mesh)")
    tl.add_argument("--last", type=_arg_type(_positive_float), default=300.0,
                    help="seconds before now to show (default 300)")
    tl.add_argument("--save", metavar="PATH", help="also write the Chrome trace JSON to PATH")
    tl.add_argument("--text", action="store_true", help="a text summary instead of the drawing")
    sk = ps["stacks"] = _Parser(
        prog="%mesh stacks",
        description="Print every thread of the procs of MESH, taken from outside by py-spy "
                    "run by their host agents (works while C code holds the GIL): which "
                    "thread holds the GIL, native frames with --native.")
    sk.add_argument("mesh", metavar="MESH", help="a ProcMesh or ActorMesh variable, or a proc "
                                                 "mesh's name")
    sk.add_argument("--rank", type=_arg_type(_non_negative_int), help="one rank (default: all)")
    sk.add_argument("--native", action="store_true", help="native (C/C++) frames too")
    sk.add_argument("--timeout", type=_arg_type(_positive_float), default=10.0,
                    help="seconds py-spy may take per proc (default 10)")
    ch = ps["chaos"] = _Parser(
        prog="%mesh chaos",
        description="SIGKILL a random live proc of MESH (only that mesh) every --kill-every, "
                    "from a background thread, while the notebook keeps working: see "
                    "__supervise__ and your recovery code at work. With --raise --every DUR, "
                    "a random actor of MESH raises runtime.InjectedFault at its next call "
                    "instead (the caller gets an ActorError, the actor lives on). One line "
                    "per kill or raise; ends after --for, when no live proc (actor) is left, "
                    "or with '%mesh chaos MESH --stop'.")
    ch.add_argument("mesh", metavar="MESH", help="a ProcMesh or ActorMesh variable, or a proc "
                                                 "mesh's name")
    ch.add_argument("--kill-every", dest="kill_every", metavar="DUR",
                    type=_arg_type(parse_duration), help="interval between kills (5s, 500ms)")
    ch.add_argument("--raise", dest="raises", action="store_true",
                    help="make random actors of MESH raise InjectedFault at their next call, "
                         "instead of killing procs (with --every DUR)")
    ch.add_argument("--every", dest="every", metavar="DUR", type=_arg_type(parse_duration),
                    help="interval between raises with --raise (without it: between kills)")
    ch.add_argument("--for", dest="duration", metavar="DUR", type=_arg_type(parse_duration),
                    help="stop after this long (default: until --stop or no live proc)")
    ch.add_argument("--stop", action="store_true", help="stop the chaos on MESH")
    lg = ps["logs"] = _Parser(
        prog="%mesh logs",
        description="Print what the procs of MESH wrote, read from the log files their host "
                    "agents keep (on by default for jobs; file_capture=True for this_host()), "
                    "also for procs that have exited and after Job.load().")
    lg.add_argument("mesh", metavar="MESH", help="a ProcMesh (or ActorMesh) variable, or a "
                                                 "proc mesh's name")
    lg.add_argument("--rank", type=_arg_type(_non_negative_int), help="one rank (default: all)")
    many = lg.add_mutually_exclusive_group()
    many.add_argument("--tail", type=_arg_type(_non_negative_int),
                      help="the last N lines of each proc (default 200)")
    many.add_argument("--all", action="store_true", help="every line of each proc")
    lg.add_argument("--grep", metavar="PAT", help="only lines matching this regular expression")
    where = lg.add_mutually_exclusive_group()
    where.add_argument("--job", metavar="VAR", type=_arg_type(parse_identifier),
                       help="a Job variable whose hosts hold the files (for a name)")
    where.add_argument("--hosts", metavar="VAR", type=_arg_type(parse_identifier),
                       help="a HostMesh variable whose hosts hold the files (for a name)")
    return ps


def _cell_parser() -> _Parser:
    p = _Parser(
        prog="%%mesh",
        description="Run the cell's code on every selected proc of MESH, in a namespace that "
                    "persists per proc across cells. The last expression's value comes back "
                    "per rank as a ValueMesh; output streams live with a [mesh rank] prefix.",
    )
    p.add_argument("mesh", metavar="MESH", type=_arg_type(parse_identifier),
                   help="a ProcMesh (or ActorMesh) variable")
    p.add_argument("--ranks", type=_arg_type(parse_ranks), metavar="DIM=SEL[,DIM=SEL]",
                   help="run on a slice only, e.g. procs=0:2 or procs=1")
    p.add_argument("--noblock", action="store_true",
                   help="return a Future at once instead of waiting")
    p.add_argument("-o", "--out", dest="out", metavar="VAR", type=_arg_type(parse_identifier),
                   help="bind the result (ValueMesh, or Future with --noblock) to VAR")
    p.add_argument("--timeout", type=_positive_float, metavar="SECONDS",
                   help="stop waiting after this many seconds")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="do not display the result")
    return p


_LINE = _command_parsers()
_CELL = _cell_parser()


def line_help() -> str:
    return _line_help()


def cell_help() -> str:
    return _CELL.format_help()


_split = split_line


def parse_mesh_line(line: str) -> MeshCommand:
    """Parse the arguments of the `%mesh` line magic into one command object."""
    try:
        return _parse_mesh_line(line)
    except MagicArgError as e:
        msg = str(e)
        if not msg.startswith("%mesh"):
            word = (line.split() or [""])[0]
            raise MagicArgError(f"%mesh {word}: {msg}") from None
        raise


def _parse_mesh_line(line: str) -> MeshCommand:
    return _parse_mesh_tokens(_split(line))


def _parse_mesh_tokens(tokens: list[str]) -> MeshCommand:
    if not tokens:
        raise MagicArgError(f"%mesh: missing COMMAND ({', '.join(_COMMANDS)}); "
                            "try '%mesh --help'")
    cmd, rest = tokens[0], tokens[1:]
    if cmd in ("-h", "--help", "help"):
        raise MagicHelp(_line_help())
    parser = _LINE.get(cmd)
    if parser is None:
        raise MagicArgError(f"%mesh: unknown command {cmd!r} (choose from "
                            f"{', '.join(_COMMANDS)}); try '%mesh --help'")
    if cmd == "alloc" and any(t == "--job" or t.startswith("--job=") for t in rest):
        if any(t in ("-h", "--help") for t in rest):
            raise MagicHelp(parser.format_help())
        argv = [t for t in rest if t != "--no-progress"]
        if not argv or argv[0].startswith("-"):
            raise MagicArgError("%mesh alloc: NAME must come first, e.g. "
                                "%mesh alloc trainers --job slurm --hosts 2")
        parse_identifier(argv[0], "name")
        return JobAllocArgs(name=argv[0], argv=argv, progress="--no-progress" not in rest)
    if cmd == "spawn":
        options, call_args = _split_spawn_tokens(rest)
        ns = parser.parse_args(options)
        ns.args = call_args
    else:
        ns = parser.parse_args(rest)
    if cmd == "alloc":
        return AllocArgs(name=ns.name, per_host=ns.per_host, hosts=ns.hosts,
                         mesh_name=ns.mesh_name, env=parse_env(ns.env),
                         progress=ns.progress, timeout=ns.timeout)
    if cmd == "spawn":
        try:
            args, kwargs = split_call_args(ns.args)
        except MagicArgError as e:
            raise MagicArgError(f"%mesh spawn: {e}") from None
        return SpawnArgs(mesh=ns.mesh, actor_class=ns.actor_class, name=ns.name,
                         var=ns.var, args=args, kwargs=kwargs)
    if cmd == "list":
        return ListArgs()
    if cmd == "attach-job":
        return AttachJobArgs(path=ns.path, takeover=ns.takeover)
    if cmd in VIEW_COMMANDS:
        return view_command(cmd, ns)
    if cmd == "cancel":
        return CancelArgs(names=list(ns.names))
    if cmd == "kill":
        return KillArgs(names=list(ns.names))
    if cmd == "why":
        return WhyArgs(name=ns.name)
    if cmd == "interrupt":
        return InterruptArgs(mode=ns.mode)
    if cmd == "activate":
        return ActivateArgs(name=ns.name)
    if cmd == "deactivate":
        return DeactivateArgs()
    if cmd == "sync":
        return SyncArgs(mesh=ns.mesh, dirs=list(ns.dirs), reload=ns.reload, timeout=ns.timeout,
                        names=sync_names(list(ns.dirs)))
    if cmd == "reload":
        return ReloadArgs(actors=ns.actors, cls=ns.cls)
    if cmd == "logs":
        return LogsArgs(mesh=ns.mesh, rank=ns.rank, tail=ns.tail, grep=ns.grep, job=ns.job,
                        hosts=ns.hosts, all=ns.all)
    if cmd == "timeline":
        return TimelineArgs(mesh=ns.mesh, last=ns.last, save=ns.save, text=ns.text)
    if cmd == "stacks":
        return StacksArgs(mesh=ns.mesh, rank=ns.rank, native=ns.native, timeout=ns.timeout)
    if cmd == "chaos":
        return _chaos_args(ns)
    raise MagicArgError(f"%mesh: unknown command {cmd!r}")  # pragma: no cover


def _chaos_args(ns: argparse.Namespace) -> ChaosArgs:
    """`%mesh chaos`: kill (the default) or --raise, with one interval, or --stop."""
    if ns.stop and (ns.kill_every is not None or ns.every is not None or ns.raises
                    or ns.duration is not None):
        raise MagicArgError("%mesh chaos: --stop takes no --kill-every, --raise, --every or "
                            "--for")
    if ns.raises and ns.kill_every is not None:
        raise MagicArgError("%mesh chaos: --raise and --kill-every exclude each other "
                            "(--raise makes actors raise instead of killing procs): give "
                            "--raise --every DUR")
    if ns.kill_every is not None and ns.every is not None:
        raise MagicArgError("%mesh chaos: give the interval once, --kill-every DUR or "
                            "--every DUR")
    every = ns.every if ns.every is not None else ns.kill_every
    if not ns.stop and every is None:
        if ns.raises:
            raise MagicArgError("%mesh chaos: say how often --raise raises with --every DUR "
                                "(e.g. 5s)")
        raise MagicArgError("%mesh chaos: say how often with --kill-every DUR (e.g. 5s), "
                            "--raise --every DUR, or --stop")
    return ChaosArgs(mesh=ns.mesh, kill_every=None if ns.raises else every,
                     duration=ns.duration, stop=ns.stop,
                     raise_every=every if ns.raises else None)


def parse_mesh_cell(line: str) -> CellArgs:
    """Parse the arguments of the `%%mesh` cell magic."""
    try:
        return _parse_mesh_cell(line)
    except MagicArgError as e:
        if not str(e).startswith("%%mesh"):
            raise MagicArgError(f"%%mesh: {e}") from None
        raise


def _parse_mesh_cell(line: str) -> CellArgs:
    tokens = _split(line)
    if not tokens:
        raise MagicArgError("%%mesh: missing MESH; try '%%mesh --help'")
    ns = _CELL.parse_args(tokens)
    if ns.noblock and ns.timeout is not None:
        raise MagicArgError("%%mesh: --timeout applies to a blocking wait, not --noblock")
    return CellArgs(mesh=ns.mesh, ranks=ns.ranks, noblock=ns.noblock, out=ns.out,
                    timeout=ns.timeout, quiet=ns.quiet)


# -- %mesh alloc NAME --job KIND ...: the job's arguments -----------------------------------

def _job_alloc_parser() -> _Parser:
    from runtime.job.alloc import KINDS

    ap = _Parser(prog="%mesh alloc", add_help=False)
    ap.add_argument("name")
    ap.add_argument("--job", choices=KINDS, default="local")
    ap.add_argument("--hosts", type=int, default=None)
    ap.add_argument("--per-host", nargs="+", default=[])
    ap.add_argument("--partition")
    ap.add_argument("--time", dest="time_limit")
    ap.add_argument("--account")
    ap.add_argument("--qos")
    ap.add_argument("--gpus-per-node", dest="gpus_per_node", type=int)
    ap.add_argument("--ssh-hosts", nargs="+")
    ap.add_argument("--image")
    ap.add_argument("--namespace")
    ap.add_argument("--gateway", nargs="?", const=True, metavar="tcp://H:P")
    ap.add_argument("--timeout", type=float)
    ap.add_argument("--keep", type=parse_duration)  # a kept job's lease: 30m, 600
    return ap


def _job_per_host(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        try:
            sizes = parse_sizes(item)
        except MagicArgError as e:
            raise MagicArgError(f"--per-host takes DIM=N with N >= 1 (e.g. procs=2): {e}") \
                from None
        out.update(sizes)
    return out or {"procs": 1}


def parse_alloc(args: Union[str, list[str]]) -> Any:
    """Parse `NAME --job KIND --hosts N [--per-host procs=2] [job options]` into a
    `runtime.job.AllocSpec` (which starts the job: `spec.run()`); errors name the problem."""
    from runtime.job.alloc import OPTIONS, AllocSpec

    argv = _split(args) if isinstance(args, str) else list(args)
    ns, extra = _job_alloc_parser().parse_known_args(argv)
    if extra:
        raise MagicArgError(f"%mesh alloc: unknown arguments {extra}")
    hosts = ns.hosts if ns.hosts is not None else (len(ns.ssh_hosts) if ns.ssh_hosts else None)
    if hosts is None:
        raise MagicArgError("%mesh alloc: --hosts N is required")
    per_host = _job_per_host(ns.per_host)
    given = {k: v for k, v in vars(ns).items()
             if k not in ("name", "job", "hosts", "per_host") and v is not None}
    wrong = sorted(set(given) - OPTIONS[ns.job])
    if wrong:
        flag = "--time" if wrong[0] == "time_limit" else "--" + wrong[0].replace("_", "-")
        raise MagicArgError(f"%mesh alloc: {flag} does not apply to --job {ns.job}")
    if ns.job == "ssh" and not ns.ssh_hosts:
        raise MagicArgError("%mesh alloc: --job ssh needs --ssh-hosts H1 H2 ...")
    if ns.job == "ssh" and len(ns.ssh_hosts) != hosts:
        raise MagicArgError(f"%mesh alloc: --hosts {hosts} but {len(ns.ssh_hosts)} --ssh-hosts")
    if ns.job == "kubernetes" and not ns.image:
        raise MagicArgError("%mesh alloc: --job kubernetes needs --image")
    try:
        return AllocSpec(ns.name, ns.job, hosts, per_host, given)
    except ValueError as e:
        raise MagicArgError(f"%mesh alloc: {e}") from None


_OPTION = re.compile(r"^--?[A-Za-z]")


def _split_spawn_tokens(tokens: list[str]) -> tuple[list[str], list[str]]:
    """Separate `%mesh spawn` options (anywhere) from constructor ARGS after MESH ActorClass.

    Tokens after `--` are always ARGS, so `-x` can be passed as an expression."""
    options: list[str] = []
    positionals: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "--":
            positionals.extend(tokens[i + 1:])
            break
        if _OPTION.match(tok):
            options.append(tok)
            if tok in ("--name", "--as") and i + 1 < len(tokens):
                options.append(tokens[i + 1])
                i += 1
        else:
            positionals.append(tok)
        i += 1
    head, rest = positionals[:2], positionals[2:]
    return options + ["--"] + head, rest


def split_call_args(tokens: list[str]) -> tuple[list[str], dict[str, str]]:
    """Split constructor tokens into positional and `name=` keyword Python expressions.

    Each expression is checked for syntax here so a typo is reported before any spawn."""
    args: list[str] = []
    kwargs: dict[str, str] = {}
    for tok in tokens:
        m = _KWARG.match(tok)
        if m:
            key, expr = m.group(1), m.group(2)
            if key in kwargs:
                raise MagicArgError(f"keyword argument {key!r} given twice")
            kwargs[key] = _check_expr(expr)
        else:
            if kwargs:
                raise MagicArgError(f"positional argument {tok!r} follows keyword arguments")
            args.append(_check_expr(tok))
    return args, kwargs


def _check_expr(expr: str) -> str:
    try:
        ast.parse(expr, mode="eval")
    except SyntaxError:
        raise MagicArgError(f"argument {expr!r} is not a Python expression") from None
    return expr
