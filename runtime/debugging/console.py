"""The interactive side: a prompt that drives paused actors' pdb, one at a time.

Used by the notebook (the wait hook opens it in the cell waiting on a call; input goes
through the kernel's stdin channel), by `%mesh debug`, and by scripts run in a terminal.
"""

from __future__ import annotations

import builtins
import sys
import threading
from typing import Any, Callable, Optional, Protocol

from ..config import config
from . import settings
from .commands import HELP, Command, CommandError, parse_command
from .registry import DebugError, DebugRegistry, Session, SessionState

__all__ = ["NoStdin", "default_input", "ConsoleRegistry", "DebugConsole", "console_factory", "wait_hook"]


class NoStdin(Exception):
    """There is no interactive input here (no terminal, or the kernel disallows stdin)."""


def _in_kernel() -> bool:
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython

        ip = get_ipython()
    except Exception:
        return False
    return ip is not None and getattr(ip, "kernel", None) is not None


def default_input(prompt: str) -> str:
    """A line from the user: the kernel's stdin channel, or a terminal; else NoStdin."""
    if _in_kernel():
        return builtins.input(prompt)  # ipykernel swaps it per request (allow_stdin)
    if config.debug_stdin:  # MONARCH_DEBUG_STDIN
        return builtins.input(prompt)
    if sys.stdin is None or not sys.stdin.isatty():
        raise NoStdin("stdin is not a terminal")
    return builtins.input(prompt)


def _is_no_stdin(e: BaseException) -> bool:
    # IPython's StdinNotImplementedError subclasses NotImplementedError
    return isinstance(e, (NoStdin, NotImplementedError))


class ConsoleRegistry(Protocol):
    """What a DebugConsole uses of its registry: the controller's `DebugRegistry`, or
    `admin.RemoteRegistry` over the admin endpoint (`monarch-debug`)."""

    def sessions(self) -> list[Session]: ...
    def paused(self) -> list[Session]: ...
    def find(self, rank: Optional[int] = None, mesh: Optional[str] = None) -> Session: ...
    def attach(self, s: Session) -> Session: ...
    def detach(self, s: Session, release: bool = False) -> None: ...
    def send_line(self, s: Session, line: str) -> None: ...
    def wait(self, s: Session, timeout: Optional[float] = None,
             stop: Optional[Callable[[], bool]] = None) -> tuple[str, SessionState]: ...
    def cast(self, selector: str, command: str, mesh: Optional[str] = None,
             timeout: float = 30.0) -> list[tuple[Session, str, SessionState]]: ...
    def continue_all(self, clear: bool = False) -> int: ...
    def apply_policy(self, s: Session, reason: str, pol: Optional[str] = None) -> None: ...


