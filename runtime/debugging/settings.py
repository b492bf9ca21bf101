"""Debugger settings: what a breakpoint does when no one can attend to it, and how long
an unattended breakpoint waits. Read from the environment; changeable at run time."""

from __future__ import annotations

import os

POLICIES = ("fail", "continue")

_policy: str = ""
_timeout: float = -1.0


def _env_policy() -> str:
    p = os.environ.get("MONARCH_DEBUG_POLICY", "fail").strip().lower() or "fail"
    return p if p in POLICIES else "fail"


def _env_timeout() -> float:
    try:
        t = float(os.environ.get("MONARCH_DEBUG_TIMEOUT", "600"))
    except ValueError:
        return 600.0
    return t if t > 0 else 600.0


def policy() -> str:
    """'fail' (the call fails naming the breakpoint) or 'continue' (the actor goes on)."""
    return _policy or _env_policy()


def set_policy(value: str) -> None:
    """Set the no-debugger policy for this controller ('fail' or 'continue')."""
    global _policy
    if not isinstance(value, str) or value.strip().lower() not in POLICIES:
        raise ValueError(f"debug policy must be one of {POLICIES}, got {value!r}")
    _policy = value.strip().lower()


def timeout() -> float:
    """Seconds an unattended breakpoint waits before the policy applies."""
    return _timeout if _timeout > 0 else _env_timeout()


def set_timeout(seconds: float) -> None:
    """Set the unattended-breakpoint timeout of this controller, in seconds (> 0)."""
    global _timeout
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        raise ValueError(f"debug timeout must be a number of seconds, got {seconds!r}") from None
    if not s > 0:
        raise ValueError(f"debug timeout must be > 0 seconds, got {seconds!r}")
    _timeout = s


def reset() -> None:
    """Forget run-time changes; the environment decides again (tests use this)."""
    global _policy, _timeout
    _policy, _timeout = "", -1.0
