"""The cast tree: which host agents relay a cast to which (pure logic, no I/O).

A cast to procs on more host agents than `cast_fanout` goes down a tree: the sender sends
to at most `fanout` agents, each forwards to its own subtree and delivers to its own procs,
and gathered replies come back up the same tree (runtime/host/gather.py). The tree is laid
over the mesh's whole ordered list of agents (its `base`), never over one cast's targets,
so every message one sender sends one proc of that mesh takes the same path whatever
slice it was cast to (order per sender holds, docs/transport.md "The cast tree"):

- the base is cut into at most `fanout` contiguous chunks of near-equal size; the first
  agent of a chunk heads it, and the rest of the chunk is cut the same way below it;
- a slice keeps the nodes on the way to its agents (a relay with no target of its own
  still forwards) and drops the rest;
- a dead agent's children take its place under its parent (they are promoted), so a dead
  relay moves only its own subtree's paths; nobody else's changes.

A node on the wire is `[agent address, [proc ids], [child nodes]]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Iterable, Mapping, Optional, Sequence

__all__ = ["Tree", "chunks", "build", "agents_of", "procs_of", "valid_node"]


@dataclass
class Tree:
    """One cast's tree: what the sender sends and what it must know when a relay dies."""

    #: the sender's children: nodes `[agent, procs, children]`, each sent one message
    roots: list
    #: agent -> its parent agent ("" for the sender's children), for every agent in it
    parent: dict = field(default_factory=dict)
    #: relay agent (a node with children) -> the procs of its whole subtree below it
    below: dict = field(default_factory=dict)
    #: agent -> its own procs
    own: dict = field(default_factory=dict)
    depth: int = 0  # levels of agents (1: the sender sends every agent itself)

    def deep_procs(self) -> set:
        """The procs whose replies come through at least one relay."""
        out: set = set()
        for node in self.roots:
            out.update(self.below.get(node[0], ()))
        return out

    def subtree(self, agent: str) -> set:
        """The procs of `agent` and of every agent below it."""
        return set(self.own.get(agent, ())) | set(self.below.get(agent, ()))

    def agents_below(self, agent: str) -> list:
        """Every agent of the subtree below `agent` (not itself), top down."""
        stack = list(self.roots)
        while stack:
            node = stack.pop()
            if node[0] == agent:
                return [a for k in node[2] for a in agents_of(k)]
            stack.extend(node[2])
        return []

    def nearest_live_ancestor(self, agent: str, dead: Collection[str]) -> str:
        """The closest agent above `agent` not in `dead`; "" when that is the sender."""
        up = self.parent.get(agent, "")
        while up and up in dead:
            up = self.parent.get(up, "")
        return up


def chunks(n: int, fanout: int) -> list[tuple[int, int]]:
    """[lo, hi) bounds of at most `fanout` contiguous chunks of near-equal size over n."""
    if n <= 0:
        return []
    k = min(fanout, n)
    size, extra = divmod(n, k)
    out, lo = [], 0
    for i in range(k):
        hi = lo + size + (1 if i < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def build(base: Sequence[str], want: Mapping[str, list], fanout: int,
          dead: Collection[str] = ()) -> Tree:
    """The tree of a cast to the procs `want` ({agent: [proc ids]}) over the mesh's agents
    `base` (in rank order), each node with at most `fanout` children (a dead agent's
    promoted children may add to its parent's). Agents of `want` missing from `base` are
    the sender's children directly."""
    if fanout < 2:
        raise ValueError(f"cast_fanout must be at least 2, got {fanout}")
    tree = Tree(roots=[])
    in_base = set(base)

    def grow(lo: int, hi: int, parent: str, level: int) -> list:
        nodes: list = []
        for clo, chi in chunks(hi - lo, fanout):
            head = base[lo + clo]
            alive = head not in dead
            kids = grow(lo + clo + 1, lo + chi, head if alive else parent, level + alive)
            procs = want.get(head) if alive else None
            if not alive:
                nodes.extend(kids)  # promoted: the dead agent's parent sends them
                continue
            if not procs and not kids:
                continue
            node = [head, list(procs or ()), kids]
            nodes.append(node)
            tree.parent[head] = parent
            tree.own[head] = node[1]
            tree.depth = max(tree.depth, level)
            if kids:
                tree.below[head] = [p for k in kids for p in _procs_of(k)]
        return nodes

    tree.roots = grow(0, len(base), "", 1)
    for agent, procs in want.items():
        if agent not in in_base and procs and agent not in dead:
            tree.roots.append([agent, list(procs), []])
            tree.parent[agent] = ""
            tree.own[agent] = list(procs)
            tree.depth = max(tree.depth, 1)
    return tree


def _procs_of(node: list) -> Iterable[str]:
    yield from node[1]
    for k in node[2]:
        yield from _procs_of(k)


def agents_of(node: list) -> list:
    """Every agent of a node's subtree, its own first (top down)."""
    out, stack = [], [node]
    while stack:
        n = stack.pop(0)
        out.append(n[0])
        stack.extend(n[2])
    return out


def procs_of(node: list) -> list:
    """Every proc of a node's subtree, its own first."""
    return list(_procs_of(node))


def valid_node(node: object, limit: int = 1 << 20) -> Optional[str]:
    """Why `node` (from the wire) is not a tree node, or None: a relay checks what it is
    asked to forward before it forwards anything."""
    stack = [node]
    seen = 0
    while stack:
        n = stack.pop()
        seen += 1
        if seen > limit:
            return "too many nodes"
        if not isinstance(n, (list, tuple)) or len(n) != 3:
            return "a node is not [agent, procs, children]"
        agent, procs, kids = n
        if not isinstance(agent, str) or not isinstance(procs, (list, tuple)) or \
                not isinstance(kids, (list, tuple)):
            return "a node's fields have the wrong types"
        if not all(isinstance(p, str) for p in procs):
            return "a proc id is not a string"
        stack.extend(kids)
    return None
