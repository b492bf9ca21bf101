"""Reading the procs' log files through their host agents (`runtime.read_logs`, `Job.logs`,
`%mesh logs`): each agent is asked once (`Kind.AGENT_QUERY`, op "logs") and answers from
the files it wrote (runtime/host/logfiles.py), also for procs that have exited and from a
controller that was not the one that spawned them (after `Job.load()`)."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Union

from .._core import AgentRecord, Runtime, get_runtime
from ..transport.framing import ERROR, Header, Kind
from .questions import Questions

__all__ = ["ProcLog", "ProcLogs", "read_logs"]


@dataclass
class ProcLog:
    """The lines one proc wrote to its log file (rotated files included, oldest first)."""

    host: str
    mesh: str
    rank: int
    pid: int
    start: str  # local start time, YYYYmmddTHHMMSS
    path: str  # the current file, on `host`
    lines: list[str] = field(default_factory=list)
    truncated: bool = False  # older lines were left out (the reply's size cap)
    left_out: int = 0  # earlier lines `tail` left out

    def __str__(self) -> str:
        head = f"== {self.mesh} rank {self.rank} (pid {self.pid}, {self.host}, " \
               f"started {self.start}) {self.path}"
        if self.left_out:
            head += f" [{self.left_out} earlier lines left out]"
        elif self.truncated:
            head += " [older lines left out]"
        return "\n".join([head] + self.lines)


class ProcLogs(list):
    """A list of `ProcLog`, by rank then start time; `.lines` joins their lines, `.errors`
    names the hosts that did not answer."""

    errors: list[str]

    def __init__(self, items: Iterable[ProcLog] = (), errors: Optional[list[str]] = None):
        super().__init__(items)
        self.errors = list(errors or [])

    @property
    def left_out(self) -> int:
        """Lines `tail` left out, over every proc."""
        return sum(p.left_out for p in self)

    @property
    def lines(self) -> list[str]:
        """Every line of every proc, in the list's order."""
        return [ln for p in self for ln in p.lines]

    def __str__(self) -> str:
        parts = [str(p) for p in self] or ["(no log files)"]
        return "\n".join(parts + [f"!! {e}" for e in self.errors])


def _agents_of(where: Any) -> tuple[list[AgentRecord], Optional[str], Runtime]:
    from .host_mesh import HostMesh, host_runtime, view_agents
    from .proc_mesh import ProcMesh, all_procs, runtime_of

    items = where if isinstance(where, (list, tuple)) else [where]
    agents: dict[str, AgentRecord] = {}
    name: Optional[str] = None
    rt: Optional[Runtime] = None
    for w in items:
        if isinstance(w, ProcMesh):
            name = name or w.name
            rt = runtime_of(w)
            for rec in all_procs(w):
                if rec.agent is None:
                    raise ValueError(f"proc mesh {w.name!r} runs in this process "
                                     "(this_proc()): it has no host agent and no log file")
                agents.setdefault(rec.agent.address, rec.agent)
        elif isinstance(w, HostMesh):
            rt = host_runtime(w)
            for a in view_agents(w):
                agents.setdefault(a.address, a)
        else:
            raise TypeError(f"read_logs: expected a ProcMesh or HostMesh (or a list of them), "
                            f"got {type(w).__name__}")
    return list(agents.values()), name, rt or get_runtime()


def _decode(h: Header, body: Any) -> dict:
    text = bytes(body)
    if h.status == ERROR:
        raise ValueError(text.decode("utf-8", "replace"))
    return json.loads(text)


def read_logs(where: Union[Any, list], mesh: Optional[str] = None, rank: Optional[int] = None,
              tail: Optional[int] = None, grep: Optional[str] = None,
              timeout: float = 10.0) -> ProcLogs:
    """The log files of proc mesh `mesh` (a name; default: `where`'s own name when it is
    a ProcMesh) on the hosts of `where` (a ProcMesh, HostMesh or a list of them), read by
    their host agents: every rank or rank `rank`, lines matching regular expression `grep`,
    the last `tail` lines of each proc. Hosts that do not answer within `timeout` seconds
    are named in `.errors` (a warning); a bad `grep` raises ValueError."""
    agents, own_name, rt = _agents_of(where)
    name = mesh if mesh is not None else own_name
    if not isinstance(name, str) or not name:
        raise ValueError("read_logs: give the proc mesh's name (mesh=...)")
    if tail is not None and (isinstance(tail, bool) or int(tail) < 0):
        raise ValueError(f"tail must be a non-negative int, got {tail!r}")
    query = {"op": "logs", "mesh": name, "rank": None if rank is None else int(rank),
             "tail": None if tail is None else int(tail), "grep": grep or None}
    questions: Questions[AgentRecord] = Questions(rt)
    for a in agents:
        if a.alive:
            def send(port: int, address: str = a.address) -> None:
                rt.send(address, Header(Kind.AGENT_QUERY, reply=rt.reply_address_for(address),
                                        port=port, extra=query))

            questions.ask(a, f"logs from {a.label or a.address}", send, _decode)
    errors = [f"host agent {a.address}: not running" for a in agents if not a.alive]
    out: list[ProcLog] = []
    for agent, r, err in questions.answers(timeout):
        if isinstance(err, TimeoutError):
            errors.append(f"host agent {agent.label or agent.address}: no answer within "
                          f"{timeout:g} s")
            continue
        if err is not None:
            questions.close()
            raise ValueError(f"read_logs: {err}") from None
        for p in r["procs"]:
            out.append(ProcLog(agent.name or r["host"], p["mesh"], p["rank"], p["pid"], p["start"],
                               f"{r['dir']}/{p['mesh']}.{p['rank']}.{p['pid']}.{p['start']}.log",
                               p["lines"], p["truncated"], int(p.get("left_out", 0))))
    if errors:
        warnings.warn("read_logs: " + "; ".join(errors), stacklevel=2)
    out.sort(key=lambda p: (p.rank, p.start, p.host, p.pid))
    return ProcLogs(out, errors)
