"""%%mesh: a cell's code run on every selected proc, through one CellRunner actor per proc
(and the CellCompleter beside it that completes such cells)."""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Optional

from IPython.core.error import UsageError

from monarch_kernel import args as margs
from monarch_kernel.folding import (MeshCellError, MeshCellInterrupted, MeshCellTimeout,
                                    MeshRanksDead, RankFailure, live_selection)

__all__ = ["OUTPUT_DRAIN_S", "INTERRUPT_DRAIN_S", "CellCommands"]

#: How long a finished %%mesh cell waits for its remote output still in flight.
OUTPUT_DRAIN_S = 2.0
#: After Ctrl-C, how long a %%mesh cell waits for its interrupted ranks to answer.
INTERRUPT_DRAIN_S = 5.0


class CellCommands:
    """Running %%mesh cells."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.cells = 0
        # per proc mesh: ranks an interrupted cell left running, and their unanswered calls
        self.busy: dict[int, tuple[Any, set, list, int]] = {}

    # -- %%mesh ------------------------------------------------------------------------------------
    def _runner_for(self, procs: Any) -> Any:
        """The cell-runner actor mesh on `procs` (spawned once per proc mesh, with the
        CellCompleter that completes %%mesh cells against its namespaces)."""
        from monarch_kernel.remote.cell_runner import CellRunner
        from monarch_kernel.remote.complete import CellCompleter

        root = procs.root
        entry = self.ctx.runners.get(id(root))
        if entry is None or entry[0] is not root or entry[1].stopped:
            key = f"{root.name}-{uuid.uuid4().hex[:8]}"
            # internal meshes: no view lists them and they take none of the user's names;
            # the runner's actors are named like the proc mesh, as pdb and logs show them
            runner = root.spawn_internal(root.name, CellRunner, key)
            completer = root.spawn_internal("cell_completer", CellCompleter, key)
            entry = (root, runner, completer)
            self.ctx.runners[id(root)] = entry
        runner = entry[1]
        if procs is not root:
            runner = runner.restricted_to(procs)
        return runner

    def completer_for(self, procs: Any) -> Any:
        """The CellCompleter mesh on `procs`, or None before its first %%mesh cell (a Tab
        never spawns actors) or once stopped."""
        entry = self.ctx.runners.get(id(procs.root))
        if entry is None or entry[0] is not procs.root or entry[2].stopped:
            return None
        return entry[2] if procs is procs.root else entry[2].restricted_to(procs)

    def _say_if_busy(self, root: Any, runner: Any) -> None:
        """Print a line when ranks this cell selects still run an interrupted cell (stuck
        in a C call, which sees Ctrl-C only when it returns): this cell waits for them."""
        entry = self.busy.get(id(root))
        if entry is None or entry[0] is not root:
            return
        _, ranks, futs, cell = entry
        if all(f.done() for f in futs):
            del self.busy[id(root)]
            return
        waiting = sorted(ranks & set(runner.shape.global_ranks()))
        if waiting:
            which = ", ".join(map(str, waiting))
            print(f"%%mesh {root.name}: rank{'s' if len(waiting) > 1 else ''} {which} still "
                  f"run{'' if len(waiting) > 1 else 's'} the interrupted cell {cell} (a C call "
                  "sees Ctrl-C only when it returns); this cell starts there when it ends",
                  flush=True)

    def run_cell(self, a: margs.CellArgs, code: str) -> Any:
        from runtime import ShapeError

        self.ctx.runtime()
        procs = self.ctx.proc_mesh(a.mesh, "%%mesh")
        runner = self._runner_for(procs)
        if a.ranks:
            try:
                runner = runner.slice(**a.ranks)
            except (ShapeError, ValueError, KeyError) as e:
                raise UsageError(f"%%mesh: --ranks: {e}") from None
        self._say_if_busy(procs.root, runner)
        self.cells += 1
        mark = uuid.uuid4().hex
        n = runner.size()
        label = procs.name
        if a.noblock:
            fut = _start(lambda: runner.run.call(code, str(self.cells), ""), runner, procs)
            out = _chain(fut, lambda vm: _finish(vm, label), f"%%mesh {label}",
                         lambda e: _died_error(e, procs.root, n, label))
            if a.out:
                self.ctx.ns[a.out] = out
            return None if a.quiet else out
        # a future per rank: a rank whose proc dies leaves the others' results
        futs = _start(lambda: list(runner.run.stream(code, str(self.cells), mark)), runner,
                      procs)
        vm, died, interrupted = _gather(runner, futs, a.timeout)
        if interrupted:
            self.busy[id(procs.root)] = (procs.root, set(interrupted),
                                         [f for f in futs if not f.done()], self.cells)
        self.ctx.session.router.wait_marks(mark, 2 * (n - len(died)), OUTPUT_DRAIN_S)
        self.ctx.session.router.flush()
        try:
            router = self.ctx.session.router
            lost = [_proc_died(e, procs.root, router.wrote_stderr) for e in died]
            if interrupted is not None:
                lost += _unanswered(interrupted, procs.root, {f.rank for f in lost})
            result = _finish(vm, label, lost, interrupted is not None)
        except MeshCellError as e:
            if a.out:
                self.ctx.ns[a.out] = e
            raise
        if a.out:
            self.ctx.ns[a.out] = result
        return None if a.quiet else result


def _start(call: Any, runner: Any, procs: Any) -> Any:
    """call() (which sends the cell), or, if ranks it selects died in an earlier cell, a
    MeshRanksDead naming them and the `--ranks` selection that still works."""
    from runtime import SupervisionError

    try:
        return call()
    except SupervisionError as e:
        raise _dead_ranks(e, runner, procs.root) from None


def _dead_ranks(e: BaseException, runner: Any, root: Any) -> BaseException:
    """The ranks of `runner`'s selection whose procs are gone, in the mesh's words."""
    from monarch_kernel.session import running_runtime

    rt = running_runtime()
    f = getattr(e, "failure", None)
    infos = root.procs
    gone = {g for g, p in enumerate(infos)
            if rt is not None and rt.proc_state(p.proc_id) in ("failed", "stopped")}
    gone |= set(f.ranks if f is not None else ())
    dead = {g: "" for g in runner.shape.global_ranks() if g in gone}
    if not dead:
        return e  # not a dead proc: the runtime's own words
    for g in (f.ranks if f is not None else ()):
        if g in dead and g < len(infos):
            dead[g] = _how(f, infos[g])
    coords = [dict(root.shape.coords_of(g)) for g in sorted(gone) if g < len(infos)]
    return MeshRanksDead(root.name, dead, len(infos), live_selection(dict(root.sizes), coords))


def _how(f: Any, info: Any) -> str:
    """How a proc ended (`its proc exited with code 3 (host h, pid 42)`) from its failure."""
    import signal as _signal

    if f.signal:
        try:
            how = f"was killed by {_signal.Signals(f.signal).name}"
        except ValueError:
            how = f"was killed by signal {f.signal}"
    elif f.exit_code is not None:
        how = f"exited with code {f.exit_code}"
    else:
        how = f"failed: {f.cause}"
    host = f.host or getattr(info, "host", "") or "?"
    pid = f.pid or getattr(info, "pid", 0) or "?"
    return f"its proc {how} (host {host}, pid {pid})"


def _gather(runner: Any, futs: list, timeout: Optional[float]
            ) -> tuple[Any, list, Optional[list[int]]]:
    """Wait for every rank's reply (futures in arrival order): (ValueMesh of the CellResults
    by rank, None where a rank's proc died or did not answer; the SupervisionErrors of the
    ranks whose proc died; None, or if the wait was interrupted the ranks with no answer). After `timeout` seconds the
    remote cell is interrupted and a UsageError raised. On Ctrl-C (the remote cell is
    interrupted with the wait) the ranks' answers are collected for up to
    INTERRUPT_DRAIN_S; a second Ctrl-C, or interrupts that stay local, end it at once.
    Past `timeout`: MeshCellTimeout."""
    from runtime import Shape, SupervisionError, ValueMesh

    deadline = None if timeout is None else time.monotonic() + timeout
    index = {g: i for i, g in enumerate(runner.shape.global_ranks())}
    values: list = [None] * len(index)
    died = []
    drain: Optional[float] = None  # after Ctrl-C: until when answers are collected
    i = 0
    while i < len(futs):
        f = futs[i]
        end = drain if drain is not None else deadline
        try:
            r = f.get(timeout=None if end is None else max(0.0, end - time.monotonic()))
            values[index.get(r.rank, 0)] = r
        except SupervisionError as e:
            died.append(e)
        except KeyboardInterrupt:
            if drain is not None or f.interrupt_hook is None:
                raise
            drain = time.monotonic() + INTERRUPT_DRAIN_S
            continue  # the same rank again: its cell was interrupted with the wait
        except TimeoutError:
            if drain is not None:
                break  # the ranks that did not answer are reported as such
            hook = f.interrupt_hook  # set when interrupts reach remote actors (the default)
            if hook is not None:
                hook()
            what = ("the remote cell was interrupted" if hook is not None
                    else "it goes on running remotely: %mesh interrupt is 'local'")
            raise MeshCellTimeout(f"%%mesh: the cell did not finish within {timeout:g} s "
                                  f"({what})") from None
        i += 1
    sizes = runner.sizes
    unanswered = None if drain is None else [g for g, i in index.items() if values[i] is None]
    return ValueMesh(Shape(tuple(sizes), tuple(sizes.values())), values), died, unanswered


def _proc_died(e: BaseException, root: Any,
               shown: Optional[Callable[[str, int], bool]] = None) -> RankFailure:
    """A rank whose proc died (or stopped answering) while it ran the cell, in the user's
    words: which rank of their proc mesh, how, where, and its last lines of stderr, unless
    `shown(mesh, rank)` says they are in the cell already (streamed live: said once)."""
    import signal as _signal

    f = getattr(e, "failure", None)
    rank = f.ranks[0] if f is not None and f.ranks else -1
    info = {p.rank: p for p in root.procs}.get(rank)
    coords = root.shape.coords_of(rank) if 0 <= rank < len(root.procs) else {}
    if f is not None and f.signal and f.cause.startswith("killed by "):
        how = f"was {f.cause}"  # on purpose: kill() (the user), %mesh chaos (injected)
    elif f is not None and f.signal:
        try:
            how = f"was killed by {_signal.Signals(f.signal).name}"
        except ValueError:
            how = f"was killed by signal {f.signal}"
    elif f is not None and f.exit_code is not None:
        how = f"exited with code {f.exit_code}"
    else:
        how = f"failed: {f.cause if f is not None else e}"
    host = (f.host if f is not None and f.host else getattr(info, "host", "")) or "?"
    pid = (f.pid if f is not None and f.pid else getattr(info, "pid", 0)) or "?"
    lines = [f"the proc of {root.name} rank {rank} {how} (host {host}, pid {pid}); "
             "the cell did not finish there"]
    if f is not None and f.stderr_tail:
        if shown is not None and shown(root.name, rank):
            lines.append(f"its stderr is above ([{root.name} {rank}] lines)")
        else:
            lines.append("last lines of its stderr:")
            lines.extend("  " + ln for ln in f.stderr_tail)
    return RankFailure(rank, dict(coords), "ProcDied", lines[0], "\n".join(lines) + "\n")


def _unanswered(ranks: list[int], root: Any, known: set) -> list[RankFailure]:
    """The ranks of an interrupted cell that gave no answer in time (and did not die)."""
    out = []
    for rank in ranks:
        if rank in known:
            continue
        line = (f"{root.name} rank {rank} was interrupted and did not answer within "
                f"{INTERRUPT_DRAIN_S:g} s (a C call sees Ctrl-C only when it returns: the next "
                "cell there waits for it); the cell did not finish there")
        coords = dict(root.shape.coords_of(rank)) if 0 <= rank < len(root.procs) else {}
        out.append(RankFailure(rank, coords, "KeyboardInterrupt", line, line + "\n"))
    return out


def _finish(vm: Any, mesh: str, died: Optional[list] = None, interrupted: bool = False) -> Any:
    """ValueMesh of CellResults -> ValueMesh of values (None if no rank had a value);
    raises MeshCellError, folded, if any rank failed (`died`: ranks whose proc died or, after
    an interrupt, did not answer); MeshCellInterrupted if the cell was interrupted there."""
    from runtime import ValueMesh

    results = list(vm.values())
    failures = [RankFailure(r.rank, dict(r.coords), r.error_type, r.error_message, r.traceback)
                for r in results if r is not None and not r.ok] + list(died or [])
    if failures:
        cls = MeshCellInterrupted if interrupted else MeshCellError
        raise cls(failures, total=len(results), mesh=mesh, results=vm)
    if not any(r.has_value for r in results):
        return None
    return ValueMesh(vm.shape, [r.value for r in results])


def _died_error(e: BaseException, root: Any, total: int, mesh: str) -> BaseException:
    """A --noblock cell's SupervisionError (a proc died) as a MeshCellError in the mesh's
    words; any other error as it is."""
    from runtime import SupervisionError

    if isinstance(e, SupervisionError) and getattr(e, "failure", None) is not None:
        return MeshCellError([_proc_died(e, root)], total=total, mesh=mesh)
    return e


def _chain(fut: Any, fn: Any, label: str = "", on_error: Any = None) -> Any:
    """A Future resolved with fn(result of `fut`) (or its error, through `on_error` if
    given); Ctrl-C on it interrupts the remote call like a wait on `fut` would."""
    from runtime import Future

    out: Future = Future(label)
    out.interrupt_hook = fut.interrupt_hook

    def done(f: Any) -> None:
        exc = f.exception()
        if exc is not None:
            out.set_exception(on_error(exc) if on_error is not None else exc)
            return
        try:
            out.set_result(fn(f.get()))
        except BaseException as e:  # noqa: BLE001 - delivered to the waiter
            out.set_exception(e)

    fut.add_done_callback(done)
    return out
