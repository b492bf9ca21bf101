"""What each proc did over time: endpoint calls and user spans, recorded in a ring per
process (`MONARCH_TIMELINE_RECORDS` entries, oldest dropped), read by the controller
(`runtime.read_timeline`) and drawn by `%mesh timeline`, or saved as a Chrome trace.

A record is a tuple `(start_ns, end_ns, kind, name, actor, rank, failed)`: wall-clock
nanoseconds (`time.time_ns`, so procs of one host line up), kind "call" or "span", the
endpoint's or span's name, the actor mesh's name and rank ("" and -1 for a span outside an
actor) and whether it raised. Appending a tuple to a bounded `deque` is atomic under the
GIL, so any thread records without a lock. Layer 1 (basics).
"""

from __future__ import annotations

import collections
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import msgspec

from ._base.context import get_context
from .config import config

__all__ = [
    "Record", "now_ns", "reset", "record_call", "record_span", "snapshot", "encode", "decode",
    "capacity", "Lane", "Timeline", "make_timeline",
]

Record = tuple  # (start_ns, end_ns, kind, name, actor, rank, failed)

_ring: collections.deque = collections.deque(maxlen=max(0, int(config.timeline_records)))
now_ns = time.time_ns


def reset(capacity: Optional[int] = None) -> None:
    """Empty this process's ring (and resize it: `capacity` records, 0 records nothing);
    a proc calls it after its fork, so it starts with no record of its zygote's."""
    global _ring
    n = config.timeline_records if capacity is None else capacity
    if isinstance(n, bool) or int(n) < 0:
        raise ValueError(f"timeline capacity must be a non-negative int, got {n!r}")
    _ring = collections.deque(maxlen=int(n))


def record_call(start_ns: int, name: str, actor: str, rank: int, failed: bool) -> None:
    """An endpoint call that started at `start_ns` ends now (the proc's hook)."""
    _ring.append((start_ns, now_ns(), "call", name, actor, rank, failed))


def record_span(start_ns: int, name: str, failed: bool) -> None:
    """A user span (`runtime.span`, `@traced`) that started at `start_ns` ends now."""
    ctx = get_context()
    if ctx is None:
        _ring.append((start_ns, now_ns(), "span", name, "", -1, failed))
    else:
        _ring.append((start_ns, now_ns(), "span", name, ctx.name, ctx.rank.rank, failed))


def snapshot(since_ns: int = 0) -> list[Record]:
    """The records of this process that ended at or after `since_ns`, oldest first."""
    for _ in range(5):
        try:
            items = list(_ring)
            break
        except RuntimeError:  # appended to while copied (another thread): copy again
            continue
    else:
        return []
    return [r for r in items if r[1] >= since_ns]


def encode(since_ns: int = 0) -> bytes:
    """This process's records ending at or after `since_ns`, for the controller (msgpack:
    `{"pid", "capacity", "records"}`)."""
    return msgspec.msgpack.encode({"pid": os.getpid(), "capacity": capacity(),
                                   "records": snapshot(since_ns)})


def decode(data: bytes) -> dict[str, Any]:
    """What `encode` made, records as tuples."""
    d = msgspec.msgpack.decode(data)
    d["records"] = [tuple(r) for r in d["records"]]
    return d


def capacity() -> int:
    """How many records this process's ring holds at most."""
    return int(_ring.maxlen or 0)


@dataclass
class Lane:
    """One proc's records: `mesh` rank `rank`, on `host` as `pid`."""

    mesh: str
    rank: int
    host: str = ""
    pid: int = 0
    proc_id: str = ""
    records: list[Record] = field(default_factory=list)
    error: str = ""  # why this proc's records are missing (it did not answer)


@dataclass
class Timeline:
    """The records of a mesh's procs, a lane per rank (`read_timeline`'s result); draw it
    with `monarch_widgets.timeline_html`, save it with `save_chrome_trace`."""

    mesh: str
    lanes: list[Lane]
    start_ns: int
    end_ns: int

    @property
    def records(self) -> list[Record]:
        """Every lane's records, lane after lane."""
        return [r for lane in self.lanes for r in lane.records]

    def to_chrome_trace(self) -> dict[str, Any]:
        """The Chrome trace event format (JSON object form), which chrome://tracing and
        Perfetto (ui.perfetto.dev) open: a process per proc, a complete event ("X") per
        record, microseconds since the timeline's start (or its first record's, if earlier)."""
        events: list[dict[str, Any]] = []
        base = min([self.start_ns] + [r[0] for r in self.records])  # no negative time
        for i, lane in enumerate(self.lanes):
            pid = lane.pid or i + 1
            events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                           "args": {"name": f"{lane.mesh}[{lane.rank}] {lane.host}".strip()}})
            events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                           "args": {"sort_index": lane.rank}})
            for start, end, kind, name, actor, rank, failed in lane.records:
                ev: dict[str, Any] = {
                    "name": name, "cat": kind, "ph": "X", "pid": pid,
                    "tid": 1 if kind == "call" else 2,
                    "ts": (start - base) / 1000.0,
                    "dur": max(0.0, (end - start) / 1000.0),
                    "args": {"actor": actor, "rank": rank, "failed": bool(failed)}}
                if failed:
                    ev["cname"] = "terrible"
                events.append(ev)
            for tid, tname in ((1, "endpoint calls"), (2, "spans")):
                events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                               "args": {"name": tname}})
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"mesh": self.mesh, "start_unix_ns": base}}

    def save_chrome_trace(self, path: str) -> str:
        """Write `to_chrome_trace()` as JSON to `path` (0600); returns the path."""
        data = json.dumps(self.to_chrome_trace())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(data)
        return path

    def __str__(self) -> str:
        lines = [f"timeline of {self.mesh}: {len(self.lanes)} lanes, "
                 f"{(self.end_ns - self.start_ns) / 1e9:.1f} s"]
        for lane in self.lanes:
            calls = [r for r in lane.records if r[2] == "call"]
            spans = [r for r in lane.records if r[2] == "span"]
            failed = sum(1 for r in lane.records if r[6])
            busy = sum(r[1] - r[0] for r in calls) / 1e9
            lines.append(f"  rank {lane.rank}: {len(calls)} calls ({busy:.3f} s busy), "
                         f"{len(spans)} spans, {failed} failed"
                         + (f" [{lane.error}]" if lane.error else ""))
        return "\n".join(lines)


def make_timeline(mesh: str, lanes: Iterable[Lane], last_s: float,
                  end_ns: Optional[int] = None) -> Timeline:
    """A Timeline of `lanes` covering the `last_s` seconds before `end_ns` (default now)."""
    end = now_ns() if end_ns is None else end_ns
    items = sorted(lanes, key=lambda lane: (lane.rank, lane.host, lane.pid))
    return Timeline(mesh, items, end - int(last_s * 1e9), end)
