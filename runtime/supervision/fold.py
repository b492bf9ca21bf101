"""Folding failure reports: the same failure on N ranks is reported once, naming the ranks.

Pure logic (no I/O): the default fault hook and `SupervisionError` messages use it.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

__all__ = ["compress_ranks", "ranks_phrase", "failure_key", "group", "folded_report", "late_line"]


def compress_ranks(ranks: Iterable[int]) -> str:
    """`[0, 1, 2, 5, 7, 8]` -> `"0-2, 5, 7-8"`."""
    rs = sorted(set(ranks))
    if not rs:
        return ""
    parts: list[str] = []
    start = prev = rs[0]
    for r in rs[1:]:
        if r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}-{prev}" if prev > start else f"{start}")
        start = prev = r
    parts.append(f"{start}-{prev}" if prev > start else f"{start}")
    return ", ".join(parts)


def ranks_phrase(ranks: Iterable[int]) -> str:
    """`rank 3` or `ranks 0-2, 5`."""
    rs = sorted(set(ranks))
    return f"rank{'s' if len(rs) > 1 else ''} {compress_ranks(rs)}"


def failure_key(f: Any) -> tuple:
    """What makes two MeshFailures 'the same failure' on different ranks: the mesh, the
    cause, the traceback and how the process ended (not host, pid or stderr)."""
    return (f.mesh, f.internal, f.cause, f.traceback, f.signal, f.exit_code)


def group(failures: Sequence[Any]) -> list[list[Any]]:
    """The failures grouped by `failure_key`, in order of first arrival."""
    groups: dict[tuple, list[Any]] = {}
    for f in failures:
        groups.setdefault(failure_key(f), []).append(f)
    return list(groups.values())


def _ranks_of(members: Sequence[Any]) -> list[int]:
    return sorted({r for f in members for r in f.ranks})


def folded_report(members: Sequence[Any]) -> str:
    """One report for the same failure on several ranks: a line naming the ranks and where
    they ran, then the report of the lowest rank."""
    members = sorted(members, key=lambda f: min(f.ranks, default=0))
    first = members[0]
    if len(members) == 1:
        return first.report()
    hosts: dict[str, list[str]] = {}
    for f in members:
        if f.host or f.pid:
            hosts.setdefault(f.host or "?", []).append(str(f.pid))
    where = "; ".join(f"host {h}: pids {', '.join(p)}" for h, p in hosts.items())
    return (f"the same failure on {ranks_phrase(_ranks_of(members))} of {first.mesh!r}"
            + (f" ({where})" if where else "")
            + f"; the report of rank {min(first.ranks, default=0)}:\n{first.report()}")


def late_line(f: Any, earlier: Sequence[Any]) -> str:
    """One line for a failure that matches a report already printed."""
    where = f" (host {f.host}, pid {f.pid})" if f.host or f.pid else ""
    return (f"mesh {f.mesh!r} {ranks_phrase(f.ranks)}{where} failed too, the same failure "
            f"as {ranks_phrase(_ranks_of(earlier))} above")
