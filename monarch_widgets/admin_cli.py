"""`monarch-admin`: attach the terminal admin to a running controller."""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from runtime.admin import (AdminClient, AdminError, ConnectionFileError,
                           list_connection_files, newest_connection_file,
                           read_connection_file)

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="monarch-admin",
        description="Live view of a monarch controller's hosts, procs and actors.")
    p.add_argument("--connection-file", "-f",
                   help="admin connection file (default: the newest live controller's)")
    p.add_argument("--list", action="store_true", help="list live controllers and exit")
    p.add_argument("--status", action="store_true",
                   help="print a text status once and exit (no TUI)")
    p.add_argument("--interval", type=float, default=1.0, help="refresh period, seconds")
    p.add_argument("--timeout", type=float, default=10.0, help="request timeout, seconds")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of the console script; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.interval <= 0:
        print("monarch-admin: --interval must be > 0", file=sys.stderr)
        return 2
    from runtime import rundir

    rundir.sweep()  # what crashed controllers of this user left behind
    try:
        if args.list:
            for path in list_connection_files():
                info = read_connection_file(path)
                print(f"{path}  pid {info.pid}  {' '.join(info.argv)[:80]}")
            return 0
        path = args.connection_file or newest_connection_file()
        client = AdminClient.from_connection_file(path, timeout=args.timeout)
    except (ConnectionFileError, ValueError) as e:
        print(f"monarch-admin: {e}", file=sys.stderr)
        return 1
    try:
        if args.status:
            from monarch_widgets.render import render_text

            print(render_text(client.snapshot()))
            return 0
        from monarch_widgets.tui import AdminApp

        AdminApp(client, refresh_interval=args.interval,
                 label=f"controller pid {client.pid}").run()
        return 0
    except AdminError as e:
        print(f"monarch-admin: {e}", file=sys.stderr)
        return 1
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
