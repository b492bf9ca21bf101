"""%mesh timeline and %mesh stacks: what a mesh's procs did over the last minutes
(`runtime.read_timeline`, drawn by `monarch_widgets.timeline_html`), and every thread of
its procs taken from outside by py-spy (`runtime.proc_stacks`)."""

from __future__ import annotations

import os
from typing import Any

from IPython.core.error import UsageError

from monarch_kernel import args as margs

__all__ = ["ObserveCommands"]


def _display(html: str, text: str) -> None:
    from IPython.display import display

    display({"text/html": html, "text/plain": text}, raw=True)


class ObserveCommands:
    """`%mesh timeline [MESH] [--last S] [--save PATH] [--text]` and
    `%mesh stacks MESH [--rank R] [--native] [--timeout S]`."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def _meshes(self, name: Any, what: str) -> list[Any]:
        """The proc meshes named by `name` (a variable or a proc mesh's name; None: all)."""
        from runtime import ActorMesh, ProcMesh, get_runtime

        if name is not None:
            obj = self.ctx.ns.get(name)
            if isinstance(obj, ActorMesh) and obj.proc_mesh is not None:
                obj = obj.proc_mesh
            if isinstance(obj, ProcMesh):
                return [obj]
        live = [m for m in get_runtime().meshes() if isinstance(m, ProcMesh)
                and not m.stopped and m.root is m and (name is None or m.name == name)
                and not m.name.startswith("_")]
        if name is not None and not live:
            raise UsageError(f"%mesh {what}: no live proc mesh {name!r} (a ProcMesh or "
                             "ActorMesh variable, or a proc mesh's name)")
        return live

    def timeline(self, a: margs.TimelineArgs) -> None:
        """Draw (or summarise, --text) each mesh's timeline; --save writes a Chrome trace."""
        from monarch_widgets.timeline_view import timeline_html
        from runtime import read_timeline

        meshes = self._meshes(a.mesh, "timeline")
        if not meshes:
            print("no live proc mesh to draw")
            return
        for i, pm in enumerate(meshes):
            tl = read_timeline(pm, last=a.last)
            text = str(tl)
            if a.save:
                path = a.save if len(meshes) == 1 else \
                    "{0}.{2}{1}".format(*os.path.splitext(a.save), pm.name)
                try:
                    tl.save_chrome_trace(path)
                except OSError as e:
                    raise UsageError(f"%mesh timeline: cannot write {path}: {e}") from None
                text += f"\nChrome trace written to {path} (open in ui.perfetto.dev)"
            if a.text:
                print(text)
            else:
                _display(timeline_html(tl) + (f"<div>Chrome trace: {path}</div>"
                                              if a.save else ""), text)

    def stacks(self, a: margs.StacksArgs) -> None:
        """Print every thread of the mesh's procs, taken by py-spy from their host agents."""
        from runtime import proc_stacks

        meshes = self._meshes(a.mesh, "stacks")
        try:
            got = proc_stacks(meshes[0], rank=a.rank, native=a.native, timeout=a.timeout)
        except ValueError as e:
            raise UsageError(f"%mesh stacks: {e}") from None
        print("\n\n".join(str(s) for s in got))
