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
    #: for a handler blocked in a C call: its thread's stack with native frames (py-spy),
    #: or one line saying why there is none
    stack: tuple = ()


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


def _c_text(c: dict, mesh: str) -> str:
    """A handler blocked in a C call, in the user's words, and what can end it."""
    since = c.get("since")
    dur = f" for {max(0.0, time.time() - since):.1f} s" if isinstance(since, (int, float)) \
        else ""
    text = (f"it is blocked inside a C call ({c.get('kind') or 'C code'}){dur}: "
            f"{c.get('call') or 'a C function'} at {c.get('where') or '?'}")
    if c.get("from"):
        text += f", called from {c['from']}"
    return (text + "; not cancellable: a cancel or Ctrl-C reaches it only when that call "
            f"returns; kill() ends its proc (ActorMesh.kill(), %mesh kill {mesh})")


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
        c = (e.waits or {}).get("c")
        if isinstance(c, dict):
            line += "; " + _c_text(c, e.mesh)
        elif e.waits:
            line += f"; it waits on {_waits_text(e.waits, names)}"
        lines.append(line)
        if e.stack:
            lines.extend("    " + ln for ln in e.stack)
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


def diagnose(mesh: Any = None, stacks: bool = True, timeout: float = 5.0) -> Diagnosis:
    """Why the actors of `mesh` (an ActorMesh or ProcMesh; None: every mesh this process
    owns) are stuck, from their last heartbeats (within `heartbeat_interval`); with
    `stacks`, a handler blocked in a C call comes with its thread's native stack, taken by
    py-spy (at most `timeout` seconds)."""
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
    in_c: list = []  # (index in entries, proc record, thread ident) of handlers in C calls
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
            c = (waits or {}).get("c") if isinstance(waits, dict) else None
            proc = rt.state.proc(rec.proc_ids[rank]) if rank < len(rec.proc_ids) else None
            if stacks and isinstance(c, dict) and proc is not None:
                in_c.append((len(entries) - 1, proc, c.get("thread")))
    if in_c:
        _add_native_stacks(rt, entries, in_c, timeout)
    return Diagnosis(entries)


#: at most this many frames of a blocked handler's native stack are shown
STACK_FRAMES = 16


def _add_native_stacks(rt: Any, entries: list, in_c: list, timeout: float) -> None:
    """Give each entry of `in_c` its thread's stack with native frames (py-spy, through
    the proc's host agent, every proc at once), or the reason there is none."""
    import dataclasses

    from .proc_stacks import stacks_of_procs

    got: list = []  # a proc's stacks, or None
    try:
        got = stacks_of_procs(rt, [(p.rank, p) for _, p, _ in in_c], True, timeout)
    except Exception as e:  # noqa: BLE001 - a diagnosis without stacks still helps
        got = [None] * len(in_c)
        why = f"no native stack: {e}"
    for (i, _, ident), st in zip(in_c, got):
        if st is None:
            lines = [why]
        elif st.error:
            lines = [f"no native stack: {st.error}"]
        else:
            t = next((t for t in st.threads if t.thread_id == ident), None)
            if t is None:
                lines = ["no native stack: py-spy did not show its thread"]
            else:
                frames = t.format()[1:]
                lines = ["its thread, with native frames (py-spy, innermost first):"] + \
                    frames[:STACK_FRAMES] + (
                        [f"... {len(frames) - STACK_FRAMES} more frames (%mesh stacks "
                         "--native)"] if len(frames) > STACK_FRAMES else [])
        entries[i] = dataclasses.replace(entries[i], stack=tuple(lines))


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
            d = diagnose(stacks=False)  # no py-spy while the cell waits (%mesh why has it)
        except Exception:  # noqa: BLE001 - a diagnosis never breaks the wait
            self.told = True
            return
        if not d.entries and now - self.since < limit + 10:
            return  # nothing busy yet: the next heartbeats may say
        self.told = True
        print(f"[monarch] {fut.label or 'a call'} has waited {now - self.since:.0f} s; "
              f"why (runtime.diagnose(), %mesh why):\n{d}", file=sys.stderr, flush=True)


add_wait_hook(_StuckWatch())
