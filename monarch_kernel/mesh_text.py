"""Small text helpers shared by the %mesh commands: one-line errors, sizes, states."""

from __future__ import annotations

from typing import Any

__all__ = ["one_line", "fmt_sizes", "proc_state", "actor_state"]


def one_line(e: BaseException, prefix: str) -> str:
    """`prefix: message` on one line (the message's own prefix not repeated)."""
    msg = " ".join(str(e).split())
    if msg.startswith(prefix.split(":")[0] + ":"):
        return msg
    return f"{prefix}: {msg}"


def fmt_sizes(sizes: dict) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in sizes.items()) + "}" if sizes else "{}"


def proc_state(rt: Any, pm: Any) -> str:
    counts: dict[str, int] = {}
    for p in pm.procs:
        state = rt.proc_state(p.proc_id) or "unknown"
        counts[state] = counts.get(state, 0) + 1
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))


def actor_state(rt: Any, am: Any) -> str:
    h = rt.health.mesh(am.health_name)
    if h is None:
        return "stopped" if am.stopped else "unknown"
    return h.state
