"""Tab and Shift-Tab that know the mesh, on the kernel side.

- A `%%mesh NAME` cell's body completes and inspects against one proc's live namespace
  (the first rank of the selection), answered by its `CellCompleter` actor
  (`monarch_kernel.remote.complete`); `MonarchKernel.do_complete`/`do_inspect` call
  `complete_cell`/`inspect_cell` here. The wait is bounded (`REMOTE_TIMEOUT_S`); a
  timeout, a stopped mesh, a mesh with no %%mesh cell run yet (a Tab never spawns actors)
  or any error gives the local answer: builtins, keywords and what the cell's own text
  defines, never the controller's names. One request per mesh is in flight at a time, so
  a stuck proc costs one wait, then answers locally at once until it replies.
- `mesh_matcher`, an IPython matcher (in any IPython with the extension): the `%%mesh`
  line and `%mesh` line magics (sub-commands, mesh names, actor classes, flags,
  dimensions), and actor meshes in notebook code (`actors.` lists endpoints first,
  `actors.step.` the adverbs, `vm.item(` and `procs.slice(` the dimensions).

Cursor positions are code points, as the Jupyter protocol (5.2+) counts them (JupyterLab
converts from its UTF-16 offsets before sending).
"""

from __future__ import annotations

import asyncio
import re
import threading
from dataclasses import dataclass
from typing import Any, Optional

from IPython.core.completer import SimpleCompletion, context_matcher

from monarch_kernel import args as margs

__all__ = [
    "REMOTE_TIMEOUT_S", "MeshCell", "split_mesh_cell", "complete_cell", "inspect_cell",
    "mesh_matcher",
]

#: How long the kernel waits for the proc's answer before answering locally (seconds).
REMOTE_TIMEOUT_S = 0.5
_EXPERIMENTAL = "_jupyter_types_experimental"

_inflight: dict[str, Any] = {}  # completer mesh name -> the runtime Future still pending
_inflight_lock = threading.Lock()


# -- splitting a %%mesh cell ----------------------------------------------------------------

@dataclass
class MeshCell:
    """A `%%mesh` cell: its header's arguments and where its body starts (code points)."""

    line: str  # the magic's arguments (after "%%mesh")
    header_start: int
    body_start: int


_HEADER = re.compile(r"(?:[ \t]*\n)*(%%mesh)(?=[ \t\n]|$)([^\n]*)(\n|$)")


def split_mesh_cell(code: str) -> Optional[MeshCell]:
    """The `%%mesh` header of `code` (leading blank lines allowed), or None."""
    m = _HEADER.match(code)
    if m is None:
        return None
    # A header with no newline yet has no body: the cursor is on the header.
    body = m.end(3) if m.group(3) else len(code) + 1
    return MeshCell(line=m.group(2), header_start=m.start(1), body_start=body)


def _target(shell: Any, cell: MeshCell) -> Any:
    """The CellCompleter mesh of one actor (first rank of the cell's selection), or None."""
    from runtime import ActorMesh, ProcMesh

    from monarch_kernel.session import current as session, running_runtime

    sess = session()
    if sess is None or sess.magics is None or running_runtime() is None:
        return None
    try:
        a = margs.parse_mesh_cell(cell.line)
    except (margs.MagicArgError, margs.MagicHelp):
        return None
    obj = shell.user_ns.get(a.mesh)
    if isinstance(obj, ActorMesh):
        obj = obj.proc_mesh
    if not isinstance(obj, ProcMesh) or obj.stopped:
        return None
    comp = sess.magics.completer_for(obj)
    if comp is None:
        return None
    if a.ranks:
        comp = comp.slice(**a.ranks)
    first = {dim: 0 for dim in comp.sizes}
    return comp.slice(**first) if first else comp


async def _ask(mesh: Any, method: str, *args: Any, timeout: float) -> Any:
    """`mesh.method.call_one(*args)`'s value within `timeout`, else why not (a str: answer
    locally); single-flight."""
    key = mesh.health_name or mesh.name  # one per completer mesh, whatever the slice
    with _inflight_lock:
        pending = _inflight.get(key)
        if pending is not None and not pending.done():
            return "pending"  # still waiting for an earlier answer: answer locally at once
        fut = getattr(mesh, method).call_one(*args)
        _inflight[key] = fut
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future = loop.create_future()

    def done(_: Any) -> None:
        def settle() -> None:
            if not waiter.done():
                waiter.set_result(None)

        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop closed meanwhile
            pass

    fut.add_done_callback(done)
    try:
        await asyncio.wait_for(waiter, timeout)
    except asyncio.TimeoutError:
        return "timeout"
    if fut.exception() is not None:
        return "failed"
    return fut.get()


