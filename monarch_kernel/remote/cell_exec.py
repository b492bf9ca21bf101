"""Execute a notebook cell's code in a persistent namespace, IPython-style: pure, no I/O.

Used on each proc by the %%mesh cell runner actor. The last expression's value is
returned (like `Out[n]`), top-level `await` works, and errors come back as formatted
tracebacks that show the cell's own lines and no runtime frames.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import traceback
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["CellResult", "Unpicklable", "new_namespace", "run_cell", "portable"]

_FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT


@dataclass
class CellResult:
    """What one rank's run of a cell produced: a value, or an error with its traceback."""

    ok: bool
    value: Any = None
    has_value: bool = False  # the cell ended with an expression whose value is not None
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""  # formatted, only frames of the cell and code it called
    rank: int = -1  # the rank that ran it, in the whole mesh (set by the runner)
    coords: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        if self.ok:
            return f"CellResult(value={self.value!r})" if self.has_value else "CellResult()"
        return f"CellResult(error={self.error_type}: {self.error_message})"


class Unpicklable:
    """Stands in for a value that cannot travel back to the controller: shows its repr."""

    def __init__(self, type_name: str, text: str) -> None:
        self.type_name = type_name
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unpicklable) and other.text == self.text


def new_namespace(name: str = "__mesh__", **extra: Any) -> dict[str, Any]:
    """A fresh namespace for cells, like a module's globals."""
    import builtins

    ns: dict[str, Any] = {"__name__": name, "__builtins__": builtins}
    ns.update(extra)
    return ns


def _filename(tag: str) -> str:
    # The same on every rank for the same cell, so identical tracebacks fold together.
    return f"<mesh-cell-{tag}>"


def _register_source(filename: str, code: str) -> None:
    lines = code.splitlines(keepends=True)
    linecache.cache[filename] = (len(code), None, lines, filename)


def _split_last_expr(tree: ast.Module) -> tuple[ast.Module, Optional[ast.Expression]]:
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        body = ast.Module(body=tree.body[:-1], type_ignores=[])
        return body, ast.Expression(body=last.value)
    return tree, None


async def run_cell(ns: dict[str, Any], code: str, tag: str = "0") -> CellResult:
    """Run `code` in `ns`; return the last expression's value or the formatted error."""
    filename = _filename(tag)
    _register_source(filename, code)
    try:
        tree = ast.parse(code, filename=filename, mode="exec")
        body, last = _split_last_expr(tree)
        body_code = compile(body, filename, "exec", flags=_FLAGS, dont_inherit=True)
        last_code = (compile(last, filename, "eval", flags=_FLAGS, dont_inherit=True)
                     if last is not None else None)
    except SyntaxError as e:
        return _error(e, filename, syntax=True)
    try:
        r = eval(body_code, ns)
        if inspect.iscoroutine(r):
            await r
        value = None
        if last_code is not None:
            value = eval(last_code, ns)
            if inspect.iscoroutine(value):
                value = await value
    except (Exception, KeyboardInterrupt, SystemExit) as e:  # reported, not re-raised
        return _error(e, filename)
    if value is not None:
        ns["_"] = value
    return CellResult(ok=True, value=value, has_value=value is not None)


def _error(exc: BaseException, filename: str, syntax: bool = False) -> CellResult:
    te = traceback.TracebackException.from_exception(exc, capture_locals=False)
    if not syntax:
        # Drop the frames of this module that precede the cell's first frame.
        stack = te.stack
        for i, frame in enumerate(stack):
            if frame.filename == filename:
                te.stack = traceback.StackSummary.from_list(stack[i:])
                break
    text = "".join(te.format())
    return CellResult(
        ok=False,
        error_type=type(exc).__name__,
        error_message=str(exc),
        traceback=text,
    )


def portable(value: Any, dumps: Any) -> Any:
    """`value` if `dumps` can serialize it, else an Unpicklable showing its repr."""
    try:
        dumps(value)
        return value
    except Exception:
        try:
            text = repr(value)
        except Exception as e:  # a broken __repr__ must not lose the result
            text = f"<{type(value).__name__} (repr failed: {e})>"
        return Unpicklable(type(value).__name__, text)
