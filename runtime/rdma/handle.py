"""The picklable description of a remote buffer: enough to reach it, nothing more."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["Handle"]


@dataclass(frozen=True)
class Handle:
    """Owner identity, buffer id, address/size, data-server addresses and (maybe) the secret."""

    pid: int
    start_time: int  # owner's start time (clock ticks): tells a reused pid apart
    host_id: str  # hostname/boot id/pid namespace
    hostname: str
    buffer_id: int
    addr: int
    size: int
    dtype: Optional[str]
    device: str
    addresses: tuple[str, ...]
    secret: Optional[bytes]  # None when the session token comes from MONARCH_SESSION_TOKEN
    ib: bool  # the owner had an RDMA device when the buffer was made
    actor: Optional[str] = None  # owning actor's name when created inside an actor