# -- completion of a %%mesh cell's body -------------------------------------------------------

def _reply(items: list[dict], cursor: int, shift: int, source: dict) -> dict:
    for it in items:
        it["start"] += shift
        it["end"] += shift
    start = items[0]["start"] if items else cursor
    end = items[0]["end"] if items else cursor
    return {"status": "ok", "matches": [it["text"] for it in items], "cursor_start": start,
            "cursor_end": end, "metadata": {_EXPERIMENTAL: items, "monarch": source}}


_BINDS = re.compile(r"^[ \t]*(?:(?:async[ \t]+)?def|class)[ \t]+([A-Za-z_]\w*)"
                    r"|\b([A-Za-z_]\w*)[ \t]*(?::[^=\n]*)?=(?!=)"
                    r"|^[ \t]*(?:from[ \t]+\S+[ \t]+)?import[ \t]+([^\n#]+)"
                    r"|\bfor[ \t]+([A-Za-z_]\w*)[ \t]+in\b", re.M)


def _text_names(body: str) -> dict[str, None]:
    """The names the cell's text binds (assignments, def, class, import, for), as a
    namespace of placeholders: the local answer's names without the controller's."""
    names: dict[str, None] = {}
    for m in _BINDS.finditer(body):
        if m.group(3):
            for part in m.group(3).split(","):
                word = part.strip(" ()\t").split(" as ")[-1].split(".")[0].strip()
                if word.isidentifier():
                    names[word] = None
        else:
            name = m.group(1) or m.group(2) or m.group(4)
            names[name] = None
    return names


async def _ask_cell(shell: Any, code: str, cursor: int, op: str, *args: Any,
                    timeout: float) -> Optional[tuple]:
    """(cell, body, offset in body, the proc's answer or None, why None) for a cursor in a
    `%%mesh` body, else None. Never raises: a failed or late answer is None (answer
    locally), why: "timeout" (none within `timeout`), "pending" (an earlier request is
    still unanswered: no wait), "failed", "no completer"."""
    cell = split_mesh_cell(code)
    if cell is None or cursor < cell.body_start:
        return None
    body, off = code[cell.body_start:], cursor - cell.body_start
    try:
        target = _target(shell, cell)
        out = "no completer" if target is None else await _ask(target, op, body, off, *args,
                                                               timeout=timeout)
    except Exception:  # completion must never fail the kernel
        out = "failed"
    if isinstance(out, str):
        return cell, body, off, None, out
    return cell, body, off, out, ""


async def complete_cell(shell: Any, code: str, cursor: int,
                        timeout: float = REMOTE_TIMEOUT_S) -> Optional[dict]:
    """The complete_reply for a cursor in a `%%mesh` body, else None (the caller uses the
    ordinary completion, which `mesh_matcher` extends)."""
    from monarch_kernel.remote.complete import complete_in

    asked = await _ask_cell(shell, code, cursor, "complete", timeout=timeout)
    if asked is None:
        return None
    cell, body, off, out, why = asked
    if out is not None:
        source = {"source": "remote", "rank": out.get("rank"), "ms": out.get("ms"),
                  "partial": out.get("partial")}
    else:  # no jedi here: the kernel's own completer uses it on this thread
        out = complete_in(_text_names(body), body, off, jedi_budget=0)
        source = {"source": "local", "why": why}
    return _reply(out["items"], cursor, cell.body_start, source)


async def inspect_cell(shell: Any, code: str, cursor: int, detail_level: int = 0,
                       timeout: float = REMOTE_TIMEOUT_S) -> Optional[dict]:
    """The inspect_reply for a cursor in a `%%mesh` body, else None."""
    from monarch_kernel.remote.complete import inspect_in

    asked = await _ask_cell(shell, code, cursor, "inspect", detail_level, timeout=timeout)
    if asked is None:
        return None
    cell, body, off, out, _ = asked
    if out is None:
        out = inspect_in({}, body, off, detail_level)
    elif out["found"]:
        mesh = margs.parse_mesh_cell(cell.line).mesh
        out["data"]["text/plain"] = (f"[mesh {mesh} rank {out['rank']}]\n"
                                     + out["data"]["text/plain"])
    return {"status": "ok", "found": out["found"], "data": out["data"], "metadata": {}}


