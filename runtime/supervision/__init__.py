"""Supervision: failures as data (MeshFailure), and what happens at the root when nobody
handles one (`unhandled_fault_hook`).

Layer 1 (basics): imports only other basics (`config`, `_process`, `_features`); the
fail-fast shutdown reaches the core through `runtime._base.features`.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from .._base import features as _features
from ..config import config
from .health import ActorHealth, ActorState, HealthEvent, HealthModel, MeshHealth, ProcStats

__all__ = [
    "MeshFailure", "ActorState", "ActorHealth", "MeshHealth", "HealthEvent", "HealthModel",
    "ProcStats", "default_unhandled_fault_hook", "is_interactive",
]


@dataclass
class MeshFailure:
    """Actors of a mesh failed: which ranks, why, and what their process said last."""

    mesh: str
    ranks: list[int]
    cause: str
    host: str = ""
    pid: int = 0
    proc_id: str = ""
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    stderr_tail: list[str] = field(default_factory=list)
    traceback: str = ""
    time: float = field(default_factory=time.time)
    caused_by: Optional["MeshFailure"] = None
    #: the failed actor's point in its mesh, in Monarch's form ("{'gpus': 1/2}"), if known
    point: str = ""
    #: the failed actor's Monarch name (`<root>.<mod.Cls mesh{'gpus': 1/2}>`), if known
    actor_name: str = ""
    #: for an endpoint that failed the actor, Monarch's line: `Actor call mesh.ep failed with
    #: BaseException` (or `Exception`)
    call: str = ""
    # True once a waiting future has raised SupervisionError for it (the user saw it)
    seen_by_waiter: bool = False
    #: set when the actor that failed belongs to an internal mesh (one the runtime or a
    #: front-end spawned for its own work, such as a notebook's cell runner): that mesh's
    #: name; `mesh` then names the user's proc mesh it served, and no report names it
    internal: str = ""
    #: True for a failure `runtime.fault_injection.inject_actor_failures` caused (Monarch's
    #: `MeshFailure.is_injected`); a failure it caused further up (an owner that did not
    #: handle it) is not injected itself, its `caused_by` is
    is_injected: bool = False

    def serve(self, proc_mesh: str, internal: str) -> "MeshFailure":
        """Make this failure of an internal mesh the user's: reported against proc mesh
        `proc_mesh`, which the internal mesh `internal` served. Returns self."""
        self.mesh, self.internal, self.actor_name, self.call = proc_mesh, internal, "", ""
        return self

    def report(self) -> str:
        """A readable multi-line report."""
        if self.internal:
            return self._proc_report()
        lines = [f"MeshFailure: mesh {self.mesh!r} rank(s) {self.ranks} failed: {self.cause}"]
        lines += self._injected()
        lines += self._where("actor")
        # Monarch's failure report: who failed with all its descendants, and why
        lines.append(f"  The actor {self._name()} and all its descendants have failed:")
        lines.append(f"    {self._monarch_reason()}")
        if self.caused_by is not None:
            lines.append(f"  This occurred because the actor {self.caused_by._name()} failed.")
        elif not self.signal and self.exit_code is None:
            lines.append("  This occurred because the actor itself failed.")
        lines += self._evidence()
        if self.caused_by is not None:
            lines.append("  caused by:")
            lines.extend("    " + ln for ln in self.caused_by.report().splitlines())
        return "\n".join(lines)

    def _proc_report(self) -> str:
        """The report of an internal mesh's failure, about the user's proc mesh only."""
        ranks = ", ".join(map(str, self.ranks))
        lines = [f"MeshFailure: proc mesh {self.mesh!r} rank {ranks} failed: {self.cause}"]
        lines += self._injected()
        lines += self._where("proc")
        if not self.signal and self.exit_code is not None:
            lines.append(f"  the process exited with code {self.exit_code}")
        return "\n".join(lines + self._evidence())

    def _injected(self) -> list[str]:
        """A report line for a failure caused on purpose (`is_injected`)."""
        if not self.is_injected:
            return []
        return ["  injected on purpose (inject_actor_failures or %mesh chaos): "
                "MeshFailure.is_injected is True"]

    def _where(self, what: str) -> list[str]:
        """Report lines: which actor (or proc) of the mesh, on which host and pid, killed
        by which signal."""
        lines = [f"  {what} {self.mesh}{self.point}"] if self.point else []
        if self.host or self.pid:
            lines.append(f"  host {self.host}, pid {self.pid}, proc {self.proc_id}")
        if self.signal:
            from .._base.process import describe_status

            lines.append(f"  {describe_status(None, self.signal)}")
        return lines

    def _evidence(self) -> list[str]:
        """Report lines: the traceback and the last lines of stderr."""
        lines = []
        if self.traceback:
            lines.append("  traceback:")
            lines.extend("    " + ln for ln in self.traceback.rstrip().splitlines())
        if self.stderr_tail:
            lines.append("  last lines of stderr:")
            lines.extend("    " + ln for ln in self.stderr_tail)
        return lines

    def _name(self) -> str:
        """The failed actor's Monarch name, else its mesh and point."""
        return self.actor_name or f"{self.mesh}{self.point}"

    def _monarch_reason(self) -> str:
        """Why, in Monarch's words: its process's end (`the process this actor was running
        on failed: Killed(sig=9)`, `... exited with non-zero code 1`), else the cause."""
        if self.signal:
            return f"the process this actor was running on failed: Killed(sig={self.signal})"
        if self.exit_code:
            return ("the process this actor was running on exited with non-zero code "
                    f"{self.exit_code}")
        if self.exit_code is not None:
            return f"the process this actor was running on exited (code 0): {self.cause}"
        return self.cause

    def __str__(self) -> str:
        # the tag: Monarch's older "MeshFailure ... rank=N" and its "crashed_ranks=[N]"
        ranks = ",".join(map(str, self.ranks))
        return (f"mesh {self.mesh!r} rank(s) {self.ranks} failed: {self.cause} "
                f"(MeshFailure rank={ranks}, crashed_ranks={list(self.ranks)})")


