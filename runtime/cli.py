"""`python -m runtime.cli` (the `monarch-nb` script): a terminal's commands on a running job,
in the spirit of Monarch's `monarch` CLI, beside the notebook or script that owns the job.

    monarch-nb context [set PATH | ls | clear]     which saved job is current
    monarch-nb status [--json]                     the job, its proc meshes, procs and actors
    monarch-nb exec --mesh M [--rank R] 'CODE'     run Python on each proc, print its output
    monarch-nb shell --mesh M [--rank R]           an interactive Python shell on one proc
    monarch-nb kill                                end the job: agents, procs and files

A live owner (the controller the job's agents serve) is asked through its loopback admin
endpoint (`runtime.job.clients`); with none, the terminal attaches for the command and
leaves the kept procs to their lease when it exits (docs/multihost.md, "Several clients").
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional

__all__ = [
    "PROG", "CliError", "cmd_context", "cmd_status", "cmd_exec", "cmd_shell", "cmd_kill",
    "parser", "main",
]

PROG = "monarch-nb"


class CliError(Exception):
    """Bad input or a job that cannot serve the command: printed as one line, exit 2."""


# -- the job and its owner --------------------------------------------------------------------

def _load(path: Optional[str]) -> tuple[Any, Path]:
    from .job import JobError
    from .job.trait import job_load
    from .job.context import current_job_path, load_current_job

    try:
        if path is None:
            job = load_current_job()
            current = current_job_path()
            assert current is not None  # load_current_job raised JobError without one
            return job, current
        return job_load(path), Path(path).resolve()
    except FileNotFoundError:
        raise CliError(f"no saved job at {path!r}") from None
    except JobError as e:
        raise CliError(str(e)) from None


def _check_running(job: Any) -> None:
    """CliError when the job's agents are gone (its lease ended, or it was killed)."""
    from .job import JobError

    try:
        job.ensure_running()
    except JobError as e:
        raise CliError(str(e)) from None


def _owner(job: Any) -> Any:
    """An AdminClient of the live controller that owns `job`, or None."""
    from .admin import AdminClient, AdminError, list_connection_files

    for f in list_connection_files():
        try:
            client = AdminClient.from_connection_file(f, timeout=5.0)
        except Exception:
            continue
        try:
            jobs = client.call("job.list", wait=5.0)
        except AdminError:  # not a controller with jobs, or gone meanwhile
            client.close()
            continue
        if any(j.get("workdir") == str(job.workdir) for j in jobs):
            return client
        client.close()
    return None


def _attach(job: Any) -> None:
    """No live owner answered: this process attaches for the command."""
    from .errors import AttachRefusedError
    from .job import JobError

    print(f"{PROG}: no live controller owns the job; this terminal attaches for the "
          "command (kept procs stay for their lease when it exits)", file=sys.stderr)
    try:
        job.state(cached_path=None, timeout=60)
    except AttachRefusedError as e:
        raise CliError(f"the job's agents serve a controller this terminal cannot ask (one "
                       f"on another machine, or with MONARCH_ADMIN=0; or one just killed, "
                       f"until its agents count it as gone): {e}") from None
    except (JobError, TimeoutError) as e:
        raise CliError(str(e)) from None


def _running_job(a: argparse.Namespace) -> tuple[Any, Path, Any]:
    """(job, its saved path, its owner's admin client or None) of `--job` or the current
    job, checked running: what every command starts from."""
    job, path = _load(a.job)
    _check_running(job)
    return job, path, _owner(job)


def _remote(client: Any, op: str, args: dict, wait: float) -> Any:
    from .admin import AdminError

    try:
        return client.call(op, args, wait=wait)
    except AdminError as e:
        text = str(e)
        for kind in ("KeyError: ", "IndexError: "):  # bad input, said by the owner
            if kind in text:
                raise CliError(text.split(kind, 1)[1].strip("'\"")) from None
        raise CliError(f"the owning controller (pid {client.pid}): {text}") from None


# -- commands ---------------------------------------------------------------------------------

