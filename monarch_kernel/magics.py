"""The %mesh line magic and the %%mesh cell magic.

`%mesh alloc|spawn|list|status|stop|interrupt ...` manages meshes; `%mesh activate NAME`
and `%mesh deactivate` make torch in later cells run on a mesh (the tensor engine);
`%%mesh MESH` runs the cell's code on every proc of MESH. Bad arguments raise IPython's
UsageError, which the notebook shows as one line, never a traceback.
"""

from __future__ import annotations

import importlib
import time
import uuid
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand

from monarch_kernel import args as margs
from monarch_kernel.folding import MeshCellError, RankFailure
from monarch_kernel.tables import Rendered, Table

#: How long a finished %%mesh cell waits for its remote output still in flight.
OUTPUT_DRAIN_S = 2.0


@magics_class
class MeshMagics(Magics):
    """%mesh and %%mesh; state lives in the NotebookSession passed in."""

    def __init__(self, shell: Any, session: Any) -> None:
        super().__init__(shell)
        self.session = session
        self._runners: dict[int, Any] = {}  # id(root ProcMesh) -> (root, runner ActorMesh)
        self._cells = 0

    # -- entry points ----------------------------------------------------------------------
    @line_magic("mesh")
    def mesh_line(self, line: str) -> Any:
        """%mesh COMMAND ...: alloc, spawn, list, status, stop, interrupt, debug (see --help)."""
        head, _, rest = line.strip().partition(" ")
        if head == "debug":  # the debugger parses its own line: ranks(procs=0:2) has parens
            from monarch_kernel.debugger import debug_magic

            return debug_magic(rest.strip() or "help", self.shell)
        try:
            cmd = margs.parse_mesh_line(line)
        except margs.MagicHelp as h:
            print(h.text.rstrip("\n"))
            return None
        except margs.MagicArgError as e:
            raise UsageError(str(e)) from None
        handler = getattr(self, "_cmd_" + type(cmd).__name__[:-4].lower())
        return handler(cmd)

    @no_var_expand  # {x} and $x belong to the remote code, not to the controller
    @cell_magic("mesh")
    def mesh_cell(self, line: str, cell: str) -> Any:
        """%%mesh MESH [--ranks ...]: run the cell on every selected proc (see --help)."""
        try:
            cmd = margs.parse_mesh_cell(line)
        except margs.MagicHelp as h:
            print(h.text.rstrip("\n"))
            return None
        except margs.MagicArgError as e:
            raise UsageError(str(e)) from None
        return self._run_cell(cmd, cell)

    # -- helpers ---------------------------------------------------------------------------------
    @property
    def _ns(self) -> dict:
        return self.shell.user_ns

    def _lookup(self, var: str, what: str) -> Any:
        if var not in self._ns:
            raise UsageError(f"%mesh: no variable {var!r} in the notebook ({what} expected)")
        return self._ns[var]

    def _proc_mesh(self, var: str, cmd: str) -> Any:
        from runtime import ActorMesh, ProcMesh

        obj = self._lookup(var, "a ProcMesh")
        if isinstance(obj, ActorMesh):
            obj = obj.proc_mesh
            if obj is None:
                raise UsageError(f"{cmd}: {var!r} is an ActorMesh without its ProcMesh here")
        if not isinstance(obj, ProcMesh):
            raise UsageError(f"{cmd}: {var!r} is a {type(obj).__name__}, not a ProcMesh "
                             "(create one with %mesh alloc)")
        if obj.stopped:
            raise UsageError(f"{cmd}: proc mesh {obj.name!r} was stopped")
        return obj

    def _runtime(self) -> Any:
        """The runtime, with remote output routed into cells."""
        from runtime import get_runtime

        self.session.install_sink()
        return get_runtime()

    # -- %mesh activate / deactivate ----------------------------------------------------------
    def _cmd_activate(self, a: margs.ActivateArgs) -> Any:
        import threading

        pm = self._proc_mesh(a.name, "%mesh activate")
        self._runtime()
        self._end_active()
        ctx = pm.activate()
        ctx.__enter__()
        self.session.active_mesh = (a.name, pm, ctx, threading.get_ident())
        print(f"mesh {a.name!r} {_fmt_sizes(pm.sizes)} is active: torch in the cells that "
              "follow runs on its procs ('%mesh deactivate' ends it)")

    def _cmd_deactivate(self, a: margs.DeactivateArgs) -> Any:
        name = self._end_active()
        print(f"mesh {name!r} is no longer active" if name else "no mesh is active")

    def _end_active(self) -> Any:
        """Leave the mesh `%mesh activate` entered, if any; its variable name."""
        import threading

        active = getattr(self.session, "active_mesh", None)
        if active is None:
            return None
        name, _, ctx, tid = active
        if tid != threading.get_ident():
            raise UsageError("%mesh deactivate: the mesh was activated on another thread")
        self.session.active_mesh = None
        ctx.__exit__(None, None, None)
        return name

    # -- %mesh alloc -------------------------------------------------------------------------
    def _cmd_alloc(self, a: margs.AllocArgs) -> Any:
        from runtime import HostMesh, this_host

        self._runtime()
        if a.hosts:
            host = self._lookup(a.hosts, "a HostMesh")
            if not isinstance(host, HostMesh) and not callable(getattr(host, "spawn_procs",
                                                                       None)):
                raise UsageError(f"%mesh alloc: --hosts {a.hosts!r} is a "
                                 f"{type(host).__name__}, not a HostMesh")
        else:
            host = this_host()
        name = a.mesh_name or a.name
        try:
            procs = host.spawn_procs(per_host=a.per_host, name=name, env=a.env or None)
        except (ValueError, TypeError) as e:
            raise UsageError(f"%mesh alloc: {e}") from None
        self._wait_started(procs, a)
        self._ns[a.name] = procs
        return None

    def _cmd_joballoc(self, a: margs.JobAllocArgs) -> Any:
        """`%mesh alloc NAME --job KIND ...`: start a job, attach, spawn procs on its hosts."""
        from IPython.display import display

        try:
            spec = margs.parse_alloc(a.argv)
        except ValueError as e:
            raise UsageError(_one_line(e, "%mesh alloc")) from None
        self._runtime()
        job = spec.make_job()
        note = Rendered(f"starting a {spec.kind} job for {spec.name}: {spec.hosts} host(s), "
                        f"{spec.per_host} per host")
        handle = display(note, display_id=True) if a.progress else None
        try:
            job, procs = spec.run(job)
        except KeyboardInterrupt:
            job.kill()
            raise
        except Exception as e:
            job.kill()
            raise UsageError(_one_line(e, f"%mesh alloc: the {spec.kind} job failed")) from None
        if handle is not None:
            handle.update(Rendered(f"{spec.kind} job for {spec.name} is up; starting procs"))
        self.session.jobs[id(procs)] = (procs, job)
        self._ns[a.name + "_job"] = job
        try:
            self._wait_started(procs, margs.AllocArgs(name=a.name, per_host=spec.per_host,
                                                      progress=a.progress,
                                                      timeout=spec.options.get("timeout")))
        except BaseException:
            self.session.jobs.pop(id(procs), None)
            job.kill()
            raise
        self._ns[a.name] = procs
        return None

    def _wait_started(self, procs: Any, a: margs.AllocArgs) -> None:
        """Show procs coming up (a live tqdm bar) until all are, or fail clearly."""
        from monarch_kernel.tables import progress_bar

        total = len(procs.procs)
        bar = progress_bar(f"allocating {procs.name} {procs.sizes}", total, shell=self.shell,
                           disable=not a.progress, postfix="starting")
        init = procs.initialized
        start = time.monotonic()
        deadline = None if a.timeout is None else start + a.timeout
        try:
            while True:
                try:
                    init.get(timeout=0.1)
                    break
                except TimeoutError:
                    pass
                except Exception as e:
                    why = str(e).splitlines()[0]
                    bar.set_postfix_str(f"failed: {why}", refresh=False)
                    procs.stop()
                    raise UsageError(f"%mesh alloc: procs of {procs.name!r} failed to start: "
                                     f"{why}") from None
                up = sum(1 for p in procs.procs if p.pid)
                if up > bar.n:
                    bar.update(up - bar.n)
                if deadline is not None and time.monotonic() > deadline:
                    bar.set_postfix_str(f"timed out after {a.timeout:g} s", refresh=False)
                    procs.stop()
                    raise UsageError(f"%mesh alloc: only {up} of {total} procs of "
                                     f"{procs.name!r} started within {a.timeout:g} s")
            bar.update(total - bar.n)
            bar.set_postfix_str(f"ready in {time.monotonic() - start:.1f} s", refresh=False)
        except KeyboardInterrupt:
            bar.set_postfix_str("interrupted", refresh=False)
            procs.stop()
            raise
        finally:
            bar.close()

    # -- %mesh spawn -------------------------------------------------------------------------
    def _resolve_class(self, path: str) -> Any:
        import builtins

        head, _, rest = path.partition(".")
        scope = self._ns if head in self._ns else vars(builtins)
        if head in scope:
            obj = scope[head]
            for part in rest.split(".") if rest else []:
                obj = getattr(obj, part, None)
                if obj is None:
                    raise UsageError(f"%mesh spawn: {path!r} not found")
            return obj
        mod_name, _, attr = path.rpartition(".")
        if not mod_name:
            raise UsageError(f"%mesh spawn: no class {path!r} in the notebook")
        try:
            return getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as e:
            raise UsageError(f"%mesh spawn: cannot import {path!r}: {e}") from None

    def _cmd_spawn(self, a: margs.SpawnArgs) -> Any:
        from runtime import Actor

        procs = self._proc_mesh(a.mesh, "%mesh spawn")
        cls = self._resolve_class(a.actor_class)
        if not (isinstance(cls, type) and issubclass(cls, Actor)):
            raise UsageError(f"%mesh spawn: {a.actor_class!r} is not an Actor subclass")
        glb, loc = self.shell.user_global_ns, self._ns
        try:
            args = [eval(x, glb, loc) for x in a.args]
            kwargs = {k: eval(x, glb, loc) for k, x in a.kwargs.items()}
        except Exception as e:
            raise UsageError(f"%mesh spawn: evaluating the arguments failed: "
                             f"{type(e).__name__}: {e}") from None
        name = a.name or a.var or cls.__name__.lower()
        var = a.var or (name if name.isidentifier() else None)
        if var is None:
            raise UsageError(f"%mesh spawn: mesh name {name!r} is not an identifier; "
                             "give --as VAR")
        try:
            mesh = procs.spawn(name, cls, *args, **kwargs)
        except (TypeError, ValueError) as e:
            raise UsageError(f"%mesh spawn: {e}") from None
        self._ns[var] = mesh
        print(f"{var} = {cls.__name__} actors {name!r} on {procs.name!r} {mesh.sizes}")
        return None

    # -- %mesh list / status -------------------------------------------------------------------
    def _hidden(self, obj: Any) -> bool:
        """The kernel's own cell-runner meshes (rt.meshes() lists the spawned objects)."""
        return any(obj is r or obj is c for _, r, c in self._runners.values())

    def _vars_for(self, obj: Any) -> str:
        return ", ".join(k for k, v in self._ns.items() if v is obj and not k.startswith("_"))

    def _cmd_list(self, a: margs.ListArgs) -> Any:
        from runtime import ActorMesh, ProcMesh

        from monarch_kernel.extension import _running_runtime

        rt = _running_runtime()
        t = Table(["name", "variable", "kind", "shape", "state"], title="meshes")
        if rt is not None:
            for obj in rt.meshes():
                if self._hidden(obj):
                    continue
                if isinstance(obj, ProcMesh):
                    active = getattr(self.session, "active_mesh", None)
                    mark = " (active)" if active is not None and active[1] is obj else ""
                    t.add(obj.name, self._vars_for(obj), "procs", _fmt_sizes(obj.sizes),
                          _proc_state(rt, obj) + mark)
                elif isinstance(obj, ActorMesh):
                    t.add(obj.name, self._vars_for(obj), f"actors ({obj.class_name})",
                          _fmt_sizes(obj.sizes), _actor_state(rt, obj))
        return t

    def _cmd_status(self, a: margs.StatusArgs) -> Any:
        from monarch_kernel.extension import _running_runtime

        rt = _running_runtime()
        snaps = rt.health.snapshot() if rt is not None else []
        if a.name is not None:
            snaps = [m for m in snaps if a.name in (m.name, m.proc_mesh)
                     or m.name.split("~")[0] == a.name]
            if not snaps:
                live = [m for m in (rt.meshes() if rt is not None else [])
                        if getattr(m, "name", None) == a.name and not self._hidden(m)]
                if not live:
                    raise UsageError(f"%mesh status: no mesh named {a.name!r}; "
                                     "see %mesh list")
                pm = live[0]  # a proc mesh with no actors: nothing in the health model yet
                return Rendered(f"proc mesh {a.name} {_fmt_sizes(pm.sizes)}: "
                                f"{_proc_state(rt, pm)}, no actors")
        try:  # the views package: the live dashboard, and its text and HTML renderings
            import monarch_widgets
        except ImportError:
            monarch_widgets = None
        if monarch_widgets is not None:
            if a.name is None and not a.text:
                return monarch_widgets.dashboard(self._runtime())
            from monarch_widgets.render import render_html, render_text

            return Rendered(render_text(snaps), None if a.text else render_html(snaps))
        t = Table(["mesh", "rank", "coords", "state", "endpoint", "handled", "errors", "pid",
                   "for"], title="meshes")
        now = time.time()
        for m in snaps:
            for act in m.actors:
                t.add(m.name, act.rank, _fmt_sizes(act.coords), act.state.value,
                      act.endpoint or "", act.handled, act.errors, act.pid or "",
                      f"{now - act.since:.0f} s")
        return t

    # -- %mesh attach / admin (the views and debugger packages) --------------------------------
    def _cmd_attach(self, a: margs.AttachArgs) -> Any:
        try:
            from monarch_widgets import controls
        except ImportError:
            raise UsageError("%mesh attach: needs the monarch_widgets package") from None
        try:
            return Rendered(controls.attach(a.mesh, a.rank))
        except (RuntimeError, KeyError, ValueError) as e:
            raise UsageError(f"%mesh attach: {e}") from None

    def _cmd_admin(self, a: margs.AdminArgs) -> Any:
        try:
            from monarch_widgets import controls
        except ImportError:
            raise UsageError("%mesh admin: needs the monarch_widgets package") from None
        return Rendered(controls.serve_admin(self._runtime()))

    # -- %mesh stop ------------------------------------------------------------------------------
    def _cmd_stop(self, a: margs.StopArgs) -> Any:
        from runtime import ActorMesh, ProcMesh

        from monarch_kernel.extension import _running_runtime

        if a.all:
            rt = _running_runtime()
            targets = [m for m in (rt.meshes() if rt is not None else [])
                       if isinstance(m, ProcMesh) and m.root is m]
            targets += [m for m in (rt.meshes() if rt is not None else [])
                        if isinstance(m, ActorMesh) and m.proc_mesh is None]
        else:
            targets = []
            for name in a.names:
                targets.extend(self._meshes_named(name))
        futs = [(m, m.stop()) for m in targets]
        names = []
        for m, f in futs:
            try:
                f.get(timeout=15)
            except Exception as e:
                print(f"%mesh stop: {m.name!r}: {e}")
            names.append(m.name)
            if isinstance(m, ProcMesh):
                self._runners.pop(id(m.root), None)
                entry = self.session.jobs.pop(id(m.root), None)
                if entry is not None:  # a mesh allocated on its own job: end the job too
                    entry[1].kill()
                    names[-1] += f" (and its {entry[1].kind} job)"
        if a.all:
            self.session.kill_jobs()
        print(f"stopped {len(names)} mesh{'es' if len(names) != 1 else ''}"
              + (f": {', '.join(names)}" if names else ""))
        return None

    def _meshes_named(self, name: str) -> list:
        """The mesh in variable `name`, else the live meshes whose name is `name`."""
        from runtime import ActorMesh, ProcMesh

        from monarch_kernel.extension import _running_runtime

        obj = self._ns.get(name)
        if isinstance(obj, (ProcMesh, ActorMesh)):
            return [obj]
        rt = _running_runtime()
        found = [m for m in (rt.meshes() if rt is not None else [])
                 if name in (getattr(m, "name", None), getattr(m, "health_name", None))
                 and not self._hidden(m)]
        if not found:
            what = (f"is a {type(obj).__name__}, not a mesh" if name in self._ns
                    else "is neither a mesh variable nor a live mesh's name")
            raise UsageError(f"%mesh stop: {name!r} {what}; see %mesh list")
        return found

    # -- %mesh interrupt ------------------------------------------------------------------------
    def _cmd_interrupt(self, a: margs.InterruptArgs) -> Any:
        from runtime.config import config

        if a.mode is not None:
            config.interrupt_remote = a.mode == "remote"
        mode = "remote" if config.interrupt_remote else "local"
        print(f"interrupt mode: {mode} ("
              + ("Ctrl-C also interrupts the remote actors of the call"
                 if mode == "remote" else "Ctrl-C only cancels the wait") + ")")
        return None

    # -- %%mesh ------------------------------------------------------------------------------------
    def _runner_for(self, procs: Any) -> Any:
        """The cell-runner actor mesh on `procs` (spawned once per proc mesh, with the
        CellCompleter that completes %%mesh cells against its namespaces)."""
        from monarch_kernel.cell_runner import CellRunner
        from monarch_kernel.remote_complete import CellCompleter

        root = procs.root
        entry = self._runners.get(id(root))
        if entry is None or entry[0] is not root or entry[1].stopped:
            key = f"{root.name}-{uuid.uuid4().hex[:8]}"
            runner = root.spawn(root.name, CellRunner, key)
            completer = root.spawn(f"{root.name}_completer", CellCompleter, key)
            entry = (root, runner, completer)
            self._runners[id(root)] = entry
        runner = entry[1]
        if procs is not root:
            runner = runner.restricted_to(procs)
        return runner

    def completer_for(self, procs: Any) -> Any:
        """The CellCompleter mesh on `procs`, or None before its first %%mesh cell (a Tab
        never spawns actors) or once stopped."""
        entry = self._runners.get(id(procs.root))
        if entry is None or entry[0] is not procs.root or entry[2].stopped:
            return None
        return entry[2] if procs is procs.root else entry[2].restricted_to(procs)

    def _run_cell(self, a: margs.CellArgs, code: str) -> Any:
        from runtime import ShapeError

        self._runtime()
        procs = self._proc_mesh(a.mesh, "%%mesh")
        runner = self._runner_for(procs)
        if a.ranks:
            try:
                runner = runner.slice(**a.ranks)
            except (ShapeError, ValueError, KeyError) as e:
                raise UsageError(f"%%mesh: --ranks: {e}") from None
        self._cells += 1
        mark = uuid.uuid4().hex
        n = runner.size()
        fut = runner.run.call(code, str(self._cells), mark if not a.noblock else "")
        label = procs.name
        if a.noblock:
            out = _chain(fut, lambda vm: _finish(vm, label), f"%%mesh {label}")
            if a.out:
                self._ns[a.out] = out
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
        self.session.router.wait_marks(mark, 2 * n, OUTPUT_DRAIN_S)
        self.session.router.flush()
        try:
            result = _finish(vm, label)
        except MeshCellError as e:
            if a.out:
                self._ns[a.out] = e
            raise
        if a.out:
            self._ns[a.out] = result
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


def _one_line(e: BaseException, prefix: str) -> str:
    """`prefix: message` on one line (the message's own prefix not repeated)."""
    msg = " ".join(str(e).split())
    if msg.startswith(prefix.split(":")[0] + ":"):
        return msg
    return f"{prefix}: {msg}"


def _fmt_sizes(sizes: dict) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in sizes.items()) + "}" if sizes else "{}"


def _proc_state(rt: Any, pm: Any) -> str:
    counts: dict[str, int] = {}
    for p in pm.procs:
        state = rt.proc_state(p.proc_id) or "unknown"
        counts[state] = counts.get(state, 0) + 1
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))


def _actor_state(rt: Any, am: Any) -> str:
    h = rt.health.mesh(am.health_name)
    if h is None:
        return "stopped" if am.stopped else "unknown"
    return h.state
