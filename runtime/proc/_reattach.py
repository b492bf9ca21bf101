"""A kept proc passes to a new controller (Kind.REATTACH, sent by
`runtime._meshes.reattach` after the host agent accepted that controller): from then on the
proc and the actors the old controller spawned report to the new one, which hears of the
actors (classes pickled where they can be) and of the old controller's calls lost with it.

Layer 6 (process roles, under `proc`); runs on the proc's I/O thread.
"""

from __future__ import annotations

import collections
import os
import pickle
import time
from typing import Any

from ..transport.framing import Header, Kind

__all__ = ["on_reattach", "lost_calls"]


def on_reattach(server: Any, h: Header) -> None:
    """Make `h.extra["owner"]` this proc's owner and answer with its actors and lost calls."""
    import cloudpickle

    rt = server.rt
    e = h.extra or {}
    old, new = rt.owner_address, str(e.get("owner") or h.reply)
    since = time.monotonic() - float(e.get("silent_for") or 0.0)
    actors, lost = [], []
    for a in list(server.actors.values()):
        if a.owner_addr != old:  # spawned by an actor, which stays its owner
            continue
        a.owner_addr = new
        cls = type(a.instance) if a.instance is not None else None
        try:
            pickled = cloudpickle.dumps(cls) if cls is not None else b""
        except Exception:  # noqa: BLE001 - the controller falls back to endpoint names
            pickled = b""
        actors.append({"actor_id": a.actor_id, "name": a.name, "rank": a.rank,
                       "labels": list(a.shape.labels), "sizes": list(a.shape.sizes_),
                       "cls": a.class_name, "qcls": a.qualified_class, "state": a.state,
                       "failed": a.failed, "endpoints": sorted(a.endpoints),
                       "pickled": pickled})
        lost += [{"mesh": a.name, "rank": a.rank, **c}
                 for c in lost_calls(a, old, since, bool(e.get("old_alive")))]
    rt.owner_address = new
    answer = {"pid": os.getpid(), "tcp": rt.tcp_address, "actors": actors, "lost": lost}
    rt.send(h.reply, Header(Kind.REPLY, port=h.port), pickle.dumps(answer))


def lost_calls(a: Any, old_owner: str, since: float, old_alive: bool = False) -> list:
    """The calls of `old_owner` (a controller gone, or taken over while `old_alive`) to
    actor `a` whose answers the new controller will not see: still waiting or running, and,
    when the old one is gone, ended after `since` (time.monotonic(), when it was last heard:
    within a heartbeat interval of its end, it may not have read the answer); a live old
    controller has the answers of the calls that ended. Each is reported once."""
    lost = []
    for key, (method, reply) in list(a.calls_open.items()):
        if reply == old_owner:
            a.calls_open.pop(key, None)
            running = a.state == "busy" and a.endpoint == method
            lost.append({"endpoint": method, "state": "running" if running else "queued"})
    done, a.calls_done = a.calls_done, collections.deque(maxlen=256)
    for method, reply, ended in done:
        if reply == old_owner and ended >= since and not old_alive:
            lost.append({"endpoint": method, "state": "finished"})
    return lost
