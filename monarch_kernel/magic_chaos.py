"""%mesh chaos: SIGKILL random procs of one named mesh at an interval, from a background
thread, while the notebook keeps working, so `__supervise__` and the user's recovery code
can be watched at work (Monarch's chaos testing, at the level of processes); with --raise,
random actors of the mesh raise `runtime.InjectedFault` at their next call instead
(`runtime.inject_raise`), for the code that handles failed calls."""

from __future__ import annotations

import random
import sys
import threading
import time
from typing import Any, Optional, TextIO

from IPython.core.error import UsageError

from monarch_kernel import args as margs

__all__ = ["ChaosRun", "ChaosCommands"]


class ChaosRun:
    """One mesh's chaos: a daemon thread that kills a random live proc every `every`
    seconds (through its host agent, by pid) until `duration` passes, `stop()`, or no live
    proc is left; one line per kill on `out`. With `raises`, it makes a random live actor
    raise InjectedFault at its next call instead (of `actors`, the ActorMesh the user
    named, or of every live actor mesh on `pm`), until no live actor is left."""

    def __init__(self, pm: Any, every: float, duration: Optional[float], out: TextIO,
                 raises: bool = False, actors: Any = None) -> None:
        self.pm, self.every, self.duration, self.out = pm, every, duration, out
        self.raises, self.actors = raises, actors
        self.kills: list[tuple[int, int]] = []  # (rank, pid) of each proc killed
        self.raised: list[tuple[str, int]] = []  # (actor mesh, rank) of each raise injected
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"chaos-{pm.name}", daemon=True)

    def start(self) -> None:
        """Start the killing thread."""
        self.thread.start()

    def stop(self) -> None:
        """Ask the thread to end (it ends before its next kill)."""
        self.stopped.set()

    def alive(self) -> bool:
        """Whether the thread still runs."""
        return self.thread.is_alive()

    def _say(self, text: str) -> None:
        try:
            print(f"[chaos {self.pm.name}] {text}", file=self.out, flush=True)
        except Exception:  # noqa: BLE001 - the cell's stream is gone: keep killing quietly
            pass

    def _run(self) -> None:
        from runtime import get_runtime

        rt, rng = get_runtime(), random.Random()
        end = None if self.duration is None else time.monotonic() + self.duration
        why = "stopped"
        while True:
            wait = self.every if end is None else min(self.every, end - time.monotonic())
            if wait > 0 and self.stopped.wait(wait):
                break
            if end is not None and time.monotonic() >= end:
                why = "--for reached"
                break
            if self.raises:
                if not self._raise_one(rng):
                    why = "no live actor left"
                    break
                continue
            live = [p for p in self.pm.procs if p.pid and rt.proc_state(p.proc_id) == "running"]
            if not live:
                why = "no live proc left"
                break
            p = rng.choice(live)
            try:
                # SIGKILL by pid, sent by the proc's host agent; its failure says chaos
                # did it and is `is_injected`, in every report of it
                rt.kill_proc(p.proc_id, reason=f"killed by %mesh chaos on {self.pm.name!r}, "
                             "an injected failure", injected=True)
            except Exception as e:  # noqa: BLE001 - it went meanwhile: try another next time
                self._say(f"rank {p.rank} (pid {p.pid}) could not be killed: {e}")
                continue
            self.kills.append((p.rank, p.pid))
            self._say(f"killed rank {p.rank} (host {p.host}, pid {p.pid}) with SIGKILL at "
                      f"{time.strftime('%H:%M:%S')}")
        if self.raises:
            self._say(f"chaos ended ({why}): {len(self.raised)} raise(s) injected")
        else:
            self._say(f"chaos ended ({why}): {len(self.kills)} proc(s) killed")

    def targets(self) -> list[tuple[Any, int, Any]]:
        """(actor mesh, rank, proc) of each live actor --raise may make raise."""
        from runtime import ActorMesh, get_runtime

        rt = get_runtime()
        mine = {p.proc_id for p in self.pm.procs}
        meshes = [self.actors] if self.actors is not None else [
            m for m in rt.meshes() if isinstance(m, ActorMesh) and m.proc_mesh is not None
            and m.proc_mesh.root is self.pm.root]
        return [(am, p.rank, p) for am in meshes if not am.stopped
                for p in am.proc_mesh.procs
                if p.proc_id in mine and rt.proc_state(p.proc_id) == "running"]

    def _raise_one(self, rng: random.Random) -> bool:
        """Make one random live actor raise at its next call; False when none is left."""
        from runtime import inject_raise

        targets = self.targets()
        while targets:
            am, rank, p = targets.pop(rng.randrange(len(targets)))
            try:
                # its next call raises runtime.InjectedFault, whose message says chaos did it
                armed = inject_raise(am, rank, reason=f"%mesh chaos on {self.pm.name!r}"
                                     ).get(timeout=10)
            except Exception as e:  # noqa: BLE001 - it went meanwhile: try another
                self._say(f"rank {rank} of {am.name!r} could not be made to raise: {e}")
                continue
            if not armed:  # stopped or failed meanwhile
                continue
            self.raised.append((am.name, rank))
            self._say(f"injected a raise in rank {rank} of {am.name!r} ({am.class_name}, host "
                      f"{p.host}, pid {p.pid}) at {time.strftime('%H:%M:%S')}: its next call "
                      "raises InjectedFault, an injected failure")
            return True
        return False


