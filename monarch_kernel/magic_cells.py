"""%%mesh: a cell's code run on every selected proc, through one CellRunner actor per proc
(and the CellCompleter beside it that completes such cells)."""

from __future__ import annotations

import uuid
from typing import Any

from IPython.core.error import UsageError

from monarch_kernel import args as margs
from monarch_kernel.folding import MeshCellError, RankFailure

#: How long a finished %%mesh cell waits for its remote output still in flight.
OUTPUT_DRAIN_S = 2.0


class CellCommands:
    """Running %%mesh cells."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.cells = 0

    # -- %%mesh ------------------------------------------------------------------------------------
    def _runner_for(self, procs: Any) -> Any:
        """The cell-runner actor mesh on `procs` (spawned once per proc mesh, with the
        CellCompleter that completes %%mesh cells against its namespaces)."""
        from monarch_kernel.cell_runner import CellRunner
        from monarch_kernel.remote_complete import CellCompleter

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
        self.cells += 1
        mark = uuid.uuid4().hex
        n = runner.size()
        fut = runner.run.call(code, str(self.cells), mark if not a.noblock else "")
        label = procs.name
        if a.noblock:
            out = _chain(fut, lambda vm: _finish(vm, label), f"%%mesh {label}")
            if a.out:
                self.ctx.ns[a.out] = out
            return None if a.quiet else out
        try:
            vm = fut.get(timeout=a.timeout)
        except TimeoutError:
            hook = fut.interrupt_hook  # set when interrupts reach remote actors (the default)
            if hook is not None:
                hook()
            what = ("the remote cell was interrupted" if hook is not None
                    else "it goes on running remotely: %mesh interrupt is 'local'")
            raise UsageError(f"%%mesh: the cell did not finish within {a.timeout:g} s "
                             f"({what})") from None
        self.ctx.session.router.wait_marks(mark, 2 * n, OUTPUT_DRAIN_S)
        self.ctx.session.router.flush()
        try:
            result = _finish(vm, label)
        except MeshCellError as e:
            if a.out:
                self.ctx.ns[a.out] = e
            raise
        if a.out:
            self.ctx.ns[a.out] = result
        return None if a.quiet else result


def _finish(vm: Any, mesh: str) -> Any:
    """ValueMesh of CellResults -> ValueMesh of values (None if no rank had a value);
    raises MeshCellError, folded, if any rank failed."""
    from runtime import ValueMesh

    results = list(vm.values())
    failures = [RankFailure(r.rank, dict(r.coords), r.error_type, r.error_message, r.traceback)
                for r in results if not r.ok]
    if failures:
        raise MeshCellError(failures, total=len(results), mesh=mesh, results=vm)
    if not any(r.has_value for r in results):
        return None
    return ValueMesh(vm.shape, [r.value for r in results])


def _chain(fut: Any, fn: Any, label: str = "") -> Any:
    """A Future resolved with fn(result of `fut`) (or its error); Ctrl-C on it interrupts
    the remote call like a wait on `fut` would."""
    from runtime import Future

    out: Future = Future(label)
    out.interrupt_hook = fut.interrupt_hook

    def done(f: Any) -> None:
        exc = f.exception()
        if exc is not None:
            out.set_exception(exc)
            return
        try:
            out.set_result(fn(f.get()))
        except BaseException as e:  # noqa: BLE001 - delivered to the waiter
            out.set_exception(e)

    fut.add_done_callback(done)
    return out
