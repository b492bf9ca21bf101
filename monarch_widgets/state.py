"""The dashboard's compact state: a health snapshot as small JSON for the front-end.

Pure (no widgets, no I/O), so it is tested directly and its size measured for 1,000 actors.
Layout of the dict (arrays, not objects, per actor, to keep it small):
  {"v": version, "t": now, "notice": str, "active": [proc mesh name, ...],  # activated
   "procs": [[proc_id, host, pid, cpu_percent, rss_bytes, gpu_mem_bytes|null
              (, tensor_bytes: where the tensor engine runs in the proc)], ...],
   "texts": [str, ...],                     # interned error strings and tracebacks
   "meshes": [{"name", "proc_mesh", "state", "counts", "dims": [[dim, size], ...],
               "keep": lease seconds (0: not kept), "lease": its words ('' if not kept),
               "actors": [[rank, state_code, proc_index, endpoint|null, age_s,
                           handled, errors, error_text_index, traceback_text_index,
                           queued, waits_text_index], ...]}]}
  queued: messages waiting in the actor's mailbox; waits: what its running handler waits on
  (a call, a C call it is blocked in, a port; -1 when it runs code), as `runtime.diagnose`
  reads them from heartbeats. keep: a kept mesh's procs outlive this controller for
  `keep` seconds (the lease runs from when it goes away); lease: that in words, with when
  this controller reattached it (`fmt.lease_text`).
"""

from __future__ import annotations

import math
from typing import Any, Optional

from runtime.supervision.health import ActorState, MeshHealth

from .fmt import lease_text

__all__ = [
    "STATE_CODES", "STATE_NAMES", "MAX_ERROR_CHARS", "MAX_TRACEBACK_CHARS", "build_state",
    "grid_shape", "actor_at",
]

# state codes shared with static/dashboard.js
STATE_CODES: dict[ActorState, int] = {
    ActorState.STARTING: 0, ActorState.IDLE: 1, ActorState.BUSY: 2,
    ActorState.FAILED: 3, ActorState.STOPPED: 4, ActorState.PAUSED: 5,
}
STATE_NAMES: list[str] = [s.value for s, _ in sorted(STATE_CODES.items(), key=lambda x: x[1])]

MAX_ERROR_CHARS = 500
MAX_TRACEBACK_CHARS = 4000


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return "... (clipped)\n" + text[-limit:]


def build_state(snapshot: list[MeshHealth], *, version: int = 0, now: float = 0.0,
                notice: str = "", active: tuple = ()) -> dict[str, Any]:
    """The JSON-able dashboard state of `snapshot`."""
    procs: list[list[Any]] = []
    proc_index: dict[str, int] = {}
    texts: list[str] = []
    text_index: dict[str, int] = {}

    def intern(text: Optional[str], limit: int) -> int:
        if not text:
            return -1
        text = _clip(text, limit)
        i = text_index.get(text)
        if i is None:
            i = text_index[text] = len(texts)
            texts.append(text)
        return i

    stats = {p.proc_id: p for m in snapshot for p in m.procs}
    meshes = []
    for m in snapshot:
        actors = []
        for a in m.actors:
            pi = proc_index.get(a.proc_id, -1)
            if pi < 0 and a.proc_id:
                pi = proc_index[a.proc_id] = len(procs)
                st = stats.get(a.proc_id)
                if st is not None:
                    procs.append([a.proc_id, st.host or a.host, st.pid or a.pid,
                                  round(st.cpu_percent, 1), st.rss_bytes, st.gpu_mem_bytes])
                    if st.tensor_bytes is not None:
                        procs[-1].append(st.tensor_bytes)
                else:
                    procs.append([a.proc_id, a.host, a.pid, None, None, None])
            actors.append([a.rank, STATE_CODES[a.state], pi, a.endpoint,
                           round(now - a.since, 1), a.handled, a.errors,
                           intern(a.last_error, MAX_ERROR_CHARS),
                           intern(a.last_traceback, MAX_TRACEBACK_CHARS), a.queued,
                           intern(a.waits, MAX_ERROR_CHARS)
                           if a.state in (ActorState.BUSY, ActorState.PAUSED) else -1])
        meshes.append({"name": m.name, "proc_mesh": m.proc_mesh, "state": m.state,
                       "counts": m.counts(), "dims": [[k, int(v)] for k, v in m.sizes.items()],
                       "keep": m.keep, "lease": lease_text(m.keep, m.reattached),
                       "actors": actors})
    # age_s: seconds in the current state at `t` (relative, so it stays short)
    return {"v": version, "t": round(now, 2), "notice": notice, "active": list(active),
            "procs": procs,
            "texts": texts, "meshes": meshes}


def grid_shape(dims: list[list[Any]], n_actors: int, max_cols: int = 32) -> tuple[int, int]:
    """(rows, cols) of a mesh's grid: the last dimension across, the others down.

    A 1-D mesh wider than `max_cols` wraps into a near-square block instead."""
    sizes = [int(s) for _, s in dims] or [n_actors]
    cols = sizes[-1] if sizes[-1] > 0 else 1
    if len(sizes) == 1 and cols > max_cols:
        cols = min(max_cols, math.ceil(math.sqrt(cols)) * 2)
    rows = max(1, math.ceil(max(n_actors, 1) / cols))
    return rows, cols


def actor_at(state: dict[str, Any], mesh: str, rank: int) -> Optional[dict[str, Any]]:
    """The decoded record of one actor of a built state (what the detail pane shows)."""
    for m in state["meshes"]:
        if m["name"] != mesh:
            continue
        for a in m["actors"]:
            if a[0] == rank:
                proc = state["procs"][a[2]] if a[2] >= 0 else None
                return {"mesh": mesh, "rank": rank, "state": STATE_NAMES[a[1]],
                        "proc": proc, "endpoint": a[3], "since": state["t"] - a[4], "handled": a[5],
                        "errors": a[6],
                        "last_error": state["texts"][a[7]] if a[7] >= 0 else None,
                        "last_traceback": state["texts"][a[8]] if a[8] >= 0 else None,
                        "queued": a[9],
                        "waits": state["texts"][a[10]] if a[10] >= 0 else None}
    return None
