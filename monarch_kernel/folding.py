"""Gather per-rank cell errors into one readable error: pure, tested directly.

Ranks whose tracebacks are identical are folded into one entry ("ranks 0-2, 5"), so a
bug that fails on 64 ranks prints its traceback once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from runtime.supervision.fold import compress_ranks  # noqa: F401 - one copy, runtime's

__all__ = [
    "RankFailure", "fold", "summary_line", "render", "MeshCellError", "MeshCellInterrupted",
    "live_selection", "MeshRanksDead", "MeshCommandFailed", "MeshCellTimeout",
]


@dataclass(frozen=True)
class RankFailure:
    """One rank's error: its rank, its coordinates, the error type, and its traceback."""

    rank: int
    coords: dict[str, int]
    error_type: str
    message: str
    traceback: str


def fold(failures: Sequence[RankFailure]) -> list[tuple[list[RankFailure], str]]:
    """Group failures with identical tracebacks, in order of their lowest rank."""
    groups: dict[str, list[RankFailure]] = {}
    for f in sorted(failures, key=lambda f: f.rank):
        key = f.traceback or f"{f.error_type}: {f.message}"
        groups.setdefault(key, []).append(f)
    return [(members, key) for key, members in groups.items()]


def _rank_word(members: Sequence[RankFailure]) -> str:
    ranks = [m.rank for m in members]
    word = "rank" if len(ranks) == 1 else "ranks"
    text = f"{word} {compress_ranks(ranks)}"
    if len(members) == 1 and members[0].coords:
        coords = ", ".join(f"{k}={v}" for k, v in members[0].coords.items())
        text += f" ({coords})"
    return text


def summary_line(failures: Sequence[RankFailure], total: int, mesh: str) -> str:
    """One line: how many ranks failed, and with which error types."""
    types: dict[str, int] = {}
    for f in failures:
        types[f.error_type] = types.get(f.error_type, 0) + 1
    kinds = ", ".join(f"{t}" if n == len(failures) else f"{t} x{n}" for t, n in types.items())
    where = f" on {mesh}" if mesh else ""
    return f"{len(failures)} of {total} ranks failed{where}: {kinds}"


def render(failures: Sequence[RankFailure], total: int, mesh: str = "") -> str:
    """The full folded report: a summary line, then each distinct traceback once."""
    lines = [summary_line(failures, total, mesh)]
    for members, text in fold(failures):
        lines.append("")
        lines.append(f"--- {_rank_word(members)} ---")
        lines.append(text.rstrip("\n"))
    return "\n".join(lines) + "\n"


class MeshCellError(Exception):
    """Some ranks of a %%mesh cell raised; shows each distinct traceback once.

    `failures` holds every failing rank; `results` (when set) is the ValueMesh of every
    rank's CellResult, so the successful ranks' values are not lost."""

    def __init__(self, failures: Sequence[RankFailure], total: int, mesh: str = "",
                 results: Optional[Any] = None) -> None:
        self.failures = list(failures)
        self.total = total
        self.mesh = mesh
        self.results = results
        super().__init__(summary_line(self.failures, total, mesh))

    def report(self) -> str:
        return render(self.failures, self.total, self.mesh)

    def __str__(self) -> str:
        return self.report()

    def _render_traceback_(self) -> list[str]:
        """IPython shows these lines instead of a controller-side traceback."""
        return [f"MeshCellError: {self.report()}".rstrip("\n")]

    def __reduce__(self) -> Any:
        return (MeshCellError, (self.failures, self.total, self.mesh))


class MeshCellInterrupted(MeshCellError, KeyboardInterrupt):
    """A %%mesh cell interrupted (Ctrl-C): which ranks were interrupted and where in the
    cell; the ranks that had finished keep their results (`results`). A KeyboardInterrupt,
    so code that stops on Ctrl-C still does."""

    def report(self) -> str:
        return "interrupted: " + render(self.failures, self.total, self.mesh)

    def _render_traceback_(self) -> list[str]:
        return [f"MeshCellInterrupted: {self.report()}".rstrip("\n")]

    def __reduce__(self) -> Any:
        return (MeshCellInterrupted, (self.failures, self.total, self.mesh))


def live_selection(sizes: dict[str, int], dead: Sequence[dict[str, int]]) -> Optional[str]:
    """The `--ranks` selection (`procs=0:3`) that keeps the most ranks of a mesh of `sizes`
    while leaving out every rank at the coordinates `dead`; None if no one slice does."""
    best: Optional[tuple[int, str]] = None
    total = 1
    for n in sizes.values():
        total *= n
    for dim, size in sizes.items():
        bad = {c[dim] for c in dead if dim in c}
        run_start, runs = None, []
        for i in range(size + 1):
            if i < size and i not in bad:
                run_start = i if run_start is None else run_start
            elif run_start is not None:
                runs.append((run_start, i))
                run_start = None
        for a, b in runs:
            kept = (b - a) * (total // size if size else 0)
            text = f"{dim}={a}" if b - a == 1 else f"{dim}={a}:{b}"
            if kept and (best is None or kept > best[0]):
                best = (kept, text)
    return best[1] if best else None


class MeshRanksDead(Exception):
    """A %%mesh cell that did not run: ranks it selected are dead (their procs died
    earlier). Says which, how, and the `--ranks` selection that still works."""

    def __init__(self, mesh: str, dead: dict[int, str], total: int,
                 selection: Optional[str]) -> None:
        self.mesh, self.dead, self.total, self.selection = mesh, dict(dead), total, selection
        ranks = sorted(self.dead)
        word = "rank" if len(ranks) == 1 else "ranks"
        verb = "is" if len(ranks) == 1 else "are"
        lines = [f"{word} {compress_ranks(ranks)} of {mesh} ({total} ranks) {verb} dead; "
                 "the cell did not run"]
        lines += [f"  rank {r}: {how}" for r, how in sorted(self.dead.items()) if how]
        fix = f"`%%mesh {mesh} --ranks {selection}` runs it on live ranks, or " \
            if selection else ""
        lines.append(f"{fix}`%mesh stop {mesh}` and `%mesh alloc` a new mesh")
        super().__init__("\n".join(lines))

    def _render_traceback_(self) -> list[str]:
        """IPython shows these lines instead of a controller-side traceback."""
        return [f"MeshRanksDead: {self}"]

    def __reduce__(self) -> Any:
        return (MeshRanksDead, (self.mesh, self.dead, self.total, self.selection))


class MeshCommandFailed(Exception):
    """A %mesh command or %%mesh cell that failed while it ran (a host, a proc, a module
    or a deadline), not because of its arguments (those are UsageError): shown as its
    message, without the controller's frames."""

    def _render_traceback_(self) -> list[str]:
        """IPython shows these lines instead of a controller-side traceback."""
        return [f"{type(self).__name__}: {self}"]


class MeshCellTimeout(MeshCommandFailed, TimeoutError):
    """A %%mesh cell that did not finish within its --timeout."""
