"""Load and unload the %mesh magics into an IPython shell, and route remote output.

One `NotebookSession` per process: it owns the output router installed as the runtime's
output sink, and follows cells (pre/post run) so remote output lands in the right cell.
A runtime start-up hook (`runtime.hooks.add_startup_hook`) installs the sink as soon as
any code starts the runtime; loading also installs the views' display hook, so meshes
show as health grids.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Optional

from monarch_kernel.output import OutputRouter, kernel_writer

_lock = threading.Lock()
_session: Optional["NotebookSession"] = None


class NotebookSession:
    """The kernel-side state of the notebook controller."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.router = OutputRouter(kernel_writer())
        self.sink_rt: Any = None  # the runtime our sink is installed on
        self.magics: Any = None
        self.jobs: dict[int, tuple[Any, Any]] = {}  # id(ProcMesh) -> (ProcMesh, Job)
        self.active_mesh: Any = None  # %mesh activate: (variable, ProcMesh, context, thread)

    def kill_jobs(self) -> None:
        """End every job `%mesh alloc --job` started (cancels cluster allocations)."""
        jobs, self.jobs = list(self.jobs.values()), {}
        for _, job in jobs:
            try:
                job.kill()
            except Exception as e:  # the others must still end
                print(f"monarch_kernel: ending a {job.kind} job failed: {e}", file=sys.__stderr__)

    # -- cell tracking ---------------------------------------------------------------
    def current_parent(self) -> Optional[dict]:
        """The parent message of the running cell (None outside a kernel)."""
        get_parent = getattr(self.shell, "get_parent", None)
        if get_parent is None:
            return None
        try:
            parent = get_parent()
        except Exception:
            return None
        return parent or None

    def pre_run_cell(self, info: Any = None) -> None:
        self.router.set_target(self.current_parent())
        self._adopt_runtime()

    def post_run_cell(self, result: Any = None) -> None:
        self._adopt_runtime()
        rt = self.sink_rt
        if rt is not None and _running_runtime() is rt and rt.meshes():
            self.router.settle()  # a short grace for remote output still on its way
            rt.flush_output()  # lines held by logging_option(aggregate_window_sec=...)
        self.router.flush()

    def _adopt_runtime(self) -> None:
        """Route output of a runtime that plain code (not a magic) started."""
        rt = _running_runtime()
        if rt is not None and rt is not self.sink_rt:
            self.install_sink()

    def on_runtime_start(self, rt: Any) -> None:
        """Start-up hook: route the new runtime's remote output here at once."""
        if _session is self and rt is not self.sink_rt:
            rt.set_output_sink(self.router)
            self.sink_rt = rt

    # -- the runtime's output sink -----------------------------------------------------
    def install_sink(self) -> None:
        """Make the runtime send remote output here (idempotent; starts the runtime)."""
        from runtime import get_runtime

        rt = get_runtime()
        if rt is not self.sink_rt:
            rt.set_output_sink(self.router)
            self.sink_rt = rt

    def remove_sink(self) -> None:
        rt, self.sink_rt = self.sink_rt, None
        if rt is not None:
            try:
                rt.set_output_sink(None)
            except Exception:
                pass


def _running_runtime() -> Any:
    """The runtime if this process started one, else None (never starts it, nor imports
    the runtime package)."""
    mod = sys.modules.get("runtime")
    current = getattr(mod, "current_runtime", None)
    return current() if current is not None else None


def _add_matcher(shell: Any) -> None:
    """Tab on %mesh/%%mesh lines and on actor meshes (monarch_kernel.completion)."""
    from monarch_kernel.completion import mesh_matcher

    completer = getattr(shell, "Completer", None)
    if completer is not None and mesh_matcher not in completer.custom_matchers:
        completer.custom_matchers.append(mesh_matcher)


def session() -> Optional[NotebookSession]:
    return _session


def load(shell: Any) -> None:
    """Register magics and cell hooks (loading twice is a no-op)."""
    global _session
    from monarch_kernel.magics import MeshMagics

    from monarch_kernel.parso_cache import harden

    harden()  # Tab completion here and on the procs shares parso's cache
    with _lock:
        if _session is not None and _session.shell is shell:
            return
        sess = NotebookSession(shell)
        sess.magics = MeshMagics(shell, sess)
        shell.register_magics(sess.magics)
        shell.events.register("pre_run_cell", sess.pre_run_cell)
        shell.events.register("post_run_cell", sess.post_run_cell)
        _add_matcher(shell)
        _session = sess
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
    if _running_runtime() is not None:
        sess.install_sink()


def unload(shell: Any) -> None:
    """Undo `load`: magics stay registered by IPython, but output routing stops."""
    global _session
    with _lock:
        sess, _session = _session, None
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
    sess.remove_sink()


def shutdown_all() -> None:
    """Stop every mesh this process created and the runtime with them (kernel shutdown),
    and end the jobs the magics started."""
    if _session is not None:
        _session.kill_jobs()
    if _running_runtime() is None:
        return
    import runtime

    try:
        runtime.shutdown()
    except Exception as e:  # shutdown must go on: the kernel is leaving
        print(f"monarch_kernel: runtime shutdown failed: {e}", file=sys.__stderr__)
