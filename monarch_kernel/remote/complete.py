"""Completion and inspection of `%%mesh` cell code on a proc, against its live namespace.

Runs on the procs: `CellCompleter` is an actor spawned next to each proc's `CellRunner`
(its own thread, so a running cell does not hold completion up) and reads the runner's
namespace. The kernel asks one rank and falls back to local completion on a timeout
(`monarch_kernel.completion`). The pure functions `complete_in` and `inspect_in` are
tested without procs.

The fast pass is IPython's completer without jedi (its "limited" evaluation never calls
properties or custom `__getattr__`); jedi (with its unsafe executions off) adds to it on a
worker thread within a budget, and keeps warming its caches when it misses it.
"""

from __future__ import annotations

import re
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any, Optional

from runtime import Actor, current_rank, endpoint

__all__ = ["JEDI_BUDGET_S", "complete_in", "inspect_in", "CellCompleter"]

#: The matchers that need a real IPython shell, or touch files and magics: off on procs.
_DISABLED = ["IPCompleter.magic_matcher", "IPCompleter.magic_config_matcher",
             "IPCompleter.magic_color_matcher", "IPCompleter.custom_completer_matcher",
             "IPCompleter.file_matcher"]
#: Endpoint-call budget for jedi on top of the fast pass (seconds).
JEDI_BUDGET_S = 0.06

_IMPORT = re.compile(r"\s*(import|from)\s")
_jedi_pool: Optional[ThreadPoolExecutor] = None
_jedi_busy = threading.Lock()  # at most one jedi run in flight per proc
_warned = False


def _quiet_warnings() -> None:
    """One global ignore for IPython's provisional-API warning (catch_warnings is not
    thread-safe, and the cell's thread shares the warnings state)."""
    global _warned
    if not _warned:
        from IPython.core.completer import ProvisionalCompleterWarning

        warnings.filterwarnings("ignore", category=ProvisionalCompleterWarning)
        _warned = True


def _fast_completer(ns: dict) -> Any:
    from IPython.core.completer import IPCompleter

    # python_matcher asks the shell for magics only to strip them; procs have none.
    shell = SimpleNamespace(magics_manager=SimpleNamespace(
        lsmagic=lambda: {"line": {}, "cell": {}}))
    extra: dict = {}
    if "policy_overrides" in IPCompleter.class_traits():  # IPython >= 9.3
        from IPython.core.guarded_eval import EVALUATION_POLICIES

        # nn.Module.__getattr__ only reads its parameter, buffer and submodule dicts.
        base = set(EVALUATION_POLICIES["limited"].allowed_getattr_external)
        extra["policy_overrides"] = {
            "allowed_getattr_external": base | {("torch", "nn", "Module")}}
    return IPCompleter(shell=shell, namespace=ns, global_namespace={}, use_jedi=False,
                       disable_matchers=list(_DISABLED), **extra)


def _jedi_items(snap: dict, code: str, offset: int) -> list[tuple[int, str, str, str]]:
    """(start, text, type, signature) of jedi's completions (worker thread)."""
    import jedi
    from IPython.core.completer import position_to_cursor

    from monarch_kernel.remote.parso_cache import harden

    harden()  # several procs of a host write jedi's parso cache at once
    jedi.settings.allow_unsafe_interpreter_executions = False  # no properties, no getitem
    line, col = position_to_cursor(code, offset)
    out = []
    for c in jedi.Interpreter(code, [snap]).complete(line + 1, col):
        delta = len(c.name_with_symbols) - len(c.complete)
        out.append((offset - delta, c.name_with_symbols, c.type or "", ""))
    return out


def _run_jedi(snap: dict, code: str, offset: int, budget: float) -> tuple[list, bool]:
    """jedi's items if they come within `budget` s; (items, partial). A run that misses
    the budget goes on in the background (it warms jedi's caches for the next Tab)."""
    global _jedi_pool
    if budget <= 0:
        return [], False
    if not _jedi_busy.acquire(blocking=False):
        return [], True
    if _jedi_pool is None:
        _jedi_pool = ThreadPoolExecutor(1, thread_name_prefix="mesh-complete-jedi")

    def run() -> list:
        try:
            return _jedi_items(snap, code, offset)
        finally:
            _jedi_busy.release()

    try:
        fut = _jedi_pool.submit(run)
    except RuntimeError:
        _jedi_busy.release()
        return [], True
    try:
        return fut.result(timeout=budget), False
    except Exception:  # a timeout or jedi's own error: the fast pass stands
        return [], True


