"""Stacks of procs taken from outside with py-spy (`runtime.proc_stacks`, `%mesh stacks`,
monarch-admin's stack view, the dashboard's actor detail): each proc's host agent is asked
(`Kind.AGENT_QUERY`, op "stacks", runtime/host/queries.py) and runs py-spy against the
proc's pid (runtime/stacks.py), so a proc whose GIL is held by C code answers too."""

from __future__ import annotations

import json
import time
from typing import Any, Optional

from .._core import Runtime, get_runtime
from ..config import config
from ..future import Future
from ..stacks import ProcStacks, StacksError, threads_from
from ..transport.framing import ERROR, Header, Kind


def _ask(rt: Runtime, rec: Any, native: bool, timeout: float) -> tuple[Future, int]:
    fut: Future = Future(f"stacks of {rec.proc_id}")

    def on_reply(h: Header, body: Any, buffers: list) -> None:
        rt.close_port(port)
        text = bytes(body).decode("utf-8", "replace")
        if h.status == ERROR:
            fut.set_exception(StacksError(text.split(": ", 1)[1] if text.startswith(
                "StacksError: ") else text))
        else:
            fut.set_result(json.loads(text))

    port = rt.open_port(on_reply, None, ())
    rt.send(rec.agent.address, Header(Kind.AGENT_QUERY,
                                      reply=rt.reply_address_for(rec.agent.address), port=port,
                                      extra={"op": "stacks", "proc": rec.proc_id,
                                             "native": bool(native), "timeout": timeout,
                                             "py_spy": str(config.py_spy or "") or None}))
    return fut, port


def _stacks_of(rt: Runtime, recs: list[tuple[int, Any]], native: bool,
               timeout: float) -> list[ProcStacks]:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    asked = []
    for rank, rec in recs:
        out = ProcStacks(rec.mesh, rank, rec.host, rec.pid, rec.proc_id, bool(native))
        if rec.agent is None:
            out.error = "this proc runs in the controller (this_proc()): no host agent"
        elif not rec.agent.alive:
            out.error = f"its host agent {rec.agent.address} is not running"
        elif rec.state in ("failed", "stopped"):
            out.error = f"proc {rec.state}"
        else:
            asked.append((out, *_ask(rt, rec, native, timeout)))
            continue
        asked.append((out, None, 0))
    deadline = time.monotonic() + timeout + 5.0  # the agent's py-spy has `timeout` itself
    for out, fut, port in asked:
        if fut is None:
            continue
        try:
            got = fut.get(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            rt.close_port(port)
            out.error = f"its host agent gave no answer within {timeout + 5.0:g} s"
            continue
        except StacksError as e:
            out.error = str(e)
            continue
        out.pid = got.get("pid", out.pid)
        out.host = got.get("host", out.host)
        out.threads = threads_from(got)
    return [out for out, _, _ in asked]


def proc_stacks(mesh: Any, rank: Optional[int] = None, native: bool = False,
                timeout: float = 10.0) -> list[ProcStacks]:
    """Every thread of each proc of `mesh` (a ProcMesh or ActorMesh; rank `rank` of its
    view only if given), taken by py-spy from the proc's host agent: names, the GIL
    holder, native frames if `native`. A proc py-spy cannot read has `.error` saying why
    (py-spy not found: where it looked; ptrace refused: the setting to change)."""
    from .proc_timeline import _proc_mesh

    pm = _proc_mesh(mesh)
    try:  # procs just spawned: their agent knows their pids once they started
        pm.initialized.get(timeout=timeout)
    except Exception:  # noqa: BLE001 - a proc that died or is slow: its entry says so
        pass
    recs = list(enumerate(pm._view_procs()))
    if rank is not None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < len(recs):
            raise ValueError(f"rank must be an int in 0..{len(recs) - 1} for mesh "
                             f"{pm.name!r}, got {rank!r}")
        recs = [recs[rank]]
    return _stacks_of(pm._rt or get_runtime(), recs, native, timeout)


def stacks_of_proc(rt: Runtime, proc_id: str, native: bool = False,
                   timeout: float = 10.0) -> ProcStacks:
    """The py-spy stacks of one proc known to `rt` by id (monarch-admin's stack view)."""
    rec = rt.state.proc(proc_id)
    if rec is None:
        raise KeyError(f"unknown proc {proc_id}")
    return _stacks_of(rt, [(rec.rank, rec)], native, timeout)[0]