class DebugConsole:
    """Attends paused sessions: prints pdb's output, reads lines, handles meta-commands."""

    def __init__(self, registry: ConsoleRegistry, input_fn: Optional[Callable[[str], str]] = None,
                 print_fn: Optional[Callable[..., None]] = None) -> None:
        self.reg = registry
        self.input = input_fn or default_input
        self.print = print_fn or (lambda *a, **k: print(*a, **k, flush=True))

    # -- main loop ------------------------------------------------------------------------
    def run(self, future: Any = None, session: Optional[Session] = None) -> None:
        """Attend sessions until none is paused (or `future` resolved)."""
        nxt = session
        while True:
            if future is not None and future.done():
                return
            s = nxt or self._next(future)
            nxt = None
            if s is None:
                return
            res = self._attend(s, future)
            if isinstance(res, Session):
                nxt = res
            elif res == "stop":
                return

    def _next(self, future: Any) -> Optional[Session]:
        cands = [s for s in self.reg.paused() if not s.attached]
        if not cands:
            return None
        ports = set(getattr(future, "reply_ports", ()) or ())
        # the call this thread waits on first, then the others; lowest rank first
        return min(cands, key=lambda s: (s.port not in ports, s.mesh, s.rank, s.since))

    def _prompt(self, s: Session) -> str:
        p = s.prompt.strip() or "(Pdb)"
        inner = p[1:-1] if p.startswith("(") and p.endswith(")") else p
        return f"({inner} {s.mesh}:{s.rank}) "

    def _show(self, text: str) -> None:
        if text:
            self.print(text, end="" if text.endswith("\n") else "\n")

    def _attend(self, s: Session, future: Any) -> Any:
        try:
            self.reg.attach(s)
        except DebugError:
            return None
        self.print(s.header_line())
        done = (lambda: future.done()) if future is not None else None
        try:
            while True:
                text, state = self.reg.wait(s, stop=done)
                self._show(text)
                if state == "ended":
                    self.print(f"--- {s.label} {s.end_reason or 'continued'} ---")
                    return None
                if state != "paused":
                    if future is not None and future.done():  # returned while stepping
                        self.print(f"--- the call returned; {s.label} runs on ---")
                        return "stop"
                    continue  # a long command (e.g. `n` over a slow call) still running
                try:
                    line = self.input(self._prompt(s))
                except KeyboardInterrupt:
                    self.print(f"\n--- detached from {s.label}: it continues ---")
                    self.reg.detach(s, release=True)
                    return None
                except EOFError:
                    self.print(f"--- end of input: {s.label} continues ---")
                    self.reg.detach(s, release=True)
                    return None
                except BaseException as e:
                    if not _is_no_stdin(e):
                        raise
                    self._no_stdin(s, e)
                    return None
                if line.startswith("%"):
                    res = self._meta(line[1:], s)
                    if isinstance(res, Session) and res is not s:
                        self.reg.detach(s)
                        return res
                    if res == "detach":
                        self.print(f"--- detached from {s.label}: it continues ---")
                        self.reg.detach(s, release=True)
                        return None
                    continue
                try:
                    self.reg.send_line(s, line)
                except DebugError as e:
                    self.print(f"*** {e}")
        finally:
            if s.attached:
                self.reg.detach(s)

    def _no_stdin(self, s: Session, e: BaseException) -> None:
        pol = settings.policy()
        why = str(e) or type(e).__name__
        reason = (f"breakpoint at {s.where} in mesh {s.mesh!r} rank {s.rank} was hit but no "
                  f"debugger can attach here (no stdin: {why})")
        if s.kind == "postmortem":
            reason = f"post-mortem of {s.label} needs stdin ({why})"
        self.print(f"--- {reason}; policy {pol!r}: "
                   f"{'the actor continues' if pol == 'continue' else 'failing the call'} ---",
                   file=sys.stderr)
        self.reg.detach(s)
        self.reg.apply_policy(s, reason, pol)

    # -- meta-commands ----------------------------------------------------------------------
    def _meta(self, line: str, current: Optional[Session]) -> Any:
        try:
            cmd = parse_command(line)
        except CommandError as e:
            self.print(f"*** {e}")
            return None
        try:
            return self.execute(cmd, current)
        except (DebugError, ValueError) as e:
            self.print(f"*** {e}")
            return None

    def execute(self, cmd: Command, current: Optional[Session] = None) -> Any:
        """Run one meta-command; returns a Session to switch to, 'detach', or None."""
        reg = self.reg
        if cmd.name == "help":
            self.print(HELP)
        elif cmd.name == "list":
            self.print_list()
        elif cmd.name == "attach":
            return reg.find(cmd.rank, cmd.mesh)
        elif cmd.name == "cast":
            for s, text, state in reg.cast(cmd.selector, cmd.text, cmd.mesh):
                self.print(f"--- {s.label} ---")
                self._show(text)
                if state == "ended":
                    self.print(f"--- {s.label} continued ---")
        elif cmd.name == "continue":
            n = reg.continue_all()
            self.print(f"--- {n} paused actor{'s' if n != 1 else ''} continue ---")
        elif cmd.name == "detach":
            return "detach" if current is not None else None
        elif cmd.name == "policy":
            if cmd.text:
                settings.set_policy(cmd.text)
            self.print(f"debug policy: {settings.policy()}")
        elif cmd.name == "timeout":
            if cmd.text:
                settings.set_timeout(cmd.text)
            self.print(f"debug timeout: {settings.timeout():g} s")
        elif cmd.name == "postmortem":
            raise DebugError("postmortem is a %mesh debug command (not available in a prompt)")
        return None

    def print_list(self) -> None:
        sessions = self.reg.sessions()
        if not sessions:
            self.print("no paused actors")
            return
        for i, s in enumerate(sessions):
            self.print(f"{i:3d}  {s.describe()}")


# -- the wait hook: opens the prompt in the thread blocked on a future ---------------------
_busy = threading.local()
console_factory: Callable[[DebugRegistry], DebugConsole] = DebugConsole


def wait_hook(future: Any) -> None:
    """Called every ~0.1 s by a thread blocked in Future.get(): attend paused actors."""
    if getattr(_busy, "on", False) or threading.current_thread() is not threading.main_thread():
        return
    from .registry import current_registry

    reg = current_registry()
    if reg is None or not reg.has_unattended():
        return
    _busy.on = True
    try:
        console_factory(reg).run(future=future)
    finally:
        _busy.on = False
