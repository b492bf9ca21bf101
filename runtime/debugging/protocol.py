"""The debugger's messages: Kind.DEBUG with `Header.extra = {"op": ..., ...}` (msgpack only).

actor -> controller: read (pdb wants a line; carries output and where it stopped),
    output (text printed between prompts), resumed (the actor runs again),
    source (asks for the lines of a file it lacks), nopm (no failed frame kept),
    dap_reply (the answer to a structured request), getbreaks (a starting proc asks its
    owner for the line-breakpoint table).
controller -> actor: ack, input (a line for pdb), release (continue; optional clear of
    breakpoints), abort (raise BreakpointWithoutDebugger there), source_reply, postmortem,
    dap (a structured request to a paused session: stackTrace, scopes, variables, evaluate),
    breaks (the line-breakpoint table, {file: [lines]}; an owner proc passes it on).
"""

from __future__ import annotations

from typing import Any

from ..transport.framing import Header, Kind

__all__ = [
    "FROM_ACTOR", "TO_ACTOR", "RELEASE_COMMAND", "BreakpointWithoutDebugger", "header", "op_of",
]

FROM_ACTOR = frozenset({"read", "output", "resumed", "source", "nopm", "dap_reply"})
TO_ACTOR = frozenset({"ack", "input", "release", "abort", "source_reply", "postmortem", "dap",
                      "breaks"})

RELEASE_COMMAND = "_monarch_release"


class BreakpointWithoutDebugger(RuntimeError):
    """A breakpoint was hit where no debugger could attend to it (the policy is 'fail')."""


def header(op: str, **fields: Any) -> Header:
    return Header(Kind.DEBUG, extra={"op": op, **fields})


def op_of(h: Header) -> str:
    e = h.extra
    return e.get("op", "") if isinstance(e, dict) else ""
