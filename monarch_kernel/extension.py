"""Load and unload the %mesh magics into an IPython shell, and route remote output.

One `NotebookSession` per process (`monarch_kernel.session`): it owns the output router
installed as the runtime's output sink, and follows cells (pre/post run) so remote output
lands in the right cell. A runtime start-up hook (`runtime.hooks.add_startup_hook`)
installs the sink as soon as any code starts the runtime; loading also installs the views'
display hook, so meshes show as health grids.
"""

from __future__ import annotations

import sys
from typing import Any

from monarch_kernel import session as _sessions
from monarch_kernel.session import NotebookSession, running_runtime

__all__ = ["load", "unload", "shutdown_all"]


def _add_matcher(shell: Any) -> None:
    """Tab on %mesh/%%mesh lines and on actor meshes (monarch_kernel.completion)."""
    from monarch_kernel.completion import mesh_matcher

    completer = getattr(shell, "Completer", None)
    if completer is not None and mesh_matcher not in completer.custom_matchers:
        completer.custom_matchers.append(mesh_matcher)


def load(shell: Any) -> None:
    """Register magics and cell hooks (loading twice is a no-op)."""
    from monarch_kernel.magics import MeshMagics

    from monarch_kernel.remote.parso_cache import harden

    harden()  # Tab completion here and on the procs shares parso's cache
    with _sessions.lock:
        current = _sessions.current()
        if current is not None and current.shell is shell:
            return
        sess = NotebookSession(shell)
        sess.magics = MeshMagics(shell, sess)
        shell.register_magics(sess.magics)
        shell.events.register("pre_run_cell", sess.pre_run_cell)
        shell.events.register("post_run_cell", sess.post_run_cell)
        _add_matcher(shell)
        _sessions.set_current(sess)
    from monarch_kernel import tracebacks

    tracebacks.install(shell)  # the runtime's errors show the user's lines, not runtime's
    from runtime.hooks import add_startup_hook

    add_startup_hook(sess.on_runtime_start)
    try:  # meshes display as health grids (the views' hook into runtime.hooks)
        import monarch_widgets

        monarch_widgets.install_display_hook()
    except ImportError:
        pass
    try:  # breakpoint() in actors: the prompt in the waiting cell, the dashboard's attach
        from monarch_kernel import debugger

        debugger.install(shell)
    except Exception:  # the debugger is optional for the magics; say why it is missing
        import logging

        logging.getLogger("monarch_kernel").exception("debugger not installed")
    # Output may already be flowing if meshes exist (e.g. %load_ext after creating some).
    if running_runtime() is not None:
        sess.install_sink()


def unload(shell: Any) -> None:
    """Undo `load`: magics stay registered by IPython, but output routing stops."""
    with _sessions.lock:
        sess = _sessions.set_current(None)
    if sess is None:
        return
    for name, fn in (("pre_run_cell", sess.pre_run_cell), ("post_run_cell", sess.post_run_cell)):
        try:
            shell.events.unregister(name, fn)
        except ValueError:
            pass
    from monarch_kernel.completion import mesh_matcher
    from runtime.hooks import remove_startup_hook

    completer = getattr(shell, "Completer", None)
    if completer is not None and mesh_matcher in completer.custom_matchers:
        completer.custom_matchers.remove(mesh_matcher)
    remove_startup_hook(sess.on_runtime_start)
    if sess.cell_calls is not None:  # unloaded inside a cell: its post_run_cell never comes
        sess.cell_calls.close()
        sess.cell_calls = None
    sess.remove_sink()


def shutdown_all() -> None:
    """Stop every mesh this process created and the runtime with them (kernel shutdown),
    and end the jobs the magics started."""
    sess = _sessions.current()
    if sess is not None:
        sess.kill_jobs(leave_kept=True)  # a kept job waits for the next kernel
    if running_runtime() is None:
        return
    import runtime

    try:
        runtime.shutdown()
    except Exception as e:  # shutdown must go on: the kernel is leaving
        print(f"monarch_kernel: runtime shutdown failed: {e}", file=sys.__stderr__)
