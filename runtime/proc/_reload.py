"""Reload in a live proc: the workspace modules a sync changed, and actor classes.

Between calls only: every actor of the proc is paused at a point between two messages
(a "run" entry in its mailbox) where none of its `@concurrent_endpoint` calls is in progress
(one suspended in an await is waited for, up to the timeout: `between_calls`), and the
reload runs holding the unpickling lock, so no call and no unpickling is half way. Dependencies reload before their dependants (the
imports of the new sources), each module's old namespace is put back if its reload
raises (the proc keeps the old code; the traceback is reported), and actors whose class
came from a reloaded module get the new class (`instance.__class__`), their attributes
kept. The runtime, the standard library and installed packages are never reloaded: only
modules whose file is in the synced workspace (or in its source directory, for procs that
imported it from there before the first sync).

Layer 6 (with `_endpoints` and `_supervise`): the proc's helper; takes the ProcServer as
an argument, imports actor, transport and the basics.
"""

from __future__ import annotations

import ast
import graphlib
import importlib
import json
import logging
import os
import sys
import threading
import time
import traceback
from typing import Any, Optional

from ..actor import endpoints_of, methods_of
from ..transport import serialization
from ..transport.framing import ERROR, OK, Header, Kind
from ..workspace import MANIFEST, module_rel

__all__ = [
    "startup", "put_on_path", "protected", "with_dependants", "reload_order", "calls_in_progress",
    "between_calls", "reload_modules", "swap_class", "on_message",
]

log = logging.getLogger("runtime.reload")
#: rel -> sha256 of the workspace files this proc's modules were last reconciled with
_applied: dict[str, str] = {}
_PROTECTED = frozenset({"runtime", "monarch_kernel", "monarch_widgets", "__main__"})


def _manifest(root: str) -> dict[str, str]:
    with open(os.path.join(root, "current", MANIFEST)) as f:
        return json.load(f)


def _roots(root: str, manifest: dict) -> dict[str, str]:
    names = sorted({r.split("/", 1)[0] for r in manifest})
    return {n: os.path.join(root, "current", n) for n in names}


def _put_on_path(roots: dict[str, str]) -> None:
    for path in reversed(list(roots.values())):
        if path not in sys.path:
            sys.path.insert(0, path)
    importlib.invalidate_caches()  # new files import


def startup(root: str) -> None:
    """A proc starts on a host with a synced workspace: its directories go first on
    sys.path (a proc forked from a zygote older than the sync included)."""
    global _applied
    try:
        manifest = _manifest(root)
    except (OSError, ValueError):
        return
    _put_on_path(_roots(root, manifest))
    _applied = manifest


def put_on_path(root: str, sources: dict) -> dict:
    """A sync without reload: the synced directories go first on sys.path (what a proc
    started after the sync gets); modules already imported keep their code, and stay due
    for the next reload if their file changed (modules imported later load the synced
    files: a reload with nothing changed since leaves them alone)."""
    global _applied
    manifest = _manifest(root)
    roots = _roots(root, manifest)
    applied = dict(manifest)
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if not isinstance(f, str) or protected(name):
            continue
        rel = module_rel(f, roots) or module_rel(f, sources)
        if rel is None or rel not in applied:
            continue
        if rel in _applied:
            applied[rel] = _applied[rel]  # what its code was loaded from
        else:
            del applied[rel]  # loaded before any sync: due for the next reload
    _put_on_path(roots)
    _applied = applied
    return {"path": sorted(roots.values())}


def protected(name: str) -> bool:
    """Modules never reloaded: the runtime's, the front-ends', the standard library's."""
    top = name.partition(".")[0]
    return top in _PROTECTED or top in getattr(sys, "stdlib_module_names", ())


