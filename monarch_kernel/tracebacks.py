"""The runtime's errors in a cell show the user's lines, not the runtime's frames: an
`ActorError` or `SupervisionError` raised by `.get()` or a call is shown with the frames
inside `runtime/` left out (the error's message says what happened; the remote traceback
is in it)."""

from __future__ import annotations

import os
import types
from typing import Any, Optional

import runtime

__all__ = ["without_runtime_frames", "install"]

_RUNTIME_DIR = os.path.dirname(os.path.abspath(runtime.__file__)) + os.sep


def _in_runtime(tb: types.TracebackType) -> bool:
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_RUNTIME_DIR)


def without_runtime_frames(tb: Optional[types.TracebackType]
                           ) -> Optional[types.TracebackType]:
    """`tb` less its frames in the runtime package (unchanged if nothing else is left)."""
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    keep = [t for t in frames if not _in_runtime(t)]
    if not keep or len(keep) == len(frames):
        return frames[0] if frames else None
    out = None
    for t in reversed(keep):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def _show(shell: Any, etype: type, value: BaseException, tb: Any,
          tb_offset: Optional[int] = None) -> None:
    shell.showtraceback((etype, value, without_runtime_frames(tb)), tb_offset=tb_offset)


def install(shell: Any) -> None:
    """Show the runtime's public errors without runtime frames in `shell` (IPython's
    custom exception handler: one per shell; a handler set before is left alone)."""
    from runtime import ActorError, SupervisionError

    if getattr(shell, "custom_exceptions", ()) not in ((), (ActorError, SupervisionError)):
        return
    shell.set_custom_exc((ActorError, SupervisionError), _show)
