"""Leases: what a listening host agent keeps for a next controller (docs/multihost.md,
"Kept meshes"). A proc spawned with keep > 0 outlives its controller by that many seconds;
an agent started with --keep (a kept job's) ends itself, and the last of its job's agents
the job's directory, once its lease has passed with no controller attached and no proc
left. Runs on the agent's I/O thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import time
from typing import Any, Callable, Optional

__all__ = ["Leases"]

log = logging.getLogger("runtime.host")


class Leases:
    """The agent's record of its procs (mesh, rank, shape, lease) and of the controller
    that went away (who, when it was last heard). A lease is a duration on `clock`, the
    clock of the agent's own stamps (`owner_last_seen`): time.monotonic; tests pass theirs."""

    def __init__(self, agent: Any, keep_default: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.agent = agent
        self.keep_default = keep_default
        self.clock = clock
        self.info: dict[str, dict] = {}  # proc id -> mesh, rank, labels, sizes, keep, pid
        self.prev_owner = ""  # the controller before the current one (or before none)
        self.prev_seen = clock()  # ... when it was last heard
        #: when the last controller went away (None: one is attached)
        self.orphaned_at: Optional[float] = None if agent.owner else clock()

    def spawned(self, proc_id: str, pid: int, spec: dict) -> None:
        """A proc started, from a spawn request `spec` (its mesh, rank, shape, keep)."""
        self.info[proc_id] = {"mesh": spec["mesh"], "rank": spec.get("rank", 0), "pid": pid,
                              "labels": spec.get("labels"), "sizes": spec.get("sizes"),
                              "keep": spec.get("keep", 0.0)}

    def exited(self, proc_id: str) -> None:
        self.info.pop(proc_id, None)

    def kept(self, proc_id: str) -> bool:
        """Whether the proc outlives its controller (for its lease)."""
        return self.info.get(proc_id, {}).get("keep", 0) > 0

    def orphan(self, why: str) -> None:
        """The controller is gone (`why`): its procs end, except kept ones, whose lease runs
        from when it was last heard."""
        a = self.agent
        self.prev_owner, self.prev_seen = a.owner, a.owner_last_seen
        a.owner, a.owner_id = "", ""
        self.orphaned_at = a.owner_last_seen
        a.kill_procs(why, kept_too=False)
        kept = [i for i in self.info.values() if i.get("keep", 0) > 0]
        if kept:
            log.warning("%s: keeping %d procs for their lease (up to %.0f s) for a controller "
                        "to reattach", why, len(kept), max(i["keep"] for i in kept))

    def adopt(self, new_owner: str, now: float) -> dict:
        """A new controller attached: the kept procs are its (their output and exit
        reports go to it); what its attach answer carries about them."""
        self.orphaned_at = None
        kept = []
        for pp in self.agent.procs.values():
            info = self.info.get(pp.proc_id)
            if info is not None and info.get("keep", 0) > 0 and not info.get("ending"):
                pp.owner = new_owner
                kept.append({"proc_id": pp.proc_id, **info})
        return {"kept": kept, "prev_owner": self.prev_owner,
                "prev_silent_for": now - self.prev_seen}

    def check(self) -> None:
        """With no controller attached: end the procs whose lease has passed (more than
        their `keep` seconds without a controller: not at exactly `keep`); an agent of a
        kept job ends itself once its own lease has passed and no proc is left."""
        a = self.agent
        if self.orphaned_at is None or a.stopping:
            return
        gone_for = self.clock() - self.orphaned_at
        for proc_id, info in self.info.items():
            if 0 < info.get("keep", 0) < gone_for and not info.get("ending"):
                info["ending"] = True
                log.warning("lease of proc %s (mesh %s rank %s) ended: %.0f s without a "
                            "controller", proc_id, info.get("mesh"), info.get("rank"), gone_for)
                pp = a.procs.get(proc_id)
                if pp is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pp.pid, signal.SIGKILL)
        if self.keep_default and gone_for > self.keep_default and not a.procs:
            self.remove_job_files()
            a.shutdown(f"lease ended ({gone_for:.0f} s without a controller)")

    def remove_job_files(self) -> None:
        """At the end of a kept job's lease: this agent's address file goes; the last of
        the job's agents (the one whose removal empties the address directory) removes the
        job's directory (`--job-dir`)."""
        args = self.agent.args
        addr = getattr(args, "address_file", None)
        if not addr:
            return
        with contextlib.suppress(OSError):
            os.unlink(addr)
        job_dir = getattr(args, "job_dir", None)
        if not job_dir:
            return
        try:
            os.rmdir(os.path.dirname(addr))  # atomic: only the last agent's succeeds
        except OSError:
            return
        shutil.rmtree(job_dir, ignore_errors=True)
