"""Aggregation of proc output lines (`ProcMesh.logging_option(aggregate_window_sec=...)`).

Pure: no I/O, no clock (callers pass `now`). Within a window, lines of one mesh and stream
that are identical or near-identical (normalized edit distance at most `threshold`, as
Monarch's aggregator) are grouped; `flush()` returns one line per group:

    [16 similar log lines] [trainers 0-15] loss 0.13

(Monarch's `[16 similar log lines]` prefix, then the ranks the line came from.)

A group seen from a single rank once is returned as an ordinary line of that rank.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

__all__ = ["MAX_FUZZY_LEN", "edit_distance", "similar", "format_ranks", "Aggregator"]

#: Lines longer than this are grouped only when identical (the edit distance is quadratic).
MAX_FUZZY_LEN = 400


def edit_distance(a: str, b: str, limit: Optional[int] = None) -> int:
    """Levenshtein distance of `a` and `b`; stops early and returns `limit + 1` once every
    alignment costs more than `limit`."""
    if a == b:
        return 0
    if len(a) < len(b):
        a, b = b, a
    if limit is not None and len(a) - len(b) > limit:
        return limit + 1
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        if limit is not None and min(cur) > limit:
            return limit + 1
        prev = cur
    return prev[-1]


def similar(a: str, b: str, threshold: float = 0.15) -> bool:
    """True when the edit distance of `a` and `b` is at most `threshold` of the longer one."""
    if a == b:
        return True
    longest = max(len(a), len(b))
    if longest > MAX_FUZZY_LEN:
        return False
    limit = int(threshold * longest)
    return edit_distance(a, b, limit) <= limit


def format_ranks(ranks: list[int]) -> str:
    """Sorted ranks with runs collapsed: [0, 1, 2, 3, 7, 9, 10] -> '0-3,7,9-10'."""
    out: list[str] = []
    rs = sorted(set(ranks))
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(out)


@dataclass
class _Group:
    text: str  # the first line of the group, shown
    ranks: list[int] = field(default_factory=list)
    count: int = 0


@dataclass
class _Window:
    start: float
    length: float
    groups: list[_Group] = field(default_factory=list)


class Aggregator:
    """Groups lines per (mesh label, stream) within each window; `due(now)` says which
    windows have ended, `flush(key)` returns their lines as (prefix, stream, text)."""

    def __init__(self, threshold: float = 0.15, max_groups: int = 1000) -> None:
        self.threshold = threshold
        self.max_groups = max_groups
        self._windows: dict[tuple[str, str], _Window] = {}

    def add(self, label: str, stream: str, rank: int, line: str, now: float,
            window: float) -> bool:
        """Add one line (without its newline) of `label`'s rank `rank`. True when this line
        opened a new window (the caller then arranges a flush `window` s later)."""
        key = (label, stream)
        w = self._windows.get(key)
        opened = w is None
        if w is None:
            w = self._windows[key] = _Window(now, window)
        for g in reversed(w.groups):  # recent groups first: repeated lines match quickly
            if similar(g.text, line, self.threshold):
                break
        else:
            if len(w.groups) >= self.max_groups:  # a flood of distinct lines: keep the last
                g = w.groups[-1]
            else:
                g = _Group(line)
                w.groups.append(g)
        g.ranks.append(rank)
        g.count += 1
        return opened

    def due(self, now: float) -> list[tuple[str, str]]:
        """The keys whose window has ended."""
        return [k for k, w in self._windows.items() if now - w.start >= w.length]

    def keys(self, label: Optional[str] = None) -> list[tuple[str, str]]:
        """Keys with lines waiting (of one mesh label, or all)."""
        return [k for k in self._windows if label is None or k[0] == label]

    def flush(self, key: tuple[str, str]) -> list[tuple[str, str, str]]:
        """The grouped lines of one key as (prefix, stream, text), and forget them."""
        w = self._windows.pop(key, None)
        if w is None:
            return []
        label, stream = key
        out = []
        for g in w.groups:
            if g.count == 1:
                out.append((f"{label} {g.ranks[0]}", stream, g.text + "\n"))
            else:
                who = f"{label} {format_ranks(g.ranks)}"
                out.append((f"{g.count} similar log lines", stream, f"[{who}] {g.text}\n"))
        return out
