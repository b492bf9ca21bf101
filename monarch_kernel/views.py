"""`%mesh status|stop|attach|admin` without a kernel session: the views' subcommands for a
plain IPython (`%load_ext monarch_widgets` registers them through `register_magic`).

The arguments are parsed by `monarch_kernel.args` (the grammar of the Monarch kernel's
`%mesh`); the actions are `monarch_widgets`' (`dashboard`, `render_text`, `controls`).
"""

from __future__ import annotations

from typing import Any, Optional

from monarch_kernel import args as margs

__all__ = ["Text", "handle", "run", "register_magic"]


class Text(str):
    """A str that notebooks display as preformatted text (no quotes)."""

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))


def handle(argv: list[str] | str, runtime: Any = None, widgets: bool = True) -> Any:
    """Run one view subcommand (`"status --text"`, `["stop", "trainers"]`, ...); returns
    what the cell should display. Bad arguments raise `args.MagicArgError` (a ValueError)."""
    try:
        cmd = margs.parse_view_line(argv)
    except margs.MagicHelp as h:
        return Text(h.text.rstrip("\n"))
    return run(cmd, runtime=runtime, widgets=widgets)


def run(cmd: Any, runtime: Any = None, widgets: bool = True) -> Any:
    """Run a parsed view subcommand (StatusArgs, StopArgs, AttachArgs or AdminArgs)."""
    from monarch_widgets import controls

    if isinstance(cmd, margs.StatusArgs):
        rt = _rt(runtime)
        if cmd.text or not widgets:
            from monarch_widgets.render import render_text

            snap = rt.health.snapshot()
            if cmd.name is not None:
                snap = [m for m in snap if cmd.name in (m.name, m.proc_mesh)]
            return Text(render_text(snap))
        if cmd.name is not None:
            raise ValueError("the dashboard shows every mesh; use --text to show one")
        from monarch_widgets import dashboard

        return dashboard(rt)
    if isinstance(cmd, margs.StopArgs):
        rt = _rt(runtime)
        names = list(cmd.names)
        if cmd.all:
            names = sorted({m.name for m in rt.meshes()})
        done = []
        for name in names:
            if cmd.all and name not in {m.name for m in rt.meshes()}:
                continue  # stopped with its proc mesh
            done.append(controls.stop_mesh(name, runtime=rt))
        return Text("\n".join(done) or "no live meshes")
    if isinstance(cmd, margs.AttachArgs):
        return Text(controls.attach(cmd.mesh, cmd.rank))
    if isinstance(cmd, margs.AdminArgs):
        return Text(controls.serve_admin(_rt(runtime)))
    raise ValueError(f"not a view subcommand: {cmd!r}")


def _rt(runtime: Any) -> Any:
    if runtime is not None:
        return runtime
    from runtime import get_runtime

    return get_runtime()


def register_magic(ip: Any) -> None:
    """Register a `%mesh` line magic with the view subcommands in `ip`, unless a `%mesh`
    is registered already (the Monarch kernel's, which has them all)."""
    if "mesh" in ip.magics_manager.magics.get("line", {}):
        return
    from IPython.core.error import UsageError

    def mesh(line: str) -> Optional[Any]:
        try:
            return handle(line)
        except (ValueError, KeyError, RuntimeError) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            raise UsageError(str(msg)) from None

    mesh.__doc__ = margs.VIEW_USAGE
    ip.register_magic_function(mesh, "line", "mesh")
