"""The %%mesh cell runner: one actor per proc that runs notebook cells in a namespace
that persists across cells, and returns each cell's last value or its formatted error."""

from __future__ import annotations

import sys
from typing import Any

from runtime import Actor, current_rank, current_size, endpoint

from monarch_kernel.remote.cell_exec import CellResult, new_namespace, portable, run_cell

__all__ = ["END_MARK", "namespace_of", "CurrentRank", "CellRunner"]

#: Written (on its own line, to stdout and stderr) when a cell ends, so the controller
#: knows every line the cell printed before it has arrived; the router removes it.
END_MARK = "\x1b]777;mk-end:{token}\x07"

#: key -> the cell namespace of this proc's CellRunner (read by the CellCompleter actor).
_NAMESPACES: dict[str, dict[str, Any]] = {}


def namespace_of(key: str) -> dict[str, Any]:
    """The cell namespace registered under `key` in this proc ({} before the runner starts)."""
    return _NAMESPACES.get(key, {})


class CurrentRank:
    """`current_rank` in a %%mesh cell: call it for the Point (`current_rank().rank`, as in
    an actor); as a value it is the rank, so `f"{current_rank}"` and `print(current_rank)`
    show `3`, `int(current_rank)` and `range(current_rank)` work."""

    def __call__(self) -> Any:
        """This rank's Point in the cell's selection (`runtime.current_rank()`)."""
        return current_rank()

    def __int__(self) -> int:
        return int(current_rank().rank)

    __index__ = __int__

    def __str__(self) -> str:
        return str(int(self))

    def __format__(self, spec: str) -> str:
        return format(int(self), spec)

    def __repr__(self) -> str:
        return f"{int(self)} (current_rank() is {current_rank()!r})"


class CellRunner(Actor):
    """Runs cells for %%mesh; its namespace is this proc's notebook-like globals."""

    def __init__(self, key: str = "") -> None:
        point = current_rank()
        self.ns = new_namespace(current_rank=CurrentRank(), current_size=current_size)
        if key:  # the CellCompleter spawned with the same key completes against it
            _NAMESPACES[key] = self.ns
        self.rank = point.rank
        self.coords = dict(point.items())

    @endpoint
    async def run(self, code: str, tag: str = "0", mark: str = "") -> CellResult:
        """Run `code`; the result carries this rank, its coordinates and a portable value."""
        from runtime.transport.serialization import dumps

        try:
            result = await run_cell(self.ns, code, tag)
            if result.has_value:
                result.value = portable(result.value, dumps)
        except BaseException as e:  # noqa: BLE001 - e.g. an interrupt arriving late
            result = CellResult(ok=False, error_type=type(e).__name__, error_message=str(e),
                                traceback=f"{type(e).__name__}: {e}\n")
        finally:
            if mark:
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.write(END_MARK.format(token=mark) + "\n")
                        stream.flush()
                    except Exception:
                        pass
        result.rank = self.rank
        result.coords = self.coords
        return result

    @endpoint
    def variables(self) -> list[str]:
        """Names defined in this proc's cell namespace (for completion and inspection)."""
        return sorted(k for k in self.ns if not k.startswith("__"))
