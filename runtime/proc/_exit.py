"""A stand-in for interpreter finalization when a proc exits (it ends with `os._exit`): its
actors are dropped, the `atexit` handlers run, then the user's modules' globals are set to
None so that `__del__` of what they hold runs, within a deadline.

Layer 6 (process roles, under `proc`): imports nothing of runtime.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from typing import Any

__all__ = ["graceful_exit", "drop_user_module_globals", "user_modules"]


def graceful_exit(server: Any, timeout: float) -> None:
    """Before the proc exits: drop the actors (their `__del__` runs), run the `atexit`
    handlers, then drop the globals of the user's modules (`__del__` of objects they hold
    runs, as interpreter finalization would), all within `timeout` seconds (the proc exits
    anyway after that, with os._exit)."""
    import atexit
    import gc

    def run() -> None:
        for a in list(server.actors.values()):
            a.instance = a.last_exception = None  # a traceback would keep the instance alive
        gc.collect()
        try:
            atexit._run_exitfuncs()
        except BaseException:  # noqa: BLE001 - the proc is exiting anyway
            traceback.print_exc()
        gc.collect()  # what the atexit handlers held
        try:
            drop_user_module_globals()
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        gc.collect()

    t = threading.Thread(target=run, name="monarch-atexit", daemon=True)
    t.start()
    t.join(timeout)


def drop_user_module_globals() -> None:
    """Set the globals of the user's modules to None, as finalization does, so objects they
    hold are collected. The runtime's own modules and libraries stay intact: the I/O thread
    still runs."""
    for name in user_modules():
        d = getattr(sys.modules.get(name), "__dict__", None)
        if d is None:
            continue
        for k in list(d):
            if not (k.startswith("__") and k.endswith("__")):
                d[k] = None


def user_modules() -> list[str]:
    """The names of the loaded modules that are the user's code: not Python's, not in an
    installed distribution (wherever it was installed: a venv, `pip install --target` on
    PYTHONPATH), not this project's."""
    import sysconfig

    dirs = [*sysconfig.get_paths().values(), sys.prefix, sys.base_prefix]
    keep = {os.path.normpath(p) + os.sep for p in dirs}
    keep |= {os.path.realpath(p) + os.sep for p in dirs}
    # the directory holding this project's packages (runtime/proc/_exit.py is three down)
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))) + os.sep
    keep |= {here + pkg + os.sep for pkg in ("runtime", "monarch_kernel", "monarch_widgets")}
    kept = tuple(keep)

    def is_kept(f: object) -> bool:
        return not isinstance(f, str) or f.startswith(kept) or os.path.realpath(f).startswith(kept)

    out = [name for name, mod in list(sys.modules.items())
           if name != "__main__" and not is_kept(getattr(mod, "__file__", None))]
    # a module generated elsewhere whose package is installed here (torch makes some)
    tops = {n.partition(".")[0] for n in out}
    installed = {t for t in tops if t in sys.modules and "." not in t and
                 isinstance(getattr(sys.modules[t], "__file__", None), str) and
                 is_kept(sys.modules[t].__file__)}
    out = [n for n in out if n.partition(".")[0] not in installed]
    if not out:
        return out
    try:  # distributions installed where those modules were found (`pip install --target`)
        installed |= _installed_top_levels(tops - installed)
    except Exception:  # noqa: BLE001 - a broken distribution: the paths alone decide
        pass
    installed |= set(getattr(sys, "stdlib_module_names", ()))
    return [n for n in out if n.partition(".")[0] not in installed]


def _installed_top_levels(tops: set[str]) -> set[str]:
    """The top-level names of the distributions installed in the import-path entries that
    `tops` (top-level module names) were loaded from: their metadata only, not that of every
    installed distribution (reading all took ~55 ms, paid by every proc at its exit)."""
    import importlib.metadata

    entries = set()
    for top in tops:
        f = getattr(sys.modules.get(top), "__file__", None)
        if isinstance(f, str) and os.path.isabs(f):  # not "<stdin>" (__mp_main__)
            d = os.path.dirname(f)
            entries.add(os.path.dirname(d) if os.path.basename(f) == "__init__.py" else d)
    names: set[str] = set()
    for dist in importlib.metadata.distributions(path=sorted(entries)):
        declared = (dist.read_text("top_level.txt") or "").split()
        names.update(declared or {
            f.parts[0].removesuffix(".py") for f in dist.files or ()
            if len(f.parts) > 1 or f.suffix == ".py"})
    return names
