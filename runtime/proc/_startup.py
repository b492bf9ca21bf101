"""What a proc applies of `spawn_procs(...)` before it says hello: its CPU pinning
(`proc_bind=`, MONARCH_PROC_BIND) and the `bootstrap=` callable (MONARCH_PROC_BOOTSTRAP).

Layer 6 (process roles, under `proc`): imports nothing of runtime.
"""

from __future__ import annotations

import inspect
import os
import sys
import traceback

__all__ = ["cpu_list", "apply_proc_bind", "run_bootstrap"]


def cpu_list(text: str) -> set[int]:
    """A kernel CPU list ("0-3,8") as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def apply_proc_bind() -> None:
    """`spawn_procs(proc_bind=...)`: pin this proc to CPUs, or to a NUMA node's CPUs."""
    spec = os.environ.pop("MONARCH_PROC_BIND", "")
    if not spec:
        return
    import json

    bind = json.loads(spec)
    cpus = cpu_list(bind["cpus"]) if "cpus" in bind else set()
    for node in filter(None, bind.get("cpunodebind", "").split(",")):
        with open(f"/sys/devices/system/node/node{int(node)}/cpulist") as f:
            cpus |= cpu_list(f.read())
    if cpus:
        os.sched_setaffinity(0, cpus)


def run_bootstrap(data: str) -> None:
    """Run the `spawn_procs(bootstrap=...)` callable (base64 cloudpickle from the controller
    that spawned this proc) before the proc says hello; if it raises, the proc exits 1."""
    if not data:
        return
    import asyncio
    import base64
    import pickle

    try:
        fn = pickle.loads(base64.b64decode(data))
        r = fn()
        if inspect.iscoroutine(r):
            asyncio.run(r)
    except BaseException:  # noqa: BLE001 - reported, then the proc fails to start
        print("bootstrap failed:", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
