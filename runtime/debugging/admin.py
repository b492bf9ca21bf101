"""The debugger's requests on the controller's admin endpoint (JSON in, JSON out), and a
registry-like proxy over them so the `monarch-debug` console reuses DebugConsole."""

from __future__ import annotations

from typing import Any, Callable, Optional

from .registry import DebugError, DebugRegistry, Session, SessionState, session_state

__all__ = ["FIELDS", "register", "RemoteRegistry"]

FIELDS = ("sid", "kind", "mesh", "rank", "coords", "host", "pid", "proc_id", "actor_id",
          "port", "endpoint", "file", "line", "function", "since", "state", "attached")


def register(server: Any, get_registry: Optional[Callable[[], DebugRegistry]] = None) -> None:
    """Add debug.* requests to an admin server (`server.register(name, handler)`)."""
    if get_registry is None:
        from . import get_registry as _get

        get_registry = _get

    def reg() -> DebugRegistry:
        r = get_registry()
        if r is None:
            raise DebugError("this process has no debugger registry")
        return r

    def session(sid: str) -> Session:
        s = reg().get(str(sid))
        if s is None:
            raise DebugError(f"no paused session {sid!r} (it continued or its proc died)")
        return s

    def list_() -> list:
        return [s.as_dict() for s in reg().sessions()]

    def attach(sid: str, timeout: float = 5.0) -> dict:
        s = reg().attach(session(sid))
        text, state = reg().wait(s, float(timeout))
        return {"session": s.as_dict(), "output": text, "state": state}

    def wait(sid: str, timeout: float = 10.0) -> dict:
        r = reg()
        s = r.get(str(sid))
        if s is None:
            return {"output": "", "state": "ended"}
        text, state = r.wait(s, float(timeout))
        return {"output": text, "state": state}

    def send(sid: str, line: str, timeout: float = 30.0) -> dict:
        r = reg()
        s = session(sid)
        r.send_line(s, str(line))
        text, state = r.wait(s, float(timeout))
        return {"output": text, "state": state}

    def detach(sid: str, release: bool = True) -> bool:
        r = reg()
        s = r.get(str(sid))
        if s is not None:
            r.detach(s, release=bool(release))
        return s is not None

    def cast(selector: str, command: str, mesh: Optional[str] = None,
             timeout: float = 30.0) -> list:
        out = reg().cast(str(selector), str(command), mesh, float(timeout))
        return [{"session": s.as_dict(), "output": text, "state": state}
                for s, text, state in out]

    def continue_(clear: bool = False) -> int:
        return reg().continue_all(clear=bool(clear))

    for name, fn in (("debug.list", list_), ("debug.attach", attach), ("debug.wait", wait),
                     ("debug.send", send), ("debug.detach", detach), ("debug.cast", cast),
                     ("debug.continue", continue_)):
        server.register(name, fn)


def _session(d: dict) -> Session:
    fields = {k: d[k] for k in FIELDS if k in d}
    if "state" in fields:
        fields["state"] = session_state(fields["state"])
    return Session(addr="", **fields)


class RemoteRegistry:
    """The part of DebugRegistry that DebugConsole uses, over an admin client
    (anything with `.call(op, args, wait=None) -> result`)."""

    def __init__(self, client: Any, timeout: float = 30.0) -> None:
        self.client = client
        self.timeout = timeout
        self._pending: dict[str, tuple[str, SessionState]] = {}

    def _call(self, op: str, wait: Optional[float] = None, **args: Any) -> Any:
        try:
            return self.client.call(op, args, wait=wait)
        except Exception as e:
            if "DebugError" in type(e).__name__ or "failed:" in str(e):
                raise DebugError(str(e).split("failed: ", 1)[-1]) from None
            raise

    def sessions(self) -> list[Session]:
        return [_session(d) for d in self._call("debug.list")]

    def paused(self) -> list[Session]:
        return [s for s in self.sessions() if s.state == "paused"]

    def has_unattended(self) -> bool:
        return any(not s.attached for s in self.paused())

    def find(self, rank: Optional[int] = None, mesh: Optional[str] = None) -> Session:
        cands = [s for s in self.sessions() if (mesh is None or s.mesh == mesh)
                 and (rank is None or s.rank == rank)]
        if not cands:
            raise DebugError("no paused actor" + (f" of mesh {mesh!r}" if mesh else "")
                             + (f" with rank {rank}" if rank is not None else ""))
        return cands[0]

    def attach(self, s: Session) -> Session:
        r = self._call("debug.attach", sid=s.sid)
        s.attached = True
        self._pending[s.sid] = (r["output"], session_state(r["state"]))
        return s

    def detach(self, s: Session, release: bool = False) -> None:
        s.attached = False
        if s.state != "ended":
            self._call("debug.detach", sid=s.sid, release=release)

    def send_line(self, s: Session, line: str) -> None:
        r = self._call("debug.send", wait=self.timeout + 5.0, sid=s.sid, line=line,
                       timeout=self.timeout)
        self._pending[s.sid] = (r["output"], session_state(r["state"]))

    def wait(self, s: Session, timeout: Optional[float] = None,
             stop: Optional[Callable[[], bool]] = None) -> tuple[str, SessionState]:
        got = self._pending.pop(s.sid, None)
        if got is None:
            r = self._call("debug.wait", wait=15.0, sid=s.sid, timeout=10.0)
            got = (r["output"], session_state(r["state"]))
        s.state = got[1]
        return got

    def cast(self, selector: str, command: str, mesh: Optional[str] = None,
             timeout: float = 30.0) -> list[tuple[Session, str, SessionState]]:
        rows = self._call("debug.cast", wait=timeout + 5.0, selector=selector,
                          command=command, mesh=mesh, timeout=timeout)
        return [(_session(r["session"]), r["output"], session_state(r["state"])) for r in rows]

    def continue_all(self, clear: bool = False) -> int:
        return int(self._call("debug.continue", clear=clear))

    def apply_policy(self, s: Session, reason: str, pol: Optional[str] = None) -> None:
        """Nothing to do from here: detached, the session is unattended, and the
        controller's registry applies its own policy when `debug_timeout` passes."""