def cmd_context(a: argparse.Namespace) -> int:
    from .job import JobError
    from .job.context import (clear_current_job, current_job_path, saved_jobs,
                              set_current_job)

    if a.action == "set":
        if not a.path:
            raise CliError("context set needs the saved job's PATH")
        try:
            p = set_current_job(a.path)
        except JobError as e:
            raise CliError(str(e)) from None
        print(f"current job: {p}")
        return 0
    if a.action == "clear":
        clear_current_job()
        print("no current job")
        return 0
    cur = current_job_path()
    if a.action == "ls":
        jobs = saved_jobs()
        if not jobs:
            print("no saved jobs in this directory")
        for p in jobs:
            print(f"{'*' if p == cur else ' '} {p}")
        return 0
    if cur is None:
        raise CliError("no current job: allocate a kept one (%mesh alloc NAME --job process "
                       "--keep 30m) or run `context set PATH`")
    print(f"current job: {cur}")
    return 0


def _status(job: Any, client: Any) -> dict:
    from .job.clients import status_of

    if client is not None:
        st = _remote(client, "job.status", {"workdir": str(job.workdir)}, 60.0)
        st["owner"] = {"pid": client.pid}
    else:
        _attach(job)
        st = status_of(job)
        st["owner"] = None
    return st


def cmd_status(a: argparse.Namespace) -> int:
    job, path, client = _running_job(a)
    st = _status(job, client)
    st["path"] = str(path)
    if a.json:
        print(json.dumps(st))
        return 0
    keep = f", kept {st['keep']:g} s after its controller goes away" if st["keep"] else ""
    print(f"job {path}: {st['kind']} job {st['hosts']}{keep}")
    print(f"  directory: {st['workdir']}")
    owner = st["owner"]
    print(f"  owner: controller pid {owner['pid']}" if owner else
          "  owner: none (this terminal attached for the command)")
    if not st["proc_meshes"]:
        print("  no live proc mesh")
    for m in st["proc_meshes"]:
        sizes = ", ".join(f"{k}: {v}" for k, v in m["sizes"].items())
        kept = f", kept {m['keep']:g} s" if m["keep"] else ""
        print(f"  proc mesh {m['name']} {{{sizes}}}{kept}; actors: "
              f"{', '.join(m['actors']) or 'none'}")
        for p in m["procs"]:
            print(f"    rank {p['rank']}: {p['host']} pid {p['pid']} {p['state']}")
    for c in st["lost_calls"]:
        print(f"  lost with the previous controller: {c['mesh']}[{c['rank']}]."
              f"{c['endpoint']} ({c['state']})")
    return 0


def cmd_exec(a: argparse.Namespace) -> int:
    from .job.clients import exec_code

    code = sys.stdin.read() if a.code == "-" else a.code
    if a.rank is not None and a.rank < 0:
        raise CliError(f"rank {a.rank} is out of range: ranks start at 0")
    job, _, client = _running_job(a)
    if client is not None:
        results = _remote(client, "job.exec", {"workdir": str(job.workdir), "mesh": a.mesh,
                                               "code": code, "rank": a.rank,
                                               "timeout": a.timeout}, a.timeout + 60.0)
    else:
        _attach(job)
        try:
            results = exec_code(job, a.mesh, code, a.rank, a.timeout)
        except (KeyError, IndexError) as e:
            raise CliError(str(e.args[0]) if e.args else str(e)) from None
    failed = 0
    for r in results:
        tag = f"[{a.mesh} {r['rank']}]"
        for line in r["stdout"].splitlines():
            print(f"{tag} {line}")
        for line in r["stderr"].splitlines():
            print(f"{tag} {line}", file=sys.stderr)
        if r["error"]:
            failed += 1
            for line in r["error"].rstrip().splitlines():
                print(f"{tag} {line}", file=sys.stderr)
    sys.stdout.flush()
    return 1 if failed else 0


class _ProcConsole:
    """The terminal side of `shell`: reads lines (prompts only on a terminal), decides with
    Python's own compiler when a statement is complete, runs each complete one on the proc
    (`run(source)` -> its output) and prints what it printed, its value and traceback."""

    def __init__(self, run: Any, where: str) -> None:
        import code

        console = self

        class Console(code.InteractiveConsole):
            def runsource(self, source: str, filename: str = "<shell>",
                          symbol: str = "single") -> bool:
                try:
                    if self.compile(source, filename, symbol) is None:
                        return True  # incomplete: more lines
                except (OverflowError, SyntaxError, ValueError):
                    self.showsyntaxerror(filename)
                    return False
                console.run_remote(source)
                return False

            def raw_input(self, prompt: str = "") -> str:
                if sys.stdin.isatty():
                    return input(prompt)
                line = sys.stdin.readline()
                if not line:
                    raise EOFError
                return line.rstrip("\n")

        self._run = run
        self._where = where
        self.console = Console(filename="<shell>")

    def run_remote(self, source: str) -> None:
        try:
            r = self._run(source)
        except KeyboardInterrupt:
            print("KeyboardInterrupt: no longer waiting (the statement may still run on "
                  f"{self._where})", file=sys.stderr)
            return
        except CliError as e:
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return
        except Exception as e:  # the proc died, a timeout: the shell goes on
            print(f"{PROG}: error: {type(e).__name__}: {e}", file=sys.stderr)
            return
        sys.stdout.write(r["stdout"])
        sys.stdout.flush()
        sys.stderr.write(r["stderr"] + r["error"])
        sys.stderr.flush()

    def interact(self, banner: str) -> None:
        if sys.stdin.isatty():
            try:
                import readline  # noqa: F401 - line editing and history at the prompt
            except ImportError:
                pass
        self.console.interact(banner=banner, exitmsg="")