# -- the local matcher: magic lines and actor meshes --------------------------------------------

_CELL_FLAGS = ["--ranks", "--noblock", "--out", "--timeout", "--quiet", "--help"]
_LINE_FLAGS = {
    "alloc": ["--per-host", "--hosts", "--mesh-name", "--env", "--no-progress", "--timeout",
              "--job"],
    "spawn": ["--name", "--as"],
    "status": ["--text"],
    "stop": ["--all"],
}


def _meshes(ns: dict, kinds: tuple) -> list[str]:
    return sorted(k for k, v in ns.items() if not k.startswith("_") and isinstance(v, kinds))


def _actor_classes(ns: dict) -> list[str]:
    from runtime import Actor

    return sorted(k for k, v in ns.items() if not k.startswith("_") and isinstance(v, type)
                  and issubclass(v, Actor) and v is not Actor)


def _words(text: str) -> tuple[list[str], str]:
    """The complete words before the cursor, and the partial one at it."""
    parts = text.split()
    if text and not text[-1].isspace():
        return parts[:-1], parts[-1] if parts else ""
    return parts, ""


def _dims_after(ns: dict, mesh_var: str, frag: str, sep: str = ",") -> tuple[list, str]:
    """`DIM=` (or `DIM=INDEX`) completions for a `--ranks` value being typed."""
    mesh = ns.get(mesh_var)
    sizes = getattr(mesh, "sizes", None)
    if not isinstance(sizes, dict):
        return [], frag
    head, _, cur = frag.rpartition(sep)
    used = {p.split("=")[0] for p in head.split(sep) if p}
    if "=" in cur:  # DIM=<Tab>: the indices
        dim, _, idx = cur.partition("=")
        n = sizes.get(dim, 0)
        return [str(i) for i in range(min(n, 16)) if str(i).startswith(idx)], idx
    return [f"{d}=" for d in sizes if d not in used and d.startswith(cur)], cur


def _header_completions(ns: dict, line: str) -> tuple[list, str, str]:
    """(texts, fragment, type) for the `%%mesh` line up to the cursor (`line` excludes
    "%%mesh")."""
    from runtime import ActorMesh, ProcMesh

    words, frag = _words(line)
    if words and words[-1] == "--ranks" or frag.startswith("--ranks="):
        mesh = next((w for w in words if not w.startswith("-")), "")
        texts, f = _dims_after(ns, mesh, frag.removeprefix("--ranks="))
        return texts, f, "dimension"
    if frag.startswith("-"):
        return [f for f in _CELL_FLAGS if f.startswith(frag)], frag, "flag"
    if not [w for w in words if not w.startswith("-")]:
        return [m for m in _meshes(ns, (ProcMesh, ActorMesh)) if m.startswith(frag)], frag, \
            "mesh"
    return [], frag, ""


def _line_completions(ns: dict, line: str) -> tuple[list, str, str]:
    """(texts, fragment, type) for a `%mesh ...` line up to the cursor."""
    from runtime import ActorMesh, ProcMesh

    words, frag = _words(line)
    if not words:
        subs = list(margs._COMMANDS)
        return [s for s in subs if s.startswith(frag)], frag, "command"
    cmd, rest = words[0], words[1:]
    if frag.startswith("-"):
        return [f for f in _LINE_FLAGS.get(cmd, []) + ["--help"] if f.startswith(frag)], \
            frag, "flag"
    positional = [w for w in rest if not w.startswith("-")]
    if cmd == "spawn":
        if words[-1] in ("--name", "--as"):
            return [], frag, ""
        if not positional:
            return [m for m in _meshes(ns, (ProcMesh,)) if m.startswith(frag)], frag, "mesh"
        if len(positional) == 1:
            return [c for c in _actor_classes(ns) if c.startswith(frag)], frag, "class"
        return [], frag, ""
    if cmd in ("stop", "status"):
        return [m for m in _meshes(ns, (ProcMesh, ActorMesh)) if m.startswith(frag)
                and m not in positional], frag, "mesh"
    if cmd == "activate" and not positional:
        return [m for m in _meshes(ns, (ProcMesh,)) if m.startswith(frag)], frag, "mesh"
    if cmd == "interrupt" and not positional:
        return [m for m in ("remote", "local") if m.startswith(frag)], frag, "mode"
    if cmd == "alloc" and words[-1] == "--hosts":
        from runtime import HostMesh

        return [m for m in _meshes(ns, (HostMesh,)) if m.startswith(frag)], frag, "mesh"
    return [], frag, ""