def is_interactive() -> bool:
    """True in a REPL, IPython or a notebook kernel: failures must not end the process."""
    policy = config.fault_policy  # MONARCH_FAULT_POLICY: auto, raise or exit
    if policy == "raise":
        return True
    if policy == "exit":
        return False
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return True
    ip = sys.modules.get("IPython")
    if ip is not None:
        try:
            return ip.get_ipython() is not None
        except Exception:
            return False
    return False


_reported: set[str] = set()  # the failures reported (a proc, or a mesh and its ranks)
_report_lock = threading.Lock()

#: reports that arrive within this many seconds of each other are folded: the same failure
#: on N ranks (a failing `__init__` on every proc) is printed once, naming the ranks
FOLD_WINDOW_S = 0.1
#: a failure like one printed at most this long ago is one line naming its rank
LATE_S = 60.0
_batch: list[MeshFailure] = []
_batch_timer: Optional[threading.Timer] = None
_printed: dict[tuple, tuple[float, list[MeshFailure]]] = {}


def _report_interactive(failure: MeshFailure) -> None:
    """Print `failure` folded with the same failure on other ranks: the first of a batch
    starts a FOLD_WINDOW_S timer, whose end prints each group once; one that matches a
    report printed in the last LATE_S seconds gets one line."""
    global _batch_timer
    from .fold import failure_key, late_line

    with _report_lock:
        key = failure_key(failure)
        seen = _printed.get(key)
        if seen is None or time.monotonic() - seen[0] > LATE_S:
            _batch.append(failure)
            if _batch_timer is None:
                _batch_timer = threading.Timer(FOLD_WINDOW_S, _flush_reports)
                _batch_timer.name = "monarch-fault-report"
                _batch_timer.daemon = True
                _batch_timer.start()
            return
        line = late_line(failure, seen[1])
        seen[1].append(failure)
    print(f"[monarch] unhandled failure: {line}", file=sys.stderr, flush=True)


def _flush_reports() -> None:
    """Print the batch: one report per group of the same failure (a waiter that raised for
    one meanwhile has shown it: it is left out)."""
    global _batch_timer
    from .fold import failure_key, folded_report, group

    with _report_lock:
        batch, _batch[:] = list(_batch), []
        _batch_timer = None
        groups = group([f for f in batch if not f.seen_by_waiter])
        now = time.monotonic()
        for members in groups:
            _printed[failure_key(members[0])] = (now, list(members))
    for members in groups:
        print(f"[monarch] unhandled failure:\n{folded_report(members)}", file=sys.stderr,
              flush=True)


def _flush_at_exit() -> None:
    """At exit, print what a fold window still holds (nothing is lost to the window)."""
    timer = _batch_timer
    if timer is not None:
        timer.cancel()
        _flush_reports()


atexit.register(_flush_at_exit)


def default_unhandled_fault_hook(failure: MeshFailure) -> None:
    """At the root: in a script, report and exit non-zero; interactively, report once
    (the waiting code gets SupervisionError; later use of the mesh raises)."""
    key = failure.proc_id or f"{failure.mesh}{failure.ranks}"
    with _report_lock:
        first = key not in _reported
        _reported.add(key)
    if is_interactive():
        if first and not failure.seen_by_waiter:
            _report_interactive(failure)
        return
    print(f"[monarch] unhandled failure, exiting (fail fast):\n{failure.report()}",
          file=sys.stderr, flush=True)
    try:
        _features.call("runtime.shutdown", 1.0)  # the core is above supervision
    finally:
        _run_atexit(5.0)
        os._exit(1)


def _run_atexit(timeout: float) -> None:
    """Run the process's `atexit` handlers before a fail-fast exit (as Monarch's does), on
    a thread of their own, bounded by `timeout` (a handler may wait on the runtime)."""

    def run() -> None:
        try:
            atexit._run_exitfuncs()
        except BaseException:  # noqa: BLE001 - exiting anyway
            pass
        sys.stdout.flush()

    t = threading.Thread(target=run, name="monarch-atexit", daemon=True)
    t.start()
    t.join(timeout)
