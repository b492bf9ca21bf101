"""%mesh alloc (here or on a job), spawn, activate and deactivate."""

from __future__ import annotations

import importlib
import time
from typing import Any

from IPython.core.error import UsageError

from monarch_kernel import args as margs
from monarch_kernel.mesh_text import fmt_sizes, one_line
from monarch_kernel.tables import Rendered

__all__ = ["AllocCommands"]


class AllocCommands:
    """Making meshes: procs (with a live progress bar), actors, the active mesh."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    # -- %mesh activate / deactivate ----------------------------------------------------------
    def activate(self, a: margs.ActivateArgs) -> Any:
        import threading

        pm = self.ctx.proc_mesh(a.name, "%mesh activate")
        self.ctx.runtime()
        self._end_active()
        ctx = pm.activate()
        ctx.__enter__()
        self.ctx.session.active_mesh = (a.name, pm, ctx, threading.get_ident())
        print(f"mesh {a.name!r} {fmt_sizes(pm.sizes)} is active: torch in the cells that "
              "follow runs on its procs ('%mesh deactivate' ends it)")

    def deactivate(self, a: margs.DeactivateArgs) -> Any:
        name = self._end_active()
        print(f"mesh {name!r} is no longer active" if name else "no mesh is active")

    def _end_active(self) -> Any:
        """Leave the mesh `%mesh activate` entered, if any; its variable name."""
        import threading

        active = getattr(self.ctx.session, "active_mesh", None)
        if active is None:
            return None
        name, _, ctx, tid = active
        if tid != threading.get_ident():
            raise UsageError("%mesh deactivate: the mesh was activated on another thread")
        self.ctx.session.active_mesh = None
        ctx.__exit__(None, None, None)
        return name

    # -- %mesh alloc -------------------------------------------------------------------------
    def alloc(self, a: margs.AllocArgs) -> Any:
        from runtime import HostMesh, this_host

        self.ctx.runtime()
        if a.hosts:
            host = self.ctx.lookup(a.hosts, "a HostMesh")
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
        self.ctx.ns[a.name] = procs
        return None

    def joballoc(self, a: margs.JobAllocArgs) -> Any:
        """`%mesh alloc NAME --job KIND ...`: start a job, attach, spawn procs on its hosts."""
        from IPython.display import display

        try:
            spec = margs.parse_alloc(a.argv)
        except ValueError as e:
            raise UsageError(one_line(e, "%mesh alloc")) from None
        self.ctx.runtime()
        job = spec.make_job()
        job.progress = a.progress  # --no-progress: no bar while the job's agents start
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
            raise UsageError(one_line(e, f"%mesh alloc: the {spec.kind} job failed")) from None
        if handle is not None:
            handle.update(Rendered(f"{spec.kind} job for {spec.name} is up; starting procs"))
        self.ctx.session.jobs[id(procs)] = (procs, job)
        self.ctx.ns[a.name + "_job"] = job
        if getattr(job, "saved_path", None):
            print(f"{a.name}: kept for {job.keep:g} s after this kernel goes away; a new "
                  f"kernel reattaches with %mesh attach-job {job.saved_path}")
        try:
            self._wait_started(procs, margs.AllocArgs(name=a.name, per_host=spec.per_host,
                                                      progress=a.progress,
                                                      timeout=spec.options.get("timeout")))
        except BaseException:
            self.ctx.session.jobs.pop(id(procs), None)
            job.kill()
            raise
        self.ctx.ns[a.name] = procs
        return None

    def attach_job(self, a: margs.AttachJobArgs) -> Any:
        """`%mesh attach-job PATH`: reattach to a kept job, bind its live meshes by name."""
        import warnings

        from runtime.errors import AttachRefusedError
        from runtime.job import Job, JobError

        self.ctx.runtime()
        try:
            job = Job.load(a.path)
        except FileNotFoundError:
            raise UsageError(f"%mesh attach-job: no saved job at {a.path!r} (a kept job's "
                             "file is written by %mesh alloc ... --keep)") from None
        except JobError as e:
            raise UsageError(one_line(e, "%mesh attach-job")) from None
        try:
            job.state(cached_path=None, takeover=a.takeover)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                kept = job.kept_meshes()
        except (AttachRefusedError, JobError, TimeoutError) as e:
            raise UsageError(one_line(e, f"%mesh attach-job {a.path}")) from None
        lines = []
        for name, pm in kept.items():
            if not name.isidentifier():
                continue
            self.ctx.ns[name] = pm
            self.ctx.session.jobs[id(pm)] = (pm, job)
            self.ctx.ns[name + "_job"] = job
            actors = [n for n in pm.kept_actor_meshes if n.isidentifier()]
            for n in actors:
                self.ctx.ns[n] = pm.kept_actor_meshes[n]
            lines.append(f"{name} = proc mesh {fmt_sizes(pm.sizes)} (kept {pm.keep:g} s), "
                         f"actors: {', '.join(actors) or 'none'}")
            for c in pm.lost_calls:
                lines.append(f"  lost with the previous kernel: {c.mesh}[{c.rank}]."
                             f"{c.endpoint} ({c.state}): its result went to that kernel")
        del caught  # the lost calls are listed above, once
        print("\n".join(lines) if lines else
              f"%mesh attach-job: job {job.meshes} is running but kept no mesh")
        return None

    def _wait_started(self, procs: Any, a: margs.AllocArgs) -> None:
        """Show procs coming up (a live tqdm bar) until all are, or fail clearly."""
        from monarch_kernel.tables import progress_bar

        total = len(procs.procs)
        bar = progress_bar(f"allocating {procs.name} {procs.sizes}", total, shell=self.ctx.shell,
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
        scope = self.ctx.ns if head in self.ctx.ns else vars(builtins)
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

    def spawn(self, a: margs.SpawnArgs) -> Any:
        from runtime import Actor

        procs = self.ctx.proc_mesh(a.mesh, "%mesh spawn")
        cls = self._resolve_class(a.actor_class)
        if not (isinstance(cls, type) and issubclass(cls, Actor)):
            raise UsageError(f"%mesh spawn: {a.actor_class!r} is not an Actor subclass")
        glb, loc = self.ctx.shell.user_global_ns, self.ctx.ns
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
        self.ctx.ns[var] = mesh
        print(f"{var} = {cls.__name__} actors {name!r} on {procs.name!r} {mesh.sizes}")
        return None

