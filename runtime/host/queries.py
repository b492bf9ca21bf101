"""Questions a controller asks a host agent (`Kind.AGENT_QUERY`), answered on a thread of
their own with one REPLY to the asking port: JSON, status ERROR with the message when the
question cannot be answered.

- `{"op": "logs", "mesh": M, "rank": R | None, "tail": N | None, "grep": PAT | None}`:
  the log files of mesh `M`'s procs on this host (`logfiles.read`), as
  `{"host", "dir", "procs": [{mesh, rank, pid, start, lines, truncated}]}`.
- `{"op": "stacks", "proc": PROC_ID, "native": bool, "timeout": S, "py_spy": PATH | None}`:
  that proc's threads taken from outside by py-spy (`runtime.stacks.run_py_spy`), as
  `{"host", "pid", "native", "py_spy", "threads": [py-spy's JSON threads]}`.
"""

from __future__ import annotations

import json
import logging
import re
import socket
from typing import Any, Mapping, Protocol

from ..transport.framing import ERROR, OK, Header, Kind
from .. import stacks
from . import logfiles
from .output import ProcPipes

__all__ = ["QueriedAgent", "answer"]

log = logging.getLogger("runtime.host")


class QueriedAgent(Protocol):
    """What a question reads of the host agent it asks (`agent.Agent`, which answers on a
    thread of its own): its log files, its procs, and sending the reply."""

    @property
    def logs(self) -> logfiles.AgentLogs: ...

    @property
    def procs(self) -> Mapping[str, ProcPipes]: ...

    def send(self, addr: str, h: Header, body: bytes = b"") -> None: ...


def _logs(agent: QueriedAgent, q: dict) -> dict[str, Any]:
    rank, tail, grep = q.get("rank"), q.get("tail"), q.get("grep")
    if grep:
        re.compile(grep)  # a bad pattern is the caller's error (ValueError below)
    d = agent.logs.dir  # None: this agent has written no log file
    procs = logfiles.read(d, str(q.get("mesh", "")), None if rank is None else int(rank),
                          None if tail is None else int(tail), grep) if d is not None else []
    return {"host": socket.gethostname(), "dir": str(d or ""), "procs": procs}


def _stacks(agent: QueriedAgent, q: dict) -> dict[str, Any]:
    proc_id = str(q.get("proc", ""))
    pp = agent.procs.get(proc_id)
    if pp is None:
        raise ValueError(f"no running proc {proc_id!r} on this host")
    got = stacks.run_py_spy(pp.pid, bool(q.get("native")), float(q.get("timeout") or 10.0),
                            q.get("py_spy") or None)
    return {"host": socket.gethostname(), **got}


_OPS = {"logs": _logs, "stacks": _stacks}


def answer(agent: QueriedAgent, h: Header) -> None:
    """Answer query `h` (any thread): the REPLY goes to `h.reply`, port `h.port`."""
    q = h.extra or {}
    status, body = OK, b""
    try:
        fn = _OPS.get(q.get("op", ""))
        if fn is None:
            raise ValueError(f"unknown agent query {q.get('op')!r}; known: {sorted(_OPS)}")
        body = json.dumps(fn(agent, q)).encode()
    except (ValueError, TypeError, re.error, OSError, stacks.StacksError) as e:
        status, body = ERROR, f"{type(e).__name__}: {e}".encode()
    except Exception as e:  # noqa: BLE001 - the asker gets it rather than a timeout
        log.exception("agent query failed")
        status, body = ERROR, f"{type(e).__name__}: {e}".encode()
    if h.reply and h.port:
        agent.send(h.reply, Header(Kind.REPLY, port=h.port, status=status), body)
