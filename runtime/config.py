"""Runtime settings, read once from the environment; tests and users may change them."""

from __future__ import annotations

import os
from dataclasses import dataclass


def _f(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


@dataclass
class Config:
    heartbeat_interval: float = _f("MONARCH_HEARTBEAT_INTERVAL", 0.5)
    # A process silent for this long is declared hung and failed.
    heartbeat_timeout: float = _f("MONARCH_HEARTBEAT_TIMEOUT", 5.0)
    # Largest message (pickle plus buffers) that may be sent.
    max_message_bytes: int = int(_f("MONARCH_MAX_MESSAGE_BYTES", 2 << 30))
    # Lines of stderr kept per proc for failure reports.
    stderr_tail_lines: int = 20
    # Deliver SIGINT-like interrupts to remote actors when a wait is interrupted.
    interrupt_remote: bool = os.environ.get("MONARCH_INTERRUPT_REMOTE", "1") != "0"
    # How long stop() waits for actors to clean up before killing procs.
    stop_timeout: float = _f("MONARCH_STOP_TIMEOUT", 5.0)


config = Config()
