"""The runtime's public exceptions: what a caller sees when remote work goes wrong."""

from __future__ import annotations

import concurrent.futures
import linecache
import re
from typing import Any, Callable, Optional

__all__ = [
    "RuntimeErrorBase", "ActorError", "with_source_lines", "SupervisionError",
    "MessageTooLargeError", "SerializationError", "MeshStoppedError", "AttachRefusedError",
    "CancelledError", "InjectedFault", "actor_failed_message",
]


class RuntimeErrorBase(Exception):
    """Base class of every error the runtime raises on purpose."""


class ActorError(RuntimeErrorBase):
    """An endpoint raised; carries the remote traceback. The actor itself lives on."""

    def __init__(
        self,
        message: str,
        *,
        remote_traceback: str = "",
        exception_type: str = "",
        mesh: str = "",
        rank: Optional[int] = None,
        endpoint: str = "",
        exception: Optional[BaseException] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.remote_traceback = remote_traceback
        self.exception_type = exception_type
        self.mesh = mesh
        self.rank = rank
        self.endpoint = endpoint
        self.exception = exception

    def __str__(self) -> str:
        where = f"{self.mesh}.{self.endpoint}" if self.endpoint else self.mesh
        # Monarch's wording ("Actor call mesh.endpoint failed ...")
        head = (f"Actor call {where} failed (rank {self.rank}): {self.message}" if where
                else self.message)
        if self.remote_traceback:
            return f"{head}\n\nRemote traceback:\n{self.remote_traceback.rstrip()}"
        return head

    def __reduce__(self) -> Any:
        return (
            _rebuild_actor_error,
            (self.message, self.remote_traceback, self.exception_type, self.mesh,
             self.rank, self.endpoint),
        )


def _rebuild_actor_error(message, tb, etype, mesh, rank, endpoint) -> ActorError:
    return ActorError(message, remote_traceback=with_source_lines(tb), exception_type=etype,
                      mesh=mesh, rank=rank, endpoint=endpoint)


_FRAME = re.compile(r'^( *)File "(.+)", line (\d+), in ')


def with_source_lines(tb_text: str, getline: Callable[[str, int], str] = linecache.getline
                      ) -> str:
    """A formatted traceback with the source line filled in under each frame that lacks
    one, from this process's `getline`: a proc cannot read the notebook cell (or a script
    on another host) that its code came from, but the controller that receives the
    traceback can."""
    if not tb_text or "File " not in tb_text:
        return tb_text
    lines = tb_text.splitlines(keepends=True)
    out: list[str] = []
    for i, line in enumerate(lines):
        out.append(line)
        m = _FRAME.match(line)
        if m is None:
            continue
        indent = m.group(1) + "  "
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if following.startswith(indent) and following.strip():
            continue  # the source line is there already
        source = getline(m.group(2), int(m.group(3))).strip()
        if source:
            out.append(f"{indent}{source}\n")
    return "".join(out)


class SupervisionError(RuntimeErrorBase, RuntimeError):
    """The actor (or its process) has failed; calls to it cannot complete (a RuntimeError,
    as Monarch's is)."""

    def __init__(self, message: str, failure: Any = None) -> None:
        super().__init__(message)
        self.failure = failure

    def __reduce__(self) -> Any:
        return (SupervisionError, (self.args[0], self.failure))


class MessageTooLargeError(RuntimeErrorBase, ValueError):
    """A message exceeds the configured size limit; nothing was sent."""


class SerializationError(RuntimeErrorBase, TypeError):
    """An argument or a return value could not be pickled."""


class MeshStoppedError(SupervisionError):
    """The mesh was stopped; it accepts no more calls (a SupervisionError, hence a
    RuntimeError, as in Monarch)."""

    def __reduce__(self) -> Any:
        return (MeshStoppedError, (self.args[0], self.failure))


class AttachRefusedError(RuntimeErrorBase, RuntimeError):
    """A host agent refused this controller: another live controller owns it (pass
    `takeover=True` to take its meshes over), or a kept job's lease has ended."""


class CancelledError(RuntimeErrorBase, concurrent.futures.CancelledError):
    """A call ended by `Future.cancel()` (or `%mesh cancel`): its actors were told to stop
    it (a running handler gets an exception at its next Python bytecode, an async one is
    cancelled at its next await, a queued call is not run) and stay usable."""


class InjectedFault(Exception):
    """Raised in an endpoint on purpose by `inject_actor_failures` with an
    `ActorFailurePolicy(..., mode="raise")`: the call fails with an ActorError naming it,
    and the actor lives on."""


def actor_failed_message(cls_name: str, mesh: str, rank: int, cause: str,
                         name: str = "") -> str:
    """The first line of a SupervisionError for a failed actor (Monarch's wording); `name`
    is the actor's Monarch name (`<root>.<mod.Cls mesh{..}>`, its spawners' names first)."""
    who = f"{cls_name} {mesh} (rank {rank})"
    return (f"Actor {who} exited because of the following reason: The actor {name or who} "
            f"and all its descendants have failed: {cause}")
