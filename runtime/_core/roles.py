"""Roles: what differs between the controller's runtime and a proc's, as explicit objects.

The runtime asks its role for extra message handlers, for what its heartbeats carry, and
what to do with a failure nobody in this process supervises.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Optional

from .._base import features as _features
from ..supervision import MeshFailure

__all__ = ["Handler", "ControllerRole", "ProcRole"]

log = logging.getLogger("runtime")

Handler = Callable[..., None]


class ControllerRole:
    """The controller: a script or notebook kernel; unhandled failures go to the fault hook."""

    is_proc = False
    agent_address = ""  # the host agent of this process's host ("" in a controller)
    host_id = ""

    def handlers(self) -> dict[int, Handler]:
        """Message kinds this role handles, beyond the runtime's own."""
        return {}

    def heartbeat_extra(self) -> Optional[dict]:
        return None

    local_server: Any = None  # the ProcServer of actors hosted here (this_proc()), if any
    this_proc_mesh: Any = None  # this_proc(), once made (runtime._meshes.local)

    def on_unhandled_failure(self, owner_actor: Optional[str], failure: MeshFailure) -> None:
        """Give the failure to the owning actor hosted here (`this_proc()`), else run
        `runtime.unhandled_fault_hook(failure)` on its own thread (the user's failures only:
        `failures.users_failure`)."""
        server = self.local_server
        if owner_actor is not None and server is not None and \
                server.deliver_to_actor(owner_actor, failure):
            return

        def run_hook() -> None:
            try:  # the user sets it on the root package, above every layer: via _features
                hook = _features.call("unhandled_fault_hook")
                if hook is not None:
                    hook(failure)
            except SystemExit:
                os._exit(1)
            except Exception:
                log.exception("unhandled_fault_hook raised")

        threading.Thread(target=run_hook, name="monarch-fault-hook", daemon=True).start()


class ProcRole:
    """A proc: hosts actors (through `server`) and knows its host agent."""

    is_proc = True
    this_proc_mesh: Any = None  # this_proc(), once made (runtime._meshes.local)

    def __init__(self, server: Any, agent_address: str, host_id: str) -> None:
        self.server = server
        self.agent_address = agent_address
        self.host_id = host_id

    def handlers(self) -> dict[int, Handler]:
        return self.server.handlers()

    def heartbeat_extra(self) -> Optional[dict]:
        return self.server.heartbeat_extra()

    def on_unhandled_failure(self, owner_actor: Optional[str], failure: MeshFailure) -> None:
        """Give the failure to the owning actor's `__supervise__`, else log it (the user's
        failures only: `failures.users_failure`)."""
        if owner_actor is not None and self.server.deliver_to_actor(owner_actor, failure):
            return
        log.error("unsupervised failure in proc: %s", failure)