class ChaosCommands:
    """`%mesh chaos MESH --kill-every DUR [--for DUR]`, `%mesh chaos MESH --raise --every
    DUR [--for DUR]` and `%mesh chaos MESH --stop`."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.runs: dict[str, ChaosRun] = {}  # proc mesh name -> its chaos

    def _mesh(self, name: str) -> Any:
        """The one live proc mesh the user named (a variable, or a proc mesh's name)."""
        from runtime import ActorMesh, ProcMesh, get_runtime

        obj = self.ctx.ns.get(name)
        if isinstance(obj, ActorMesh):
            if obj.stopped:
                raise UsageError(f"%mesh chaos: actor mesh {obj.name!r} is stopped")
            obj = obj.proc_mesh
        if isinstance(obj, ProcMesh):
            if obj.stopped:
                raise UsageError(f"%mesh chaos: proc mesh {obj.name!r} is stopped")
            return obj
        if obj is not None:
            raise UsageError(f"%mesh chaos: {name!r} is a {type(obj).__name__}, not a ProcMesh "
                             "or ActorMesh")
        live = [m for m in get_runtime().meshes() if isinstance(m, ProcMesh)
                and not m.stopped and m.root is m and m.name == name]
        if not live:
            raise UsageError(f"%mesh chaos: no live proc mesh {name!r} (name a ProcMesh or "
                             "ActorMesh variable, or a proc mesh's name; chaos runs only on "
                             "the mesh you name)")
        return live[0]

    def chaos(self, a: margs.ChaosArgs) -> None:
        """Start (or with --stop, end) the chaos on the named mesh."""
        pm = self._mesh(a.mesh)
        run = self.runs.get(pm.name)
        if a.stop:
            if run is None or not run.alive():
                print(f"no chaos running on {pm.name!r}")
                return
            run.stop()
            run.thread.join(timeout=5)
            return
        if run is not None and run.alive():
            raise UsageError(f"%mesh chaos: already running on {pm.name!r} "
                             f"('%mesh chaos {a.mesh} --stop' first)")
        until = f" for {a.duration:g} s" if a.duration else f" until '%mesh chaos {a.mesh} --stop'"
        if a.raise_every is not None:
            from runtime import ActorMesh

            named = self.ctx.ns.get(a.mesh)
            actors = named if isinstance(named, ActorMesh) else None
            run = ChaosRun(pm, a.raise_every, a.duration, sys.stdout, raises=True, actors=actors)
            if not run.targets():
                raise UsageError(f"%mesh chaos: no live actor on {pm.name!r} to raise in "
                                 "(spawn one first, or name an ActorMesh)")
            self.runs[pm.name] = run
            what = f"{actors.name!r}" if actors is not None else f"the actor meshes on {pm.name!r}"
            print(f"[chaos {pm.name}] making a random actor of {what} raise InjectedFault at "
                  f"its next call every {a.raise_every:g} s{until}")
            run.start()
            return
        assert a.kill_every is not None  # the parser insists
        run = ChaosRun(pm, a.kill_every, a.duration, sys.stdout)
        self.runs[pm.name] = run
        print(f"[chaos {pm.name}] killing a random proc of {pm.name!r} every "
              f"{a.kill_every:g} s{until}")
        run.start()