def cmd_shell(a: argparse.Namespace) -> int:
    from .job.clients import shell_close, shell_open, shell_run

    if a.rank < 0:
        raise CliError(f"rank {a.rank} is out of range: ranks start at 0")
    job, _, client = _running_job(a)
    if client is not None:
        info = _remote(client, "job.shell_open", {"workdir": str(job.workdir), "mesh": a.mesh,
                                                  "rank": a.rank}, 120.0)
        sid = info["session"]

        def run(source: str) -> dict:
            return _remote(client, "job.shell_run", {"session": sid, "source": source,
                                                     "timeout": a.timeout}, a.timeout + 60.0)

        def close() -> None:
            try:
                _remote(client, "job.shell_close", {"session": sid}, 60.0)
            except CliError:
                pass
    else:
        _attach(job)
        try:
            info = shell_open(job, a.mesh, a.rank)
        except (KeyError, IndexError) as e:
            raise CliError(str(e.args[0]) if e.args else str(e)) from None
        sid = info["session"]

        def run(source: str) -> dict:
            return shell_run(sid, source, a.timeout)

        def close() -> None:
            shell_close(sid)
    where = f"{a.mesh} rank {a.rank} (host {info['host']}, pid {info['pid']})"
    try:
        _ProcConsole(run, where).interact(
            f"{PROG} shell on {where}; each statement runs there; Ctrl-D ends the shell")
    finally:
        close()
    return 0


def cmd_kill(a: argparse.Namespace) -> int:
    from .job.context import clear_current_job, current_job_path

    job, path, client = _running_job(a)
    if client is not None:
        _remote(client, "job.kill", {"workdir": str(job.workdir)}, 90.0)
        how = f"by its owner (pid {client.pid})"
    else:
        job.kill()  # its agents end their procs; the job's directory goes
        how = "(no live controller owned it)"
    if current_job_path() == path:
        clear_current_job()
    path.unlink(missing_ok=True)
    print(f"killed job {path} {how}")
    return 0


# -- the parser -------------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = top.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    job = argparse.ArgumentParser(add_help=False)
    job.add_argument("--job", metavar="PATH",
                     help="the saved job to use (default: the current one, see `context`)")

    p = sub.add_parser("context", help="show, set or list the current job")
    p.add_argument("action", nargs="?", choices=("set", "ls", "clear"))
    p.add_argument("path", nargs="?", help="with `set`: the saved job's file")
    p.set_defaults(func=cmd_context)

    p = sub.add_parser("status", parents=[job], help="the job, its proc meshes and actors")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("exec", parents=[job], help="run Python code on the procs of a mesh")
    p.add_argument("--mesh", "-m", required=True, help="the proc mesh's name")
    p.add_argument("--rank", "-r", type=int, help="only this rank (flat; default: all)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")
    p.add_argument("code", help="Python code ('-': read it from stdin)")
    p.set_defaults(func=cmd_exec)

    p = sub.add_parser("shell", parents=[job],
                       help="an interactive Python shell on one proc of a mesh")
    p.add_argument("--mesh", "-m", required=True, help="the proc mesh's name")
    p.add_argument("--rank", "-r", type=int, default=0, help="the proc's flat rank (default 0)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds one statement may run (default 600)")
    p.set_defaults(func=cmd_shell)
    p = sub.add_parser("kill", parents=[job], help="end the job: agents, procs, files")
    p.set_defaults(func=cmd_kill)
    return top


def main(argv: Optional[list[str]] = None) -> int:
    a = parser().parse_args(argv)
    try:
        return int(a.func(a))
    except CliError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
