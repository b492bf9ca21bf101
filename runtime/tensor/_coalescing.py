"""Monarch's `coalescing()`: reductions issued one after another inside the block travel as
one collective per group of procs (their tensors packed into one buffer on each proc), as
DDP buckets its gradients. Any other command of the thread (an op, a fetch, a call) first
sends what is pending, so the program's order is kept; so is the block's end."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Protocol

__all__ = ["CommandSink", "blocks", "coalescing", "active", "defer", "flush"]


class CommandSink(Protocol):
    """What a held reduction is sent through when the block flushes: the engine that runs
    its ops (`_engine.Engine`)."""

    def send_command(self, key: tuple, target: Any, command: tuple) -> None: ...


_local = threading.local()
#: how many threads are inside a block now: the per-op check reads this global first
#: (a thread-local read costs more, and almost every op is issued outside any block)
blocks = 0
_blocks_lock = threading.Lock()


def _pending() -> list:
    p = getattr(_local, "pending", None)
    if p is None:
        p = _local.pending = []
    return p


@contextlib.contextmanager
def coalescing() -> Iterator[None]:
    """Fuse the reductions issued in this block (`reduce`, `reduce_`, not scatter or stack)
    into one collective per group of procs, reduction and dtype; nested blocks join the
    outermost."""
    global blocks
    depth = getattr(_local, "depth", 0)
    if depth == 0:
        with _blocks_lock:
            blocks += 1
    _local.depth = depth + 1
    try:
        yield
    finally:
        _local.depth = depth
        if depth == 0:
            with _blocks_lock:
                blocks -= 1
            flush()


def active() -> bool:
    """Whether this thread is inside a `coalescing()` block."""
    return blocks > 0 and getattr(_local, "depth", 0) > 0


def defer(engine: CommandSink, key: tuple, target: Any, t: Any, result: Any, spec: dict) -> bool:
    """Hold a reduction of mesh tensor `t` for fusion (True), or decline (False: send it
    now). The entry keeps `t` and `result` alive until it is sent: a tensor freed before
    would have its free reach the procs first."""
    if not active() or spec["scatter"] or spec["reduction"] == "stack":
        return False
    _pending().append((engine, key, target, t, result, spec))
    return True


def flush() -> None:
    """Send what is pending: consecutive reductions with the same procs, groups, reduction,
    dtype and device become one command."""
    pend = _pending()
    if not pend:
        return
    items, _local.pending = list(pend), []
    runs: list[list] = []
    for it in items:
        if runs and _fuses(runs[-1][0], it):
            runs[-1].append(it)
        else:
            runs.append([it])
    for run in runs:
        engine, key, target, _, _, spec = run[0]
        if len(run) == 1:
            engine.send_command(key, target, ("coll", "reduce", run[0][3].ref, run[0][4].ref,
                                              spec))
            continue
        many = dict(spec)
        many["items"] = [(it[3].ref, it[4].ref, it[5]["into"], it[5]["meta"][0])
                         for it in run]
        many["label"] = f"coalesced {spec['label']} x{len(run)}"
        engine.send_command(key, target, ("coll", "reduce_many", None, None, many))


def _fuses(a: tuple, b: tuple) -> bool:
    sa, sb = a[5], b[5]
    return (a[0] is b[0] and a[1] == b[1] and sa["groups"] == sb["groups"]
            and sa["reduction"] == sb["reduction"] and sa["meta"][1] == sb["meta"][1]
            and sa["backend"] == sb["backend"] and sa["cuda"] == sb["cuda"])
