"""Stacks of procs taken from outside with py-spy (`runtime.proc_stacks`, `%mesh stacks`,
monarch-admin's stack view, the dashboard's actor detail): each proc's host agent is asked
(`Kind.AGENT_QUERY`, op "stacks", runtime/host/queries.py) and runs py-spy against the
proc's pid (runtime/stacks.py), so a proc whose GIL is held by C code answers too."""

from __future__ import annotations

import json
from typing import Any, Optional

from .._core import Runtime, get_runtime
from ..config import config
from ..stacks import ProcStacks, StacksError, threads_from
from ..transport.framing import ERROR, Header, Kind
from .questions import Questions

__all__ = ["proc_stacks", "stacks_of_proc", "stacks_of_procs"]


def _decode(h: Header, body: Any) -> dict:
    text = bytes(body).decode("utf-8", "replace")
    if h.status == ERROR:
        raise StacksError(text.split(": ", 1)[1] if text.startswith("StacksError: ") else text)
    return json.loads(text)


def _stacks_of(rt: Runtime, recs: list[tuple[int, Any]], native: bool,
               timeout: float) -> list[ProcStacks]:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    out: list[ProcStacks] = []
    questions: Questions[ProcStacks] = Questions(rt)
    for rank, rec in recs:
        entry = ProcStacks(rec.mesh, rank, rec.place, rec.pid, rec.proc_id, bool(native))
        out.append(entry)
        if rec.agent is None:
            entry.error = "this proc runs in the controller (this_proc()): no host agent"
        elif not rec.agent.alive:
            entry.error = f"its host agent {rec.agent.address} is not running"
        elif rec.state in ("failed", "stopped"):
            entry.error = f"proc {rec.state}"
        else:
            extra = {"op": "stacks", "proc": rec.proc_id, "native": bool(native),
                     "timeout": timeout, "py_spy": str(config.py_spy or "") or None}

            def send(port: int, address: str = rec.agent.address, extra: dict = extra) -> None:
                rt.send(address, Header(Kind.AGENT_QUERY, reply=rt.reply_address_for(address),
                                        port=port, extra=extra))

            questions.ask(entry, f"stacks of {rec.proc_id}", send, _decode)
    # the agent's py-spy has `timeout` itself
    for entry, got, err in questions.answers(timeout + 5.0):
        if isinstance(err, TimeoutError):
            entry.error = f"its host agent gave no answer within {timeout + 5.0:g} s"
        elif isinstance(err, StacksError):
            entry.error = str(err)
        elif err is not None:
            raise err
        else:
            entry.pid = got.get("pid", entry.pid)
            entry.host = entry.host or got.get("host", "")
            entry.threads = threads_from(got)
    return out


def proc_stacks(mesh: Any, rank: Optional[int] = None, native: bool = False,
                timeout: float = 10.0) -> list[ProcStacks]:
    """Every thread of each proc of `mesh` (a ProcMesh or ActorMesh; rank `rank` of its
    view only if given), taken by py-spy from the proc's host agent: names, the GIL
    holder, native frames if `native`. A proc py-spy cannot read has `.error` saying why
    (py-spy not found: where it looked; ptrace refused: the setting to change)."""
    from .proc_mesh import runtime_of, view_procs
    from .proc_timeline import proc_mesh_of

    pm = proc_mesh_of(mesh)
    try:  # procs just spawned: their agent knows their pids once they started
        pm.initialized.get(timeout=timeout)
    except Exception:  # noqa: BLE001 - a proc that died or is slow: its entry says so
        pass
    recs = list(enumerate(view_procs(pm)))
    if rank is not None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < len(recs):
            raise ValueError(f"rank must be an int in 0..{len(recs) - 1} for mesh "
                             f"{pm.name!r}, got {rank!r}")
        recs = [recs[rank]]
    return _stacks_of(runtime_of(pm) or get_runtime(), recs, native, timeout)


def stacks_of_proc(rt: Runtime, proc_id: str, native: bool = False,
                   timeout: float = 10.0) -> ProcStacks:
    """The py-spy stacks of one proc known to `rt` by id (monarch-admin's stack view)."""
    rec = rt.state.proc(proc_id)
    if rec is None:
        raise KeyError(f"unknown proc {proc_id}")
    return _stacks_of(rt, [(rec.rank, rec)], native, timeout)[0]


def stacks_of_procs(rt: Runtime, recs: list, native: bool = False,
                    timeout: float = 10.0) -> list[ProcStacks]:
    """The py-spy stacks of these procs ((rank, proc record) pairs), asked all at once
    (`runtime.diagnose`'s native stacks)."""
    return _stacks_of(rt, recs, native, timeout)
