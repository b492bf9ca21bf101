"""Debugger settings: what a breakpoint does when no one can attend to it, and how long
an unattended breakpoint waits. Backed by runtime.config (MONARCH_DEBUG_POLICY and
MONARCH_DEBUG_TIMEOUT); a value set here wins over the environment."""

from __future__ import annotations

from ..config import config

__all__ = ["POLICIES", "policy", "set_policy", "timeout", "set_timeout", "reset"]

POLICIES = ("fail", "continue")


def policy() -> str:
    """'fail' (the call fails naming the breakpoint) or 'continue' (the actor goes on)."""
    return config.debug_policy


def set_policy(value: str) -> None:
    """Set the no-debugger policy for this controller ('fail' or 'continue')."""
    if not isinstance(value, str) or value.strip().lower() not in POLICIES:
        raise ValueError(f"debug policy must be one of {POLICIES}, got {value!r}")
    config.debug_policy = value.strip().lower()


def timeout() -> float:
    """Seconds an unattended breakpoint waits before the policy applies."""
    return config.debug_timeout


def set_timeout(seconds: float | str) -> None:
    """Set the unattended-breakpoint timeout of this controller, in seconds (> 0; a
    number's text too: `%timeout 30` in the console)."""
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        raise ValueError(f"debug timeout must be a number of seconds, got {seconds!r}") from None
    if not s > 0:
        raise ValueError(f"debug timeout must be > 0 seconds, got {seconds!r}")
    config.debug_timeout = s


def reset() -> None:
    """Forget run-time changes; the environment decides again (tests use this)."""
    config.reset("debug_policy", "debug_timeout")
