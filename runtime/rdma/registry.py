"""The owner's table of exported buffers: what its data server may touch, and for how long."""

from __future__ import annotations

import itertools
import threading
from typing import Any, Optional

from .memory import Span

__all__ = ["Entry", "Lookup", "Registry"]


class Entry:
    """One exported buffer. Holding a reference to the entry keeps its memory alive."""

    __slots__ = ("buffer_id", "span", "pins", "dropped", "ib_mr", "__weakref__")

    def __init__(self, buffer_id: int, span: Span) -> None:
        self.buffer_id = buffer_id
        self.span = span
        self.pins = 0
        self.dropped = False
        self.ib_mr: Any = None  # pyverbs MR, registered on first ibverbs use


class Lookup:
    """Result of a registry lookup: the entry, or why there is none."""

    __slots__ = ("entry", "status")

    def __init__(self, entry: Optional[Entry], status: str) -> None:
        self.entry = entry
        self.status = status  # "ok" | "dropped" | "unknown"


class Registry:
    """Buffer id -> Entry. Ids are issued in increasing order, so an id up to the last one
    issued that is not live was dropped: callers hear "dropped" without a tombstone per id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dropped = threading.Condition(self._lock)  # notified as buffers are dropped
        self._ids = itertools.count(1)
        self._last = 0  # the last id issued
        self._live: dict[int, Entry] = {}

    def _was_issued(self, buffer_id: int) -> bool:
        return 0 < buffer_id <= self._last

    def add(self, span: Span) -> Entry:
        with self._lock:
            entry = Entry(next(self._ids), span)
            self._last = entry.buffer_id
            self._live[entry.buffer_id] = entry
            return entry

    def get(self, buffer_id: int) -> Lookup:
        with self._lock:
            entry = self._live.get(buffer_id)
            if entry is not None:
                return Lookup(entry, "ok")
            return Lookup(None, "dropped" if self._was_issued(buffer_id) else "unknown")

    def pin(self, buffer_id: int) -> Lookup:
        """Look up and pin: a pinned entry's memory stays valid until `unpin`, even if dropped."""
        with self._lock:
            entry = self._live.get(buffer_id)
            if entry is None:
                return Lookup(None, "dropped" if self._was_issued(buffer_id) else "unknown")
            entry.pins += 1
            return Lookup(entry, "ok")

    def unpin(self, entry: Entry) -> None:
        with self._lock:
            entry.pins -= 1
            if entry.dropped and entry.pins == 0:
                self._release(entry)

    def drop(self, buffer_id: int) -> bool:
        """Remove a buffer; its memory reference goes once no transfer pins it. False if unknown."""
        with self._lock:
            entry = self._live.pop(buffer_id, None)
            if entry is None:
                return self._was_issued(buffer_id)
            entry.dropped = True
            if entry.pins == 0:
                self._release(entry)
            self._dropped.notify_all()
            return True

    def wait_dropped(self, buffer_id: int, timeout: float) -> bool:
        """Wait up to `timeout` seconds until the buffer is dropped; whether it is."""
        with self._lock:
            return self._dropped.wait_for(lambda: buffer_id not in self._live, timeout)

    def _release(self, entry: Entry) -> None:
        mr, entry.ib_mr = entry.ib_mr, None
        if mr is not None:
            try:
                mr.close()  # deregister: in-flight remote verbs then fail instead of touching freed memory
            except Exception:
                pass
        entry.span.keepalive = None

    def __len__(self) -> int:
        with self._lock:
            return len(self._live)
