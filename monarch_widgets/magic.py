"""The view subcommands of `%mesh` (status, stop, attach, admin), for the kernel's magic.

`monarch_kernel` parses `%mesh ...` and delegates these subcommands to `handle(argv)`;
in a plain IPython kernel `%load_ext monarch_widgets` registers a `%mesh` with just these.
"""

from __future__ import annotations

import shlex
from typing import Any, Optional

from monarch_widgets import controls

USAGE = """usage:
  %mesh status [--text] [NAME]   live dashboard (or a text status) of every mesh, or of NAME
  %mesh stop NAME                stop a mesh (actor mesh or proc mesh) by name
  %mesh attach MESH RANK         attach the debugger to a paused actor
  %mesh admin                    how to attach the terminal admin (monarch-admin)"""


class _Text(str):
    """A str that notebooks display as preformatted text."""

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))


def handle(argv: list[str] | str, runtime: Any = None, widgets: bool = True) -> Any:
    """Run one view subcommand; returns what the cell should display."""
    if isinstance(argv, str):
        argv = shlex.split(argv)
    if not argv:
        return _Text(USAGE)
    cmd, rest = argv[0], argv[1:]
    if cmd == "status":
        text = "--text" in rest
        names = [a for a in rest if a != "--text"]
        if len(names) > 1:
            raise ValueError(f"%mesh status takes at most one mesh name, got {names}")
        rt = _rt(runtime)
        if text or not widgets:
            from monarch_widgets.render import render_text

            snap = rt.health.snapshot()
            if names:
                snap = [m for m in snap if names[0] in (m.name, m.proc_mesh)]
            return _Text(render_text(snap))
        from monarch_widgets import dashboard

        if names:
            raise ValueError("the dashboard shows every mesh; use --text to show one")
        return dashboard(rt)
    if cmd == "stop":
        if len(rest) != 1:
            raise ValueError("usage: %mesh stop NAME")
        return _Text(controls.stop_mesh(rest[0], runtime=_rt(runtime)))
    if cmd == "attach":
        if len(rest) != 2 or not rest[1].isdigit():
            raise ValueError("usage: %mesh attach MESH RANK (RANK an integer)")
        return _Text(controls.attach(rest[0], int(rest[1])))
    if cmd == "admin":
        from runtime.admin import serve

        srv = serve(_rt(runtime))
        return _Text(f"admin endpoint {srv.address}\nconnection file {srv.connection_file}\n"
                     f"attach with: monarch-admin -f {srv.connection_file}")
    raise ValueError(f"unknown %mesh subcommand {cmd!r}\n{USAGE}")


def _rt(runtime: Any) -> Any:
    if runtime is not None:
        return runtime
    from runtime import get_runtime

    return get_runtime()


def load_ipython_extension(ip: Any) -> None:
    """`%load_ext monarch_widgets`: a `%mesh` line magic with the view subcommands,
    unless a `%mesh` is already registered (the monarch kernel's)."""
    if "mesh" in ip.magics_manager.magics.get("line", {}):
        return

    def mesh(line: str) -> Optional[Any]:
        return handle(line)

    ip.register_magic_function(mesh, "line", "mesh")