_DOTTED = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\.(\w*)$")
_DIM_CALL = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\.(item|slice)\(([^()]*)$")


def _resolve_mesh_path(ns: dict, path: str) -> Any:
    """The object `path` names, walking only through meshes (endpoint lookups are plain
    dictionary reads): no property, no user `__getattr__` runs. None if it leaves meshes."""
    from runtime import ActorMesh, Endpoint

    head, *rest = path.split(".")
    obj = ns.get(head)
    for part in rest:
        if not isinstance(obj, ActorMesh) or part.startswith("_") or part not in _endpoints(obj):
            return None
        obj = getattr(obj, part)
    from runtime.shapes import MeshTrait

    return obj if isinstance(obj, (MeshTrait, Endpoint)) else None


def _endpoints(am: Any) -> list[str]:
    """The endpoint names of an actor mesh: what its `dir()` adds to the class's."""
    from runtime import ActorMesh

    return sorted(n for n in set(dir(am)) - set(dir(ActorMesh)) if not n.startswith("_"))


def _python_completions(ns: dict, before: str) -> tuple[list, str]:
    """[(text, type)] and the fragment, for actor meshes, endpoints and mesh dimensions."""
    from runtime import ActorMesh, Endpoint

    m = _DIM_CALL.search(before)
    if m is not None:
        obj = _resolve_mesh_path(ns, m.group(1))
        if obj is not None and not isinstance(obj, Endpoint):
            args = m.group(3)
            frag = re.search(r"(\w*)$", args).group(1)  # type: ignore[union-attr]
            used = set(re.findall(r"(\w+)\s*=", args))
            return [(f"{d}=", "dimension") for d in obj.sizes
                    if d not in used and d.startswith(frag)], frag
    m = _DOTTED.search(before)
    if m is None:
        return [], ""
    obj, frag = _resolve_mesh_path(ns, m.group(1)), m.group(2)
    if isinstance(obj, Endpoint):
        return [(a, "adverb") for a in Endpoint.ADVERBS if a.startswith(frag)], frag
    if isinstance(obj, ActorMesh):
        eps = [(e, "endpoint") for e in _endpoints(obj) if e.startswith(frag)]
        show_private = frag.startswith("_")
        rest = [(n, "method") for n in sorted(dir(ActorMesh)) if n.startswith(frag)
                and (show_private or not n.startswith("_"))]
        return eps + rest, frag
    return [], ""


@context_matcher(priority=100)
def mesh_matcher(context: Any) -> dict:
    """IPython matcher: `%%mesh`/`%mesh` lines and actor meshes (see the module doc)."""
    from monarch_kernel.session import current as session

    sess = session()
    shell = getattr(sess, "shell", None)
    ns = getattr(shell, "user_ns", None) or {}
    before = context.text_until_cursor
    lines = context.full_text.split("\n")
    first = next((i for i, ln in enumerate(lines) if ln.strip()), 0)
    texts: list = []
    frag, typ = "", ""
    try:
        stripped = before.lstrip()
        if context.cursor_line == first and stripped.startswith("%%mesh"):
            if stripped == "%%mesh" or not stripped[6:7].isspace():
                return {"completions": []}
            texts, frag, typ = _header_completions(ns, stripped[6:])
            pairs = [(t, typ) for t in texts]
        elif stripped.startswith("%mesh") and stripped[5:6].isspace():
            texts, frag, typ = _line_completions(ns, stripped[5:])
            pairs = [(t, typ) for t in texts]
        else:
            pairs, frag = _python_completions(ns, before)
    except Exception:  # a matcher must never break completion
        return {"completions": []}
    return {"completions": [SimpleCompletion(t, type=k) for t, k in pairs],
            "matched_fragment": frag, "suppress": bool(pairs), "ordered": True}
