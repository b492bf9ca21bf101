"""Reading what a mesh's procs did over time (`runtime.read_timeline`, `%mesh timeline`):
each proc is asked once (`Kind.TIMELINE`, answered on its I/O thread from its ring,
runtime/timeline.py), like `rt.dump_stack`; a proc that does not answer within the timeout
(dead, or its GIL held by C code) gets an empty lane naming why."""

from __future__ import annotations

from typing import Any

from .._core import get_runtime
from ..timeline import Lane, Timeline, decode, make_timeline, now_ns
from ..transport.framing import Header, Kind
from .proc_mesh import runtime_of, view_procs
from .questions import Questions

__all__ = ["proc_mesh_of", "read_timeline"]


def proc_mesh_of(mesh: Any) -> Any:
    """The ProcMesh of `mesh` (a ProcMesh, or an ActorMesh's proc mesh)."""
    from .actor_mesh import ActorMesh
    from .proc_mesh import ProcMesh

    if isinstance(mesh, ActorMesh):
        if mesh.proc_mesh is None:
            raise ValueError(f"actor mesh {mesh.name!r} has no proc mesh here")
        return mesh.proc_mesh
    if isinstance(mesh, ProcMesh):
        return mesh
    raise TypeError(f"read_timeline: expected a ProcMesh or ActorMesh, got {type(mesh).__name__}")


def _decode(h: Header, body: Any) -> dict:
    try:
        return decode(bytes(body))
    except Exception as e:  # noqa: BLE001 - the lane says so
        raise ValueError(f"bad timeline reply: {e}") from None


def read_timeline(mesh: Any, last: float = 300.0, timeout: float = 10.0) -> Timeline:
    """The endpoint calls and spans of `mesh`'s procs (a ProcMesh or ActorMesh; every
    rank of its view) that ended in the last `last` seconds, a lane per rank; a proc that
    does not answer within `timeout` seconds has an empty lane with the reason."""
    if isinstance(last, bool) or not isinstance(last, (int, float)) or last <= 0:
        raise ValueError(f"last must be a positive number of seconds, got {last!r}")
    pm = proc_mesh_of(mesh)
    rt = runtime_of(pm) or get_runtime()
    end = now_ns()
    since = end - int(last * 1e9)
    lanes: list[Lane] = []
    questions: Questions[Lane] = Questions(rt)
    for rank, rec in enumerate(view_procs(pm)):
        lane = Lane(pm.name, rank, rec.place, rec.pid, rec.proc_id)
        lanes.append(lane)
        if rec.state in ("failed", "stopped"):
            lane.error = f"proc {rec.state}"
            continue

        def send(port: int, rec: Any = rec) -> None:
            reply = rt.reply_address_for(rec.address or (rec.agent.address if rec.agent else ""))
            rt.send_to_proc(rec.address, rec.route, Header(Kind.TIMELINE, reply=reply, port=port,
                                                            extra={"since": since}))

        questions.ask(lane, f"timeline of {rec.proc_id}", send, _decode, watch=[rec.proc_id])
    for lane, got, err in questions.answers(timeout):
        if isinstance(err, TimeoutError):
            lane.error = f"no answer within {timeout:g} s"
        elif err is not None:  # a dead proc: its lane says so
            lane.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        else:
            lane.pid = got.get("pid", lane.pid)
            lane.records = got["records"]
    return make_timeline(pm.name, lanes, last, end)
