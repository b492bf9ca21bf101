"""`monarch-debug`: attach to a running controller's paused actors from a terminal.

Connects through the controller's authenticated admin endpoint (the same connection file
as `monarch-admin`) and offers list, attach, cast and continue, then pdb itself.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Optional, Sequence

from .admin import RemoteRegistry
from .commands import HELP, CommandError, parse_command
from .console import DebugConsole
from .registry import DebugError

__all__ = ["PROMPT", "connect", "run_command", "repl", "main"]

PROMPT = "monarch_dbg> "


def connect(path: Optional[str]) -> Any:
    """An AdminClient for connection file `path` (default: the newest one)."""
    try:
        from runtime.admin import AdminClient, ConnectionFileError, newest_connection_file
    except ImportError as e:  # the admin endpoint ships in runtime.admin
        raise SystemExit(f"monarch-debug: the admin endpoint is not available: {e}") from None
    if path is not None:
        return AdminClient.from_connection_file(path)
    try:
        newest = newest_connection_file()
    except ConnectionFileError as e:  # no running controller
        raise SystemExit(f"monarch-debug: {e}") from None
    return AdminClient.from_connection_file(newest)


def run_command(console: DebugConsole, line: str) -> bool:
    """Run one console line; False when the user asked to quit."""
    text = line.strip()
    if text in ("quit", "exit", "q"):
        return False
    if not text:
        return True
    try:
        cmd = parse_command(text)
    except CommandError as e:
        console.print(f"*** {e}")
        return True
    try:
        if cmd.name == "attach":
            s = console.reg.find(cmd.rank, cmd.mesh)
            console.run(session=s)
        elif cmd.name in ("policy", "timeout", "postmortem"):
            console.print(f"*** {cmd.name} is set in the notebook (%mesh debug {cmd.name})")
        else:
            console.execute(cmd)
    except DebugError as e:
        console.print(f"*** {e}")
    return True


def repl(client: Any, input_fn: Callable[[str], str] = input,
         print_fn: Optional[Callable[..., None]] = None, commands: Sequence[str] = ()) -> int:
    """The console: run `commands` if given, else read lines until quit or EOF."""
    console = DebugConsole(RemoteRegistry(client), input_fn=input_fn, print_fn=print_fn)
    if commands:
        run_command(console, " ".join(commands))
        return 0
    console.print("monarch-debug: 'help' for commands, 'quit' to leave")
    console.execute(parse_command("list"))
    while True:
        try:
            line = input_fn(PROMPT)
        except EOFError:
            return 0
        except KeyboardInterrupt:
            console.print("")
            continue
        if not run_command(console, line):
            return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="monarch-debug", description=__doc__.split("\n")[0],
                                epilog=HELP, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--connection-file", "-f", help="admin connection file of the controller")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="run one command (list, cast ..., continue) and exit")
    args = p.parse_args(argv)
    client = connect(args.connection_file)
    try:
        return repl(client, commands=args.command)
    finally:
        close = getattr(client, "close", None)
        if close is not None:
            close()


if __name__ == "__main__":
    sys.exit(main())