def complete_in(ns: dict, code: str, offset: int,
                jedi_budget: float = JEDI_BUDGET_S) -> dict[str, Any]:
    """Complete `code` at `offset` (code points) against namespace `ns`: a dict with
    `items` ([{start, end, text, type, signature}], one shared start), `partial` (jedi
    missed its budget) and `ms`. Never prints, never raises for a matcher's error."""
    from IPython.core.completer import Completion, provisionalcompleter, rectify_completions

    t0 = time.perf_counter()
    _quiet_warnings()
    snap = dict(ns)  # a running cell may add names meanwhile
    comps: list = []
    line = code[:offset].rpartition("\n")[2]
    if not _IMPORT.match(line):  # IPython's pass offers names, not modules, after import
        try:
            with provisionalcompleter():
                comps.extend(_fast_completer(snap).completions(code, offset))
        except Exception:
            pass
    extra, partial = _run_jedi(snap, code, offset, jedi_budget)
    with provisionalcompleter():
        comps += [Completion(start, offset, text, type=typ, signature=sig, _origin="jedi")
                  for start, text, typ, sig in extra]
        rect = list(rectify_completions(code, comps)) if comps else []
    if rect and code[rect[0].start:rect[0].start + 1] == "." \
            and all(c.text.startswith(".") for c in rect):
        # IPython's pass replaces from the dot; list `attr`, not `.attr`, as jedi does.
        with provisionalcompleter():
            rect = [Completion(c.start + 1, c.end, c.text[1:], type=c.type,
                               signature=c.signature) for c in rect]
    items, seen = [], set()
    for c in rect:  # the fast pass first, then what only jedi found
        if c.text not in seen:
            seen.add(c.text)
            items.append({"start": c.start, "end": c.end, "text": c.text,
                          "type": c.type or "", "signature": c.signature or ""})
    return {"items": items, "partial": partial, "ms": (time.perf_counter() - t0) * 1e3}


_MISSING = object()


def _lookup(ns: dict, name: str) -> Any:
    """The object `name` (dotted) names in `ns` or builtins; properties are returned as
    the property (never evaluated), as IPython's inspector does."""
    import builtins

    head, *rest = name.split(".")
    obj = ns.get(head, getattr(builtins, head, _MISSING))
    for part in rest:
        if obj is _MISSING:
            break
        attr = getattr(type(obj), part, None)
        if isinstance(attr, property):
            obj = attr
            continue
        obj = getattr(obj, part, _MISSING)
    return obj


def inspect_in(ns: dict, code: str, offset: int, detail_level: int = 0,
               omit_sections: tuple = ()) -> dict[str, Any]:
    """Inspect the name at `offset` in `code` against `ns`, as ipykernel's do_inspect
    does: {found, name, data: {"text/plain": ...}}."""
    from IPython.utils.tokenutil import token_at_cursor

    name = token_at_cursor(code, offset)
    if not name:
        return {"found": False, "name": "", "data": {}}
    obj = _lookup(dict(ns), name)
    if obj is _MISSING:
        return {"found": False, "name": name, "data": {}}
    try:
        from IPython.core.oinspect import Inspector

        bundle = Inspector(theme_name="nocolor")._get_info(
            obj, name, detail_level=detail_level, omit_sections=tuple(omit_sections))
        text = bundle["text/plain"]
    except Exception:  # no IPython here, or a broken object: signature and docstring
        import inspect

        try:
            sig = str(inspect.signature(obj))
        except (TypeError, ValueError):
            sig = ""
        text = f"{name}{sig}\nType: {type(obj).__name__}\n{inspect.getdoc(obj) or ''}"
    return {"found": True, "name": name, "data": {"text/plain": text}}


class CellCompleter(Actor):
    """Answers the kernel's completion and inspection requests for %%mesh cells against
    this proc's cell namespace (the `CellRunner` registered under `key`)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.rank = current_rank().rank
        # Import IPython's completer now, off the request path (about 0.2 s). Named
        # monarch-*: %mesh stacks lists it after the program's threads
        threading.Thread(target=_warm, name="monarch-jedi-warmup", daemon=True).start()

    def _ns(self) -> dict:
        from monarch_kernel.remote.cell_runner import namespace_of

        return namespace_of(self.key)

    @endpoint
    def complete(self, code: str, offset: int,
                 jedi_budget: float = JEDI_BUDGET_S) -> dict[str, Any]:
        """Completions of `code` at `offset` in this proc's cell namespace."""
        out = complete_in(self._ns(), code, offset, jedi_budget)
        out["rank"] = self.rank
        return out

    @endpoint
    def inspect(self, code: str, offset: int, detail_level: int = 0) -> dict[str, Any]:
        """Signature and docstring of the name at `offset`, from this proc's namespace."""
        out = inspect_in(self._ns(), code, offset, detail_level)
        out["rank"] = self.rank
        return out


def _warm() -> None:
    """Import IPython's completer and run jedi once, off the request path (jedi's first
    run parses builtins: about a second of CPU on one thread, once per proc)."""
    try:
        complete_in({"x": 1}, "x.re", 4, jedi_budget=0)
        inspect_in({"x": len}, "x", 1)
        complete_in({}, "import o", 8, jedi_budget=30.0)
    except Exception:
        pass