def _imports(mod_name: str, path: str, is_pkg: bool) -> set[str]:
    """Module names the source at `path` imports (absolute, relative ones resolved)."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return set()
    pkg = mod_name if is_pkg else mod_name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                parts = parts[:len(parts) - node.level + 1] if node.level > 1 else parts
                base = ".".join(p for p in (*parts, base) if p)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def with_dependants(mods: dict[str, str], loaded: dict[str, str]) -> dict[str, str]:
    """`mods` plus every loaded workspace module that imports one of them, directly or
    not (a `from dep import x` of a dependant holds the old `x` until it reloads too)."""
    imports = {n: _imports(n, p, p.endswith("__init__.py")) for n, p in loaded.items()
               if n not in mods}
    out = dict(mods)
    grew = True
    while grew:
        grew = False
        for n, deps in imports.items():
            if n not in out and deps & out.keys():
                out[n] = loaded[n]
                grew = True
    return out


def reload_order(mods: dict[str, str]) -> list[str]:
    """`mods` ({module: its file}) ordered so that what a module imports (and its parent
    package) comes before it."""
    ts: graphlib.TopologicalSorter = graphlib.TopologicalSorter()
    for name, path in mods.items():
        deps = {d for d in _imports(name, path, path.endswith("__init__.py")) if d in mods}
        parent = name.rpartition(".")[0]
        while parent:
            if parent in mods:
                deps.add(parent)
            parent = parent.rpartition(".")[0]
        deps.discard(name)
        ts.add(name, *deps)
    try:
        return list(ts.static_order())
    except graphlib.CycleError:  # an import cycle: parents first, then by name
        return sorted(mods, key=lambda n: (n.count("."), n))


def calls_in_progress(a: Any) -> list[str]:
    """The endpoints of actor `a`'s `@concurrent_endpoint` calls that have not ended (a
    task suspended in an await is in the middle of its call)."""
    return sorted(t.get_name() for t in list(a.aloop.tasks) if not t.done())


def _run_calls(a: Any, deadline: float) -> None:
    """On actor `a`'s thread: run its event loop until its concurrent calls have all
    ended, a message reaches its mailbox, or `deadline` (time.monotonic()) passes."""
    import asyncio

    loop = a.event_loop()
    while calls_in_progress(a) and a.mailbox.empty():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        wake = loop.create_future()
        a.aloop.wake = wake
        if not a.mailbox.empty():  # arrived before the waker could see `wake`
            a.aloop.wake = None
            return
        try:
            # a.aloop.waker: mailbox.put sets `wake` (installed by the actor's first wait_idle,
            # before any call could be in progress); without it, look at the mailbox often
            loop.run_until_complete(asyncio.wait(
                {wake, *a.aloop.tasks}, timeout=left if a.aloop.waker else min(left, 0.05),
                return_when=asyncio.FIRST_COMPLETED))
        finally:
            a.aloop.wake = None


def between_calls(a: Any, deadline: float, fn: Any, on_busy: Any, waited: dict) -> Any:
    """A mailbox "run" entry that calls fn(a) on actor `a`'s thread at a point between
    two of its messages where none of its `@concurrent_endpoint` calls is in progress.
    While calls are in progress the actor's event loop runs them (they may end), and the
    messages that arrive meanwhile are handled first (one of them may be what a call
    awaits), the entry going back behind them; past `deadline`, on_busy(a) instead.
    `waited` gets {"name[rank]": the calls in progress when it first had to wait}."""
    def step(actor: Any) -> None:
        calls = calls_in_progress(actor)
        if calls:
            label = f"{actor.name}[{actor.rank}]"
            if label not in waited:
                waited[label] = calls
                log.warning("reload waits for %s: %d call%s in progress (%s), at most %.0f s",
                            label, len(calls), "s" * (len(calls) > 1),
                            ", ".join(f"{c}()" for c in calls),
                            max(0.0, deadline - time.monotonic()))
            _run_calls(actor, deadline)
            if calls_in_progress(actor):
                if not actor.mailbox.empty() and time.monotonic() < deadline:
                    actor.mailbox.put(("run", step))  # its messages first, then back here
                else:
                    on_busy(actor)
                return
        fn(actor)

    return step


class _Gate:
    """Holds the actors of a proc between two of their messages, with no concurrent call
    in progress, while a reload runs."""

    def __init__(self, actors: list, deadline: float) -> None:
        self.cv = threading.Condition()
        self.waiting = {a.actor_id: a for a in actors}
        self.deadline = deadline
        self.waited: dict[str, list] = {}
        self.open = False

    def entry(self, a: Any) -> Any:
        """The mailbox entry that brings actor `a` to the gate."""
        return between_calls(a, self.deadline, self._arrive, lambda _: None, self.waited)

    def _arrive(self, a: Any) -> None:
        with self.cv:
            self.waiting.pop(a.actor_id, None)
            self.cv.notify_all()
            self.cv.wait_for(lambda: self.open)

    def wait_all(self) -> list:
        """Wait until every actor is at the gate (or has ended): [] then, else the actors
        not there at the deadline."""
        with self.cv:
            while True:
                for k, a in list(self.waiting.items()):
                    if not a.thread.is_alive():  # it stopped meanwhile
                        del self.waiting[k]
                left = self.deadline - time.monotonic()
                if not self.waiting or left <= 0:
                    return list(self.waiting.values())
                self.cv.wait(min(left, 0.1))

    def release(self) -> None:
        with self.cv:
            self.open = True
            self.cv.notify_all()


def _paused(server: Any, timeout: float) -> tuple[_Gate, list]:
    """Pause every actor between messages, none in a concurrent call: (the gate, the
    actors still busy at timeout; the gate is open again then)."""
    gate = _Gate([a for a in server.actors.values() if a.thread.is_alive()],
                 time.monotonic() + timeout)
    for a in list(gate.waiting.values()):
        a.mailbox.put(("run", gate.entry(a)))
    busy = gate.wait_all()
    if busy:
        gate.release()
    return gate, busy


def _doing(a: Any) -> str:
    calls = calls_in_progress(a)
    if calls:
        return f"{a.name}[{a.rank}] (calls in progress: {', '.join(c + '()' for c in calls)})"
    return f"{a.name}[{a.rank}] ({a.endpoint or a.state})"


def _lookup(mod: Any, qualname: str) -> Any:
    obj = mod
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def _swap(a: Any, new: type) -> dict:
    """Make actor `a` an instance of `new` (its state kept); what its mesh can call now."""
    a.instance.__class__ = new
    a.endpoints = endpoints_of(new)
    return {"endpoints": sorted(a.endpoints), "methods": sorted(methods_of(new))}


def reload_modules(server: Any, root: str, sources: dict, timeout: float) -> dict:
    """Reload the workspace modules whose files changed since this proc last looked, with
    every actor paused between messages; swap the classes of actors from those modules."""
    global _applied
    manifest = _manifest(root)
    roots = _roots(root, manifest)
    _put_on_path(roots)
    changed = {r for r, d in manifest.items() if _applied.get(r) != d} | \
        (set(_applied) - set(manifest))
    report: dict = {"reloaded": [], "failed": {}, "skipped": [], "deleted": [], "actors": {}}
    loaded: dict[str, str] = {}  # workspace module -> its file now
    mods: dict[str, str] = {}  # those to reload
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if not isinstance(f, str) or protected(name):
            continue
        rel = module_rel(f, roots) or module_rel(f, sources)
        if rel is None:
            continue
        if rel in manifest:
            loaded[name] = os.path.join(root, "current", rel)
            if rel in changed:
                mods[name] = loaded[name]
        elif rel in changed:  # its file was deleted: a later import fails
            del sys.modules[name]
            report["deleted"].append(name)
    mods = with_dependants(mods, loaded)
    if not mods:
        _applied = manifest
        return report
    gate, busy = _paused(server, timeout)
    report["waited"] = dict(gate.waited)  # a copy: a late actor may still add itself
    if busy:
        report["busy"] = [_doing(a) for a in busy]
        return report  # nothing reloaded: the next sync tries again
    lock = serialization._unpickle_lock
    if not lock.acquire(timeout=timeout):
        gate.release()
        report["busy"] = ["an unpickling that did not end"]
        return report
    try:
        _reload_in_order(mods, report)
        done = set(report["reloaded"])
        for a in list(server.actors.values()):
            cls = type(a.instance) if a.instance is not None else None
            if cls is None or cls.__module__ not in done:
                continue
            new = _lookup(sys.modules[cls.__module__], cls.__qualname__)
            if isinstance(new, type) and new is not cls:
                try:
                    report["actors"][a.actor_id] = _swap(a, new)
                except TypeError as e:
                    report["failed"][f"{cls.__module__} (actor {a.name})"] = \
                        f"the live actor keeps its old class: {e}"
    finally:
        lock.release()
        gate.release()
    _applied = manifest
    return report


def _reload_in_order(mods: dict[str, str], report: dict) -> None:
    failed: set[str] = set()
    for name in reload_order(mods):
        mod = sys.modules.get(name)
        if mod is None:
            continue
        deps = _imports(name, mods[name], mods[name].endswith("__init__.py"))
        if deps & failed:
            report["skipped"].append(name)
            failed.add(name)
            continue
        old = dict(mod.__dict__)
        try:
            importlib.reload(mod)
            report["reloaded"].append(name)
        except BaseException:  # noqa: BLE001 - reported; the module keeps its old code
            mod.__dict__.clear()
            mod.__dict__.update(old)
            sys.modules[name] = mod
            report["failed"][name] = traceback.format_exc()
            failed.add(name)


def swap_class(server: Any, a: Any, body: Any, buffers: list) -> dict:
    """On actor `a`'s thread, between two of its messages: its instance takes the class
    sent by value (a re-defined notebook class), its state kept."""
    new = serialization.loads(body, buffers, serialized=True)
    if a.instance is None:
        raise RuntimeError(f"actor {a.name}[{a.rank}] has no instance (starting or failed)")
    return _swap(a, new)


def on_message(server: Any, h: Header, body: Any, buffers: list) -> None:
    """A WORKSPACE message to this proc (I/O thread): a reload runs on its own thread, a
    class swap on the actor's thread (between two of its messages, with no concurrent
    call in progress); each answers on the caller's port."""
    e = h.extra or {}

    def answer(status: int, out: Any) -> None:
        data = json.dumps(out).encode() if status == OK else str(out).encode()
        server.rt.send(h.reply, Header(Kind.REPLY, port=h.port, status=status,
                                       rank=server.cfg.get("rank", -1)), data)

    def run(fn: Any, *args: Any) -> None:
        try:
            out = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - to the caller
            answer(ERROR, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        else:
            answer(OK, out)

    if e.get("op") == "reload":
        t0 = time.monotonic()
        args = (server, e["root"], e.get("sources") or {}, float(e.get("timeout", 60.0)))
        threading.Thread(target=lambda: run(_timed, t0, *args), name="monarch-reload",
                         daemon=True).start()
    elif e.get("op") == "path":  # a sync without reload: new imports find the synced code
        threading.Thread(target=lambda: run(put_on_path, e["root"], e.get("sources") or {}),
                         name="monarch-reload", daemon=True).start()
    elif e.get("op") == "swap":
        a = server.actors.get(e.get("actor", ""))
        if a is None:
            answer(ERROR, f"no actor {e.get('actor')} in proc {server.rt.proc_id}")
            return
        timeout = float(e.get("timeout", 60.0))

        def busy(actor: Any) -> None:
            answer(ERROR, f"actor {actor.name}[{actor.rank}] keeps its old class: "
                          f"{_doing(actor)} past {timeout:g} s (workspace_timeout)")

        a.mailbox.put(("run", between_calls(
            a, time.monotonic() + timeout,
            lambda actor: run(swap_class, server, actor, body, buffers), busy, {})))
    else:
        answer(ERROR, f"unknown workspace op {e.get('op')!r}")


def _timed(t0: float, *args: Any) -> dict:
    out = reload_modules(*args)
    out["seconds"] = time.monotonic() - t0
    return out
