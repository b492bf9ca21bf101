"""Print the imports between runtime's top-level parts and any cycle among them.

    python scripts/runtime_imports.py [--with-type-checking]

Imports inside functions count; `if TYPE_CHECKING:` ones do not (they never run) unless
asked. For each part: its height (1 = imports no other part; each part imports only lower
heights when there is no cycle) and the parts it imports. Then the strongly connected
components (the parts caught in a cycle) and, when networkx is importable, the number of
simple cycles. The layers themselves are pyproject.toml's `runtime-layers` contract.
"""

from __future__ import annotations

import sys
from pathlib import Path

import grimp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def part_edges(with_type_checking: bool) -> dict[str, set[str]]:
    """part -> the parts it imports (`__init__` is the root package `runtime`)."""
    graph = grimp.build_graph("runtime", cache_dir=None,
                              exclude_type_checking_imports=not with_type_checking)

    def part(mod: str) -> str:
        return (mod.split(".") + ["__init__"])[1]

    edges: dict[str, set[str]] = {part(m): set() for m in graph.modules}
    for mod in graph.modules:
        for imported in graph.find_modules_directly_imported_by(mod):
            if imported.split(".")[0] == "runtime" and part(imported) != part(mod):
                edges[part(mod)].add(part(imported))
    return edges


def components(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one part (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main() -> None:
    edges = part_edges("--with-type-checking" in sys.argv)
    sccs = components(edges)
    height: dict[str, int] = {}

    def h(v: str, seen: frozenset = frozenset()) -> int:
        if v not in height:
            height[v] = 1 + max((h(w, seen | {v}) for w in edges[v] if w not in seen | {v}),
                                default=0)
        return height[v]

    for v in sorted(edges, key=lambda v: (h(v), v)):
        print(f"{h(v):>2}  {v:<16} -> {', '.join(sorted(edges[v])) or '-'}")
    print(f"\nparts in a cycle: {sccs or 'none'}")
    try:
        import networkx as nx
    except ImportError:
        return
    graph = nx.DiGraph([(a, b) for a, bs in edges.items() for b in bs])
    print(f"simple cycles: {sum(1 for _ in nx.simple_cycles(graph))}")


if __name__ == "__main__":
    main()
