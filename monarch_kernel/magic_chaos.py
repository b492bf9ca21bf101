"""%mesh chaos: SIGKILL random procs of one named mesh at an interval, from a background
thread, while the notebook keeps working, so `__supervise__` and the user's recovery code
can be watched at work (Monarch's chaos testing, at the level of processes)."""

from __future__ import annotations

import random
import sys
import threading
import time
from typing import Any, Optional, TextIO

from IPython.core.error import UsageError

from monarch_kernel import args as margs


class ChaosRun:
    """One mesh's chaos: a daemon thread that kills a random live proc every `every`
    seconds (through its host agent, by pid) until `duration` passes, `stop()`, or no live
    proc is left; one line per kill on `out`."""

    def __init__(self, pm: Any, every: float, duration: Optional[float], out: TextIO) -> None:
        self.pm, self.every, self.duration, self.out = pm, every, duration, out
        self.kills: list[tuple[int, int]] = []  # (rank, pid) of each proc killed
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
        self._say(f"chaos ended ({why}): {len(self.kills)} proc(s) killed")


class ChaosCommands:
    """`%mesh chaos MESH --kill-every DUR [--for DUR]` and `%mesh chaos MESH --stop`."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.runs: dict[str, ChaosRun] = {}  # proc mesh name -> its chaos

    def _mesh(self, name: str) -> Any:
        """The one live proc mesh the user named (a variable, or a proc mesh's name)."""
        from runtime import ActorMesh, ProcMesh, get_runtime

        obj = self.ctx.ns.get(name)
        if isinstance(obj, ActorMesh):
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
        assert a.kill_every is not None  # the parser insists
        run = ChaosRun(pm, a.kill_every, a.duration, sys.stdout)
        self.runs[pm.name] = run
        until = f" for {a.duration:g} s" if a.duration else f" until '%mesh chaos {a.mesh} --stop'"
        print(f"[chaos {pm.name}] killing a random proc of {pm.name!r} every "
              f"{a.kill_every:g} s{until}")
        run.start()
