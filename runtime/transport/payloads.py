"""The `extra` of the cast tree's messages, typed (pure declarations, no I/O): what a sender
puts in a FANOUT, a REPLY_BATCH, a RELAY_LOST and a SPAWN_PROCS, so the type checker names a
misspelt or missing key where the message is built. A receiver still checks what arrives
(it comes off the wire): these say what a well-formed one holds.

`Header.extra` stays a plain dict on the wire (msgpack); a TypedDict is that dict.
"""

from __future__ import annotations

from typing import TypedDict

__all__ = ["FanoutExtra", "ReplyBatchExtra", "RelayLostExtra", "SpawnSpec", "SpawnExtra"]


class FanoutExtra(TypedDict, total=False):
    """FANOUT: deliver the encoded `header` (a CALL, a SPAWN_ACTOR, ...) to this agent's
    `procs`, after relaying it down `sub` (casttree nodes `[agent, procs, children]`);
    `gather`: the replies come back through the agents; `reduce`: a reduced call's pickled
    combine (runtime/host/folds.py)."""

    header: bytes
    procs: list[str]
    sub: list
    gather: bool
    reduce: bytes


class ReplyBatchExtra(TypedDict, total=False):
    """REPLY_BATCH: `items` are `[src, actor, rank, status, body length, buffer count]` per
    reply; `g`: the parent agent's batch (up a tree); `gone`: procs that will not answer
    through it, with `why` where nobody else tells the caller; `part`: `[procs, ranks]` of
    each PARTIAL item, in order."""

    items: list
    g: int
    gone: list[str]
    why: dict[str, str]
    part: list


class RelayLostExtra(TypedDict):
    """RELAY_LOST (caller -> the nearest live agent above dead relays): stop waiting for
    `procs`, the subtrees of `relays`."""

    relays: list[str]
    procs: list[str]


class SpawnSpec(TypedDict):
    """One agent's part of a SPAWN_PROCS: its procs' specs and where they say hello."""

    procs: list[dict]
    owner: str


class SpawnExtra(TypedDict, total=False):
    """SPAWN_PROCS: this agent's `procs` and `owner` (a SpawnSpec), what all share (`cwd`,
    the mesh's `labels` and `sizes`, `keep`), and down the hosts' tree the subtree to relay
    to (`sub`) with each agent's spec (`specs`)."""

    procs: list[dict]
    owner: str
    cwd: str
    labels: list[str]
    sizes: list[int]
    keep: float
    sub: list
    specs: dict[str, SpawnSpec]
