"""Which actor is running on this thread (layer 1, basics: imports nothing of runtime).

A thread-local, set by `proc` around each message an actor handles and read by `actor`,
`logs` and `rdma`: it lives here, at the bottom, so those parts need not import the actor
API or the proc to ask "who is calling?".
"""

from __future__ import annotations

import threading
from typing import Any, Optional

__all__ = ["local", "set_context", "get_context", "current_instance"]

#: `.ctx`: the running actor's ActorContext; `.actor`: its proc-side ActorInstance.
local = threading.local()


def set_context(ctx: Optional[Any]) -> None:
    """Make `ctx` (an ActorContext, or None) this thread's running actor."""
    local.ctx = ctx


def get_context() -> Optional[Any]:
    """This thread's running actor's ActorContext (None outside actor threads)."""
    return getattr(local, "ctx", None)


def current_instance() -> Optional[Any]:
    """The proc's ActorInstance whose thread is running (None outside actor threads)."""
    return getattr(local, "actor", None)
