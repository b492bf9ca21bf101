"""Why is it stuck? (`runtime.diagnose`, `%mesh why`): for each actor that is busy or has
messages waiting, in the user's words, what it runs, for how long, what waits behind it and
what its handler waits on, and the cycles that cannot resolve, with what would fix them.

Built from each actor's last heartbeat (`ActorMeshRecord.diag`: its state, endpoint, the
messages in its mailbox, and what its thread is blocked on: a call, with its actor mesh and
ranks, or another future). `explain` is pure logic, tested directly.

Layer 7 (user API): imports _core and the basics.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

from .._core import get_runtime
from ..config import config
from ..future import add_wait_hook

__all__ = ["Diagnosis", "Stuck", "diagnose", "explain"]


@dataclass(frozen=True)
class Stuck:
    """One actor that is busy or has messages waiting, as its last heartbeat said."""

    mesh: str
    actor_id: str
    rank: int
    state: str
    endpoint: str
    busy_s: float
    queued: int
    waits: Optional[dict]


def _waits_text(w: dict, names: dict) -> str:
    if "actor" in w:
        ranks = w.get("ranks") or []
        who = names.get(w["actor"], w.get("mesh", "?"))
        r = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
        return f"a call {w.get('label') or ''} to {who} {r}".replace("  ", " ")
    label = w.get("label") or "a future"
    if label == "PortReceiver.recv":
        return "a value on a Channel port (recv) that nothing has sent yet"
    return label


def _targets(e: Stuck) -> list[tuple[str, int]]:
    w = e.waits
    if not w or "actor" not in w:
        return []
    return [(w["actor"], r) for r in w.get("ranks") or []]


_FIX = ("make it an async @concurrent_endpoint that awaits the call (the actor takes other "
        "messages while it awaits; a plain async endpoint does not), or call an actor that is "
        "not waiting on it")


def explain(entries: list[Stuck]) -> str:
    """The diagnosis text for these actors (pure): a line each, then the cycles."""
    if not entries:
        return "nothing is stuck: no actor of these meshes is busy or has messages waiting"
    names = {e.actor_id: e.mesh for e in entries}
    lines = []
    for e in entries:
        what = (f"running {e.endpoint}() for {e.busy_s:.1f} s" if e.state == "busy"
                else f"{e.state}")
        line = f"{e.mesh} rank {e.rank}: {what}"
        if e.queued:
            line += f"; {e.queued} message(s) wait behind it"
        if e.waits:
            line += f"; it waits on {_waits_text(e.waits, names)}"
        lines.append(line)
    by_key = {(e.actor_id, e.rank): e for e in entries}
    seen: set = set()
    for e in entries:
        me = (e.actor_id, e.rank)
        for t in _targets(e):
            if t == me:
                lines.append(
                    f"cycle: {e.mesh} rank {e.rank}'s {e.endpoint}() calls its own actor, "
                    "which runs one message at a time: that call waits behind the handler "
                    f"that waits for it. Fix: {_FIX}.")
                continue
            other = by_key.get(t)
            if other is None or me not in _targets(other):
                continue
            pair = frozenset((me, t))
            if pair in seen:
                continue
            seen.add(pair)
            lines.append(
                f"cycle: {e.mesh} rank {e.rank}'s {e.endpoint}() waits on {other.mesh} rank "
                f"{other.rank}, whose {other.endpoint}() waits on {e.mesh} rank {e.rank}: each "
                f"waits for the other. Fix: {_FIX}.")
    return "\n".join(lines)


class Diagnosis:
    """What `diagnose` found; `str()` is the text `%mesh why` prints."""

    def __init__(self, entries: list[Stuck]) -> None:
        self.entries = entries
        self.text = explain(entries)

    @property
    def cycles(self) -> list[str]:
        """The lines that name a cycle that cannot resolve."""
        return [ln for ln in self.text.splitlines() if ln.startswith("cycle:")]

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"<Diagnosis: {len(self.entries)} actor(s) busy or waiting>"


def diagnose(mesh: Any = None) -> Diagnosis:
    """Why the actors of `mesh` (an ActorMesh or ProcMesh; None: every mesh this process
    owns) are stuck, from their last heartbeats (within `heartbeat_interval`)."""
    rt = get_runtime()
    procs: Optional[set] = None
    only: Optional[str] = None  # an actor mesh's key in the health model
    if mesh is not None:
        from .actor_mesh import ActorMesh
        from .proc_mesh import ProcMesh

        if isinstance(mesh, ActorMesh):
            only = mesh.health_name
        elif isinstance(mesh, ProcMesh):
            procs = {p.proc_id for p in mesh.procs}
        else:
            raise TypeError(f"diagnose() takes an ActorMesh or a ProcMesh, not "
                            f"{type(mesh).__name__}")
    now = time.time()
    entries = []
    for rec in rt.state.actor_meshes.values():
        if rec.stopped or (only is not None and rec.health_name != only) or \
                (procs is not None and not procs.intersection(rec.proc_ids)):
            continue
        for rank, (state, endpoint, since, queued, waits) in sorted(dict(rec.diag).items()):
            if rank in rec.failed or (state != "busy" and not queued):
                continue
            name = f"{rec.serves} (a %%mesh cell)" if rec.internal and rec.serves else rec.name
            entries.append(Stuck(name, rec.actor_id, rank, state, endpoint or "",
                                 max(0.0, now - since) if since else 0.0, queued or 0, waits))
    return Diagnosis(entries)


class _StuckWatch:
    """A wait hook (`future.add_wait_hook`: every 0.1 s of a wait): when the main thread
    (a notebook cell, a script) has waited on one call for `stuck_after` seconds, print
    the diagnosis once to stderr (under the cell), as soon as it finds something busy
    (the heartbeats that say so come every `heartbeat_interval`)."""

    def __init__(self) -> None:
        self.fut: Any = None
        self.since = 0.0
        self.told = False

    def __call__(self, fut: Any) -> None:
        if threading.current_thread() is not threading.main_thread() or not fut.reply_ports:
            return
        limit = config.stuck_after
        if not limit:
            return
        now = time.monotonic()
        if fut is not self.fut:
            self.fut, self.since, self.told = fut, now, False
            return
        if self.told or now - self.since < limit:
            return
        try:
            d = diagnose()
        except Exception:  # noqa: BLE001 - a diagnosis never breaks the wait
            self.told = True
            return
        if not d.entries and now - self.since < limit + 10:
            return  # nothing busy yet: the next heartbeats may say
        self.told = True
        print(f"[monarch] {fut.label or 'a call'} has waited {now - self.since:.0f} s; "
              f"why (runtime.diagnose(), %mesh why):\n{d}", file=sys.stderr, flush=True)


add_wait_hook(_StuckWatch())
