"""The kernel's session: the one `NotebookSession` of this process (the output router, the
jobs the magics started, the active mesh) and `running_runtime()`.

A leaf of monarch_kernel: the loader (`extension`), the magics and completion read the
session here; none of them imports another to find it.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Optional

from monarch_kernel.output import OutputRouter, kernel_writer

__all__ = ["NotebookSession", "current", "lock", "running_runtime", "set_current"]

#: held while the loader installs or removes the session
lock = threading.Lock()
_current: Optional["NotebookSession"] = None


def current() -> Optional["NotebookSession"]:
    """This process's session, or None (the magics are not loaded)."""
    return _current


def set_current(sess: Optional["NotebookSession"]) -> Optional["NotebookSession"]:
    """Make `sess` this process's session (the loader, under `lock`); returns the old one."""
    global _current
    old, _current = _current, sess
    return old


def cell_interrupted(result: Any) -> bool:
    """Whether a cell ended by an interrupt: IPython's ExecutionResult with a
    KeyboardInterrupt (or asyncio's CancelledError), or None (ipykernel reports an awaiting
    cell cancelled by the stop button without a result)."""
    import asyncio

    if result is None:
        return True
    err = getattr(result, "error_in_exec", None)
    return isinstance(err, (KeyboardInterrupt, asyncio.CancelledError))


class NotebookSession:
    """The kernel-side state of the notebook controller."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.router = OutputRouter(kernel_writer())
        self.sink_rt: Any = None  # the runtime our sink is installed on
        self.magics: Any = None
        self.jobs: dict[int, tuple[Any, Any]] = {}  # id(ProcMesh) -> (ProcMesh, Job)
        #: id(ProcMesh) -> (ProcMesh, Job) of meshes `%mesh stop` ended with their job
        self.ended_jobs: dict[int, tuple[Any, Any]] = {}
        self.active_mesh: Any = None  # %mesh activate: (variable, ProcMesh, context, thread)
        self.cell_calls: Any = None  # the running cell's runtime.CallScope

    def kill_jobs(self, leave_kept: bool = False) -> None:
        """End every job `%mesh alloc --job` started (cancels cluster allocations); with
        `leave_kept` (the kernel is leaving) a kept job (`--keep`) is left to its lease."""
        jobs, self.jobs = list(self.jobs.values()), {}
        for _, job in jobs:
            if leave_kept and getattr(job, "keep", 0):
                print(f"monarch_kernel: {job.kind} job {job.meshes} kept for {job.keep:g} s; "
                      f"reattach with %mesh attach-job {getattr(job, 'saved_path', 'PATH')}",
                      file=sys.__stderr__)
                continue
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
        """A cell starts: route output to it, and collect the calls it starts."""
        self.router.set_target(self.current_parent())
        self._adopt_runtime()
        self._open_cell_calls()

    def post_run_cell(self, result: Any = None) -> None:
        """A cell ended: if it was interrupted, cancel the calls it started that still run;
        let its remote output in."""
        self._close_cell_calls(result)
        self._adopt_runtime()
        rt = self.sink_rt
        if rt is not None and running_runtime() is rt and rt.meshes():
            self.router.settle()  # a short grace for remote output still on its way
            rt.flush_output()  # lines held by logging_option(aggregate_window_sec=...)
        self.router.flush()

    def _open_cell_calls(self) -> None:
        """Open a CallScope for this cell (Ctrl-C in it interrupts only its own calls)."""
        from runtime import CallScope

        if self.cell_calls is not None:  # a cell whose end was never reported
            self.cell_calls.close()
        self.cell_calls = CallScope().open()

    def _close_cell_calls(self, result: Any) -> None:
        """Close the cell's CallScope; an interrupted cell (KeyboardInterrupt, or None: the
        kernel cancelled an awaiting cell) cancels the calls it started that still run,
        and says which. Calls of earlier cells go on."""
        scope, self.cell_calls = self.cell_calls, None
        if scope is None:
            return
        scope.close()
        if not cell_interrupted(result):
            return
        cancelled = scope.cancel()
        if cancelled:
            shown = ", ".join(cancelled[:3]) + (f" and {len(cancelled) - 3} more"
                                                if len(cancelled) > 3 else "")
            print(f"interrupted: cancelled {len(cancelled)} call"
                  f"{'s' if len(cancelled) > 1 else ''} this cell started ({shown}); "
                  "calls of earlier cells go on", file=sys.stderr, flush=True)

    def _adopt_runtime(self) -> None:
        """Route output of a runtime that plain code (not a magic) started."""
        rt = running_runtime()
        if rt is not None and rt is not self.sink_rt:
            self.install_sink()

    def on_runtime_start(self, rt: Any) -> None:
        """Start-up hook: route the new runtime's remote output here at once."""
        if _current is self and rt is not self.sink_rt:
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


def running_runtime() -> Any:
    """The runtime if this process started one, else None (never starts it, nor imports
    the runtime package)."""
    mod = sys.modules.get("runtime")
    current = getattr(mod, "current_runtime", None)
    return current() if current is not None else None
