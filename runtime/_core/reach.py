"""Addresses of a process as seen from other hosts: how a ref to an actor living in the
controller (`this_proc()`, `get_or_spawn_controller()`) or in a proc's own `this_proc()`
stays callable from every host of the cluster.

Such an actor is known by its process's ipc address, which only its own host can dial. A
ref pickled by that process also carries the process's TCP inboxes (one per cluster key,
or the gateway's inner address when the controller is reached through a gateway), tagged
with a digest of the cluster's public key, and a digest of the process's session token;
the receiving process keeps the ipc address when it runs on the same host in the same
session (its stream would be refused otherwise: another session's token), and otherwise
takes the TCP address of its own cluster.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from ..transport.auth import CurveKeys
    from .runtime import Runtime

__all__ = ["SESSION", "key_tag", "own_alternatives", "alternatives", "my_tags", "choose"]


SESSION = "~session"  # the entry of an alternatives dict naming the owner's session


def _tag(data: bytes) -> str:
    return hashlib.sha256(b"monarch-reach\0" + data).hexdigest()[:16]


def key_tag(keys: "CurveKeys") -> str:
    """A short digest naming a cluster key (its public half), never the key itself."""
    return _tag(keys.public)


def own_alternatives(rt: "Runtime") -> dict:
    """{key tag: TCP address} under which this process takes messages from other hosts."""
    m = rt.messenger
    out = {}
    for pub, addr in m.tcp_addresses().items():
        out[_tag(pub)] = addr
    if not out and m.tcp_address and m.keys is not None:
        out[key_tag(m.keys)] = m.tcp_address
    if out:
        out[SESSION] = _tag(m.token)
    return out


def alternatives(rt: "Runtime", addresses: list, known: Optional[list]) -> list:
    """Per rank, the TCP alternatives a pickled ref carries: this process's own for ranks
    at its ipc address, else those the ref arrived with ([] when there are none: most refs,
    whose procs are reached by their agents)."""
    if not known and rt.address not in addresses:
        return []
    mine: Optional[dict] = None
    out = []
    for i, a in enumerate(addresses):
        alt = (known[i] if known and i < len(known) else None) or {}
        if a and a == rt.address:
            if mine is None:
                mine = own_alternatives(rt)
            alt = {**alt, **mine}
        out.append(alt)
    return out if any(out) else []


def my_tags(rt: "Runtime") -> set:
    """Tags of the cluster keys this process holds."""
    m = rt.messenger
    tags = {_tag(pub) for pub in m.tcp_addresses()}
    if m.keys is not None:
        tags.add(key_tag(m.keys))
    return tags


def choose(rt: "Runtime", addresses: list, hosts: list, alts: list) -> list:
    """The address to dial for each rank from this process: an ipc address of another host,
    or of another session, is replaced by its TCP alternative of this process's cluster
    (kept when none fits: a send there then fails and names it)."""
    if not alts or not any(alts):
        return list(addresses)
    tags = None
    out = []
    for i, a in enumerate(addresses):
        alt = alts[i] if i < len(alts) else None
        host = hosts[i] if i < len(hosts) else ""
        if alt and a.startswith("ipc://") and (
                (host and host != rt.host) or alt.get(SESSION) != _tag(rt.messenger.token)):
            if tags is None:
                tags = my_tags(rt)
            a = next((v for k, v in alt.items() if k in tags and k != SESSION), a)
        out.append(a)
    return out
