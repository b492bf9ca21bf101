"""%mesh list, status, stop, interrupt, and the views' attach and admin."""

from __future__ import annotations

import html
import time
from typing import Any

from IPython.core.error import UsageError

from monarch_kernel import args as margs
from monarch_kernel.mesh_text import actor_state, fmt_sizes, proc_state
from monarch_kernel.tables import Rendered, Table

__all__ = ["InventoryCommands"]


class InventoryCommands:
    """What is running, and stopping it."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    # -- %mesh list / status -------------------------------------------------------------------
    def _vars_for(self, obj: Any) -> str:
        return ", ".join(k for k, v in self.ctx.ns.items() if v is obj and not k.startswith("_"))

    def list(self, a: margs.ListArgs) -> Any:
        from runtime import ActorMesh, ProcMesh

        from monarch_kernel.session import running_runtime

        rt = running_runtime()
        t = Table(["name", "variable", "kind", "shape", "state"], title="meshes")
        if rt is not None:
            for obj in rt.meshes():  # the user's: internal meshes are left out
                if isinstance(obj, ProcMesh):
                    active = getattr(self.ctx.session, "active_mesh", None)
                    mark = " (active)" if active is not None and active[1] is obj else ""
                    t.add(obj.name, self._vars_for(obj), "procs", fmt_sizes(obj.sizes),
                          proc_state(rt, obj) + mark + _kept(obj))
                elif isinstance(obj, ActorMesh):
                    t.add(obj.name, self._vars_for(obj), f"actors ({obj.class_name})",
                          fmt_sizes(obj.sizes), actor_state(rt, obj) + _kept(obj.proc_mesh))
        return t

    def status(self, a: margs.StatusArgs) -> Any:
        from monarch_kernel.session import running_runtime

        rt = running_runtime()
        snaps = rt.health.snapshot() if rt is not None else []
        if a.name is not None:
            snaps = [m for m in snaps if a.name in (m.name, m.proc_mesh)
                     or m.name.split("~")[0] == a.name]
            if not snaps:
                live = [m for m in (rt.meshes() if rt is not None else [])
                        if getattr(m, "name", None) == a.name]
                if not live:
                    raise UsageError(f"%mesh status: no mesh named {a.name!r}; "
                                     "see %mesh list")
                pm = live[0]  # a proc mesh with no actors: nothing in the health model yet
                return Rendered(f"proc mesh {a.name} {fmt_sizes(pm.sizes)}: "
                                f"{proc_state(rt, pm)}, no actors")
        # proc meshes with no actor mesh of the user's (used only by %%mesh cells, whose
        # runners are internal): the health model has nothing of them, so say it here
        bare = [] if a.name is not None else self._bare_proc_meshes(rt, snaps)
        try:  # the views package: the live dashboard, and its text and HTML renderings
            import monarch_widgets
        except ImportError:
            monarch_widgets = None
        if monarch_widgets is not None:
            if a.name is None and not a.text:
                if bare:
                    print("\n".join(bare))
                return monarch_widgets.dashboard(self.ctx.runtime())
            from monarch_widgets.render import render_html, render_text

            if bare and not snaps:
                return Rendered("\n".join(bare))
            text = "\n".join([render_text(snaps)] + bare)
            return Rendered(text, None if a.text else render_html(snaps) + "".join(
                f"<div>{html.escape(b)}</div>" for b in bare))
        t = Table(["mesh", "rank", "coords", "state", "endpoint", "handled", "errors", "pid",
                   "for"], title="meshes")
        now = time.time()
        for m in snaps:
            for act in m.actors:
                t.add(m.name, act.rank, fmt_sizes(act.coords), act.state.value,
                      act.endpoint or "", act.handled, act.errors, act.pid or "",
                      f"{now - act.since:.0f} s")
        return t

    def _bare_proc_meshes(self, rt: Any, snaps: list) -> list[str]:
        """A line per live proc mesh with no actor mesh in the health model `snaps`."""
        from runtime import ProcMesh

        used = {m.proc_mesh for m in snaps}
        return [f"proc mesh {pm.name} {fmt_sizes(pm.sizes)}: {proc_state(rt, pm)}, no actor "
                "meshes (%%mesh cells only)"
                for pm in (rt.meshes() if rt is not None else [])
                if isinstance(pm, ProcMesh) and pm.root is pm and pm.name not in used]

    # -- %mesh attach / admin (the views and debugger packages) --------------------------------
    def attach(self, a: margs.AttachArgs) -> Any:
        try:
            from monarch_widgets import controls
        except ImportError:
            raise UsageError("%mesh attach: needs the monarch_widgets package") from None
        try:
            return Rendered(controls.attach(a.mesh, a.rank))
        except (RuntimeError, KeyError, ValueError) as e:
            raise UsageError(f"%mesh attach: {e}") from None

    def admin(self, a: margs.AdminArgs) -> Any:
        try:
            from monarch_widgets import controls
        except ImportError:
            raise UsageError("%mesh admin: needs the monarch_widgets package") from None
        return Rendered(controls.serve_admin(self.ctx.runtime()))

    # -- %mesh stop ------------------------------------------------------------------------------
    def cancel(self, a: margs.CancelArgs) -> None:
        """`%mesh cancel NAME...`: cancel the calls in flight to these meshes' actors."""
        for name in a.names:
            for m in self._meshes_named(name, "cancel"):
                n = type(m).cancel_calls(m)  # not an endpoint called cancel_calls
                print(f"%mesh cancel: {n} call(s) in flight to {m.name!r} cancelled")

    def kill(self, a: margs.KillArgs) -> None:
        """`%mesh kill NAME...`: SIGKILL the procs hosting these meshes; waits (30 s at
        most) until their deaths are known, so the next cell sees the failure."""
        for name in a.names:
            for m in self._meshes_named(name, "kill"):
                try:
                    type(m).kill(m).get(timeout=30)  # not an endpoint called kill
                except (ValueError, RuntimeError, KeyError) as e:
                    raise UsageError(f"%mesh kill: {name}: {e}") from None
                except TimeoutError:
                    print(f"%mesh kill: {m.name!r}: killed; no death report within 30 s")
                    continue
                from runtime import ProcMesh

                n = len(m.procs) if isinstance(m, ProcMesh) else m.size()
                print(f"%mesh kill: killed the {n} proc(s) hosting {m.name!r} (SIGKILL)")

    def why(self, a: margs.WhyArgs) -> None:
        """`%mesh why [MESH]`: why the actors of MESH (or of every mesh) are stuck."""
        import runtime

        if a.name is None:
            print(runtime.diagnose())
            return
        for m in self._meshes_named(a.name, "why"):
            print(runtime.diagnose(m))

    def stop(self, a: margs.StopArgs) -> Any:
        from runtime import ActorMesh, ProcMesh

        from monarch_kernel.session import running_runtime

        if a.all:
            rt = running_runtime()
            targets = [m for m in (rt.meshes() if rt is not None else [])
                       if isinstance(m, ProcMesh) and m.root is m]
            targets += [m for m in (rt.meshes() if rt is not None else [])
                        if isinstance(m, ActorMesh) and m.proc_mesh is None]
        else:
            targets = []
            for name in a.names:
                targets.extend(self._meshes_named(name))
        futs = [(m, type(m).stop(m)) for m in targets]  # not an endpoint called stop
        names = []
        for m, f in futs:
            try:
                f.get(timeout=15)
            except Exception as e:
                print(f"%mesh stop: {m.name!r}: {e}")
            names.append(m.name)
            if isinstance(m, ProcMesh):
                self.ctx.runners.pop(id(m.root), None)
                entry = self.ctx.session.jobs.pop(id(m.root), None)
                if entry is not None:  # a mesh allocated on its own job: end the job too
                    entry[1].kill()
                    self.ctx.session.ended_jobs[id(m.root)] = entry
                    names[-1] += f" (and its {entry[1].kind} job)"
        if a.all:
            self.ctx.session.kill_jobs()
        print(f"stopped {len(names)} mesh{'es' if len(names) != 1 else ''}"
              + (f": {', '.join(names)}" if names else ""))
        return None

    def _meshes_named(self, name: str, cmd: str = "stop") -> list:
        """The mesh in variable `name`, else the live meshes whose name is `name`."""
        from runtime import ActorMesh, ProcMesh

        from monarch_kernel.session import running_runtime

        obj = self.ctx.ns.get(name)
        if isinstance(obj, (ProcMesh, ActorMesh)):
            return [obj]
        rt = running_runtime()
        found = [m for m in (rt.meshes() if rt is not None else [])
                 if name in (getattr(m, "name", None), getattr(m, "health_name", None))]
        if not found:
            what = (f"is a {type(obj).__name__}, not a mesh" if name in self.ctx.ns
                    else "is neither a mesh variable nor a live mesh's name")
            raise UsageError(f"%mesh {cmd}: {name!r} {what}; see %mesh list")
        return found

    # -- %mesh interrupt ------------------------------------------------------------------------
    def interrupt(self, a: margs.InterruptArgs) -> Any:
        from runtime.config import config

        if a.mode is not None:
            config.interrupt_remote = a.mode == "remote"
        mode = "remote" if config.interrupt_remote else "local"
        print(f"interrupt mode: {mode} ("
              + ("Ctrl-C also interrupts the remote actors of the call"
                 if mode == "remote" else "Ctrl-C only cancels the wait") + ")")
        return None



def _kept(pm: Any) -> str:
    """For `%mesh list`: how long a kept proc mesh outlives this kernel ('' if it does not)."""
    keep = getattr(pm, "keep", 0) if pm is not None else 0
    if not keep:
        return ""
    return (f", kept: lease ends {keep:g} s after this kernel goes away "
            "(%mesh attach-job reattaches)")
