"""Sending: session and cluster tokens, reply addresses, TCP keys, send and cast.

Sends go out from the calling thread on the process's one connection to each peer (see
transport.loop), so a call made in a user thread or an actor thread does not wait for the
I/O thread. A message that expects a reply names its port: if it cannot be sent, that
call fails.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Callable, Collection, Optional, Sequence

from ..config import config
from ..transport import auth, casttree, framing
from ..transport.framing import Header, Kind
from ..transport.loop import IOLoop
from ..transport.payloads import FanoutExtra, SpawnExtra, SpawnSpec

__all__ = ["AGENT_CASTS_KEPT", "Messenger"]

log = logging.getLogger("runtime")

#: casts to agents (spawns) whose relays' deaths are watched, newest kept
AGENT_CASTS_KEPT = 64


class Messenger:
    """Builds and sends messages for one process (any thread)."""

    def __init__(self, loop: IOLoop, proc_id: str, token: bytes,
                 keys: Optional[auth.CurveKeys]) -> None:
        self.loop = loop
        self.proc_id = proc_id
        self.token = token
        self.keys = keys
        self.cluster_token: Optional[bytes] = None
        self.address = ""
        self.tcp_address = ""
        self._tcp_by_key: dict[bytes, str] = {}
        self.far_agents: set[str] = set()  # addresses of host agents on other hosts
        self.dead_agents: set[str] = set()  # host agents known dead: casts go around them
        self._trees: dict = {}  # (targets, base, fanout) -> the cast tree (agent_down clears)
        self.cast_messages = 0  # messages `cast` has put on the wire (counted per cast)
        #: the addresses of the host agents whose death this process hears of (set by the
        #: runtime): only a mesh on such agents is cast to down a tree, since a relay's death
        #: must be seen to fail what waits on its subtree
        self.watched_agents: Optional[Callable[[], Collection[str]]] = None
        self._watched: dict = {}  # id(base) -> (base, every agent of it watched)
        #: trees of casts to agents still in progress (a spawn): what to do if a relay dies
        self._agent_casts: collections.deque = collections.deque(maxlen=AGENT_CASTS_KEPT)
        self._agent_casts_lock = threading.Lock()
        if keys is not None:
            self.use_keys(keys)

    # -- clusters and TCP --------------------------------------------------------------------
    def use_keys(self, keys: auth.CurveKeys) -> None:
        """Join a cluster: accept its token, and use CurveZMQ for TCP peers."""
        if self.keys is None:
            self.keys = keys
            self.loop.keys = keys
        if self.cluster_token is None:
            self.cluster_token = auth.cluster_token(keys)
        tok = auth.cluster_token(keys)
        if tok not in self.loop.tokens:
            self.loop.tokens.append(tok)

    def enable_tcp(self, ip: str, keys: Optional[auth.CurveKeys] = None) -> str:
        """Listen on TCP (CurveZMQ) on `ip` for peers holding `keys`; returns the address."""
        keys = keys or self.keys
        if keys is None:
            raise PermissionError("TCP across hosts needs a CurveZMQ key file "
                                  "(python -m runtime.transport.auth keygen PATH)")
        self.use_keys(keys)
        addr = self._tcp_by_key.get(keys.public)
        if addr is None:
            addr = self._tcp_by_key[keys.public] = self.loop.bind_extra(f"tcp://{ip}:0", keys)
        if not self.tcp_address:
            self.tcp_address = addr
        return addr

    def reached_through(self, keys: auth.CurveKeys, address: str) -> str:
        """A proc with a host agent: other hosts reach it at `address` (its agent's TCP
        address, `#`, its id): they send there, the agent passes it on, and the proc holds
        no TCP listener of its own (docs/transport.md, "Across hosts")."""
        self.use_keys(keys)
        self._tcp_by_key[keys.public] = address
        if not self.tcp_address:
            self.tcp_address = address
        return address

    def tcp_addresses(self) -> dict[bytes, str]:
        """{cluster public key: TCP address} under which this process takes messages from
        other hosts (its own listener, or a gateway's inner address), a copy."""
        return dict(self._tcp_by_key)

    def use_gateway(self, keys: auth.CurveKeys, address: str, timeout: float,
                    on_loss: Optional[Any] = None) -> str:
        """Reach the cluster of `keys` through the gateway at `address` (one connection this
        process opens; nothing there dials back): its processes send to the gateway's inner
        address, returned, which becomes this process's TCP address for that cluster.
        `on_loss(link, text)`: a cut lost messages (I/O thread)."""
        from ..transport.gateway import GatewayLink

        self.use_keys(keys)
        link = self.loop.gateways.get(keys.public)
        if link is not None and not link.closed:
            return link.inner_address
        link = GatewayLink(self.loop, address, keys)
        if on_loss is not None:
            link.on_loss = lambda text: on_loss(link, text)
        inner = link.hello(timeout)
        link.start()
        self.loop.gateways[keys.public] = link
        self._tcp_by_key[keys.public] = inner
        if not self.tcp_address:
            self.tcp_address = inner
        return inner

    def gateway_of(self, addr: str) -> Optional[Any]:
        """The gateway link `addr` is reached through, or None."""
        gws = self.loop.gateways
        if not gws or not addr.startswith("tcp://"):
            return None
        keys = self.loop.peer_keys.get(addr, self.keys)
        return gws.get(keys.public) if keys is not None else None

    def add_peer(self, addr: str, keys: auth.CurveKeys) -> None:
        """Remember that the TCP peer at `addr` belongs to the cluster of `keys`. A host:port
        a peer of another key had (an ephemeral port that came back, in a long-lived
        controller) is dialed anew: the connection made for that peer authenticates its key,
        so nothing sent on it would reach this one."""
        used = self.loop.peer_keys.get(addr, self.keys)
        self.loop.peer_keys[addr] = keys
        if addr.startswith("tcp://") and used is not None and used.public != keys.public:
            self.loop.run_sync(self.loop.forget_peer, addr)  # (an ipc path is never reused)

    def same_cluster_as(self, addr: str, known: str) -> None:
        """The TCP peer at `addr` (a proc) holds the cluster key of `known` (its agent): a
        controller attached to several clusters answers each proc with its own key."""
        keys = self.loop.peer_keys.get(known)
        if keys is not None:
            self.add_peer(addr, keys)

    def forget_cluster_of(self, addr: str) -> None:
        """A proc recorded by `same_cluster_as` is gone."""
        self.loop.peer_keys.pop(addr, None)

    def token_for(self, addr: str) -> bytes:
        if addr.startswith("tcp://") or addr in self.loop.peer_keys:  # an ipc worker too
            keys = self.loop.peer_keys.get(addr, self.keys)
            if keys is not None:
                return auth.cluster_token(keys)
        return self.token

    def reply_address_for(self, target_addr: str) -> str:
        """The address of this process that a peer at `target_addr` can reach."""
        if target_addr.startswith("tcp://") or target_addr in self.loop.peer_keys:
            keys = self.loop.peer_keys.get(target_addr, self.keys)
            if keys is not None and keys.public in self._tcp_by_key:
                return self._tcp_by_key[keys.public]
            if self.tcp_address:
                return self.tcp_address
        return self.address

    # -- sending ---------------------------------------------------------------------------------
    def send(self, addr: str, header: Header, body: bytes = b"", buffers: tuple = ()) -> None:
        """Send one message to `addr` from the calling thread."""
        if not header.src:
            header.src = self.proc_id
        self.loop.send(addr, framing.build(self.token_for(addr), header, body, buffers),
                       header.port if header.reply else 0)

    def send_to_proc(self, address: str, route: Optional[tuple], header: Header,
                     body: bytes = b"", buffers: tuple = (),
                     base: Optional[Sequence[str]] = None) -> None:
        """Send to one proc: directly when its address is known, else through its agent
        (down the cast tree of `base`, its mesh's agents, when that has one)."""
        if address:
            self.send(address, header, body, buffers)
        elif route:
            self.cast([(address, route)], header, body, buffers, base=base)

    def _gathers(self, agent_addr: str) -> bool:
        mode = config.gather_replies
        return mode == "on" or (mode == "auto" and agent_addr in self.far_agents)

    # -- agents known dead (the cast tree goes around them) --------------------------------------
    def agent_down(self, address: str) -> None:
        """The host agent at `address` is dead: casts go around it from now on (for good:
        a host that comes back within its lease relays nothing more, so no path changes
        twice)."""
        if address not in self.dead_agents:
            self.dead_agents.add(address)
            self._trees.clear()
            self._watched.clear()

    def _watches(self, base: Sequence[str]) -> bool:
        """Whether this process hears of the death of every agent of `base` (kept per base
        object: a mesh keeps its own)."""
        got = self._watched.get(id(base))
        if got is not None and got[0] is base:
            return got[1]
        known = self.watched_agents() if self.watched_agents is not None else ()
        ok = bool(known) and all(a in known for a in base)
        if len(self._watched) >= 64:
            self._watched.pop(next(iter(self._watched)))
        self._watched[id(base)] = (base, ok)
        return ok

    def agent_tree(self, base: Sequence[str], want: dict[str, list]
                   ) -> Optional[casttree.Tree]:
        """The tree a message to the agents of `base` (a host mesh's, in rank order) goes
        down, `want` naming what each is asked for (its procs to spawn); None when `base`
        has at most `cast_fanout` agents or this process does not hear of all their deaths
        (then the message goes to each agent itself)."""
        if len(base) <= config.cast_fanout or not self._watches(base):
            return None
        return casttree.build(base, want, config.cast_fanout, self.dead_agents)

    def cast_to_agents(self, tree: casttree.Tree, kind: Kind, common: SpawnExtra,
                       per_agent: dict[str, SpawnSpec],
                       on_relay_died: Callable[[str], bool]) -> None:
        """Send one `kind` message down `tree` (from `agent_tree`): each of the sender's
        children gets `common`, its own part of `per_agent` and the parts of its subtree
        (`sub`, `specs`) to relay (runtime/host/casts.py). While the cast is in progress,
        `on_relay_died(agent)` runs on the I/O thread when one of its relays dies (to reach
        that relay's subtree some other way); it returns True once the cast is over."""
        with self._agent_casts_lock:
            self._agent_casts.append((tree, on_relay_died))
        for node in tree.roots:
            extra: SpawnExtra = {**common}
            if node[0] in per_agent:
                extra.update(per_agent[node[0]])
            if node[2]:
                extra["sub"] = node[2]
                extra["specs"] = {a: per_agent[a] for k in node[2]
                                  for a in casttree.agents_of(k) if a in per_agent}
            self.send(node[0], Header(kind, extra=extra))
        self.cast_messages += len(tree.roots)

    def relay_down(self, address: str) -> None:
        """A host agent died (I/O thread): the casts to agents still in progress through it
        reach its subtree some other way (`cast_to_agents`' `on_relay_died`)."""
        with self._agent_casts_lock:
            casts = list(self._agent_casts)
        over = []
        for entry in casts:
            tree, on_relay_died = entry
            if address in tree.below:  # a relay of it
                try:
                    if on_relay_died(address):
                        over.append(entry)
                except Exception:
                    log.exception("a cast's relay-death handler failed")
        if over:
            with self._agent_casts_lock:
                for entry in over:
                    try:
                        self._agent_casts.remove(entry)
                    except ValueError:
                        pass

    def tree_for(self, targets: list, base: Optional[Sequence[str]]) -> Optional[casttree.Tree]:
        """The cast tree a cast to `targets` ((address, route) per proc) goes down, laid over
        `base` (the agents of their mesh, in rank order), or None when it goes straight
        to each agent (`base` has at most `cast_fanout` agents). Kept for the same targets
        list object: a whole mesh's casts build it once."""
        fanout = config.cast_fanout
        if base is None or len(base) <= fanout or not self._watches(base):
            return None
        key = (id(targets), id(base), fanout)
        got = self._trees.get(key)
        if got is not None and got[0] is targets and got[1] is base:
            return got[2]
        by_agent: dict[str, list] = {}
        for address, route in targets:
            if not address and route:
                by_agent.setdefault(route[0], []).append(route[1])
        tree = casttree.build(base, by_agent, fanout, self.dead_agents)
        if len(self._trees) >= 64:
            self._trees.pop(next(iter(self._trees)))
        self._trees[key] = (targets, base, tree)
        return tree

    def cast(self, targets: list, header: Header, body: bytes = b"",
             buffers: tuple = (), gather: bool = False,
             base: Optional[Sequence[str]] = None,
             tree: Optional[casttree.Tree] = None,
             reduce: Optional[bytes] = None) -> Optional[casttree.Tree]:
        """Send one message to many procs: directly to those with an address, and one
        FANOUT per host agent for the rest (the agent delivers to its local procs). With
        `gather`, each agent sends the replies of its procs back as one REPLY_BATCH.

        `base`: the agents of the targets' mesh in rank order. When it has more than
        `cast_fanout`, the FANOUTs go down the cast tree laid over it (runtime/transport/
        casttree.py) and the tree is returned (None otherwise): the caller keeps it to know
        which replies come through which relay (`tree`: that tree, from `tree_for`).

        `reduce`: a reduced call's pickled combine; the agents that gather its replies fold
        them on the way up (runtime/host/folds.py), and every agent with several of the
        targets gathers (unless `gather_replies` is "off")."""
        if not header.src:
            header.src = self.proc_id
        by_agent: dict[str, list] = {}
        frames: list = []
        frames_tok: Optional[bytes] = None
        send = self.loop.send
        port = header.port if header.reply else 0  # the call fails if its send does
        for address, route in targets:
            if address:
                tok = self.token_for(address)
                if tok != frames_tok:
                    frames, frames_tok = framing.build(tok, header, body, buffers), tok
                send(address, frames, port)
                self.cast_messages += 1
            elif route:
                by_agent.setdefault(route[0], []).append(route[1])
        if not by_agent:
            return None
        inner = framing.encode_header(header)
        if tree is None:
            tree = self.tree_for(targets, base)
        if tree is not None:
            gathered = gather and config.gather_replies != "off"
            for agent_addr, procs, sub in tree.roots:
                extra: FanoutExtra = {"header": inner, "procs": procs}
                if sub:
                    extra["sub"] = sub
                if gathered:
                    extra["gather"] = True
                    if reduce:
                        extra["reduce"] = reduce
                h = Header(Kind.FANOUT, src=self.proc_id, extra=extra)
                send(agent_addr, framing.build(self.token_for(agent_addr), h, body, buffers),
                     port)
            self.cast_messages += len(tree.roots)
            return tree
        for agent_addr, procs in by_agent.items():
            each: FanoutExtra = {"header": inner, "procs": procs}
            if gather and len(procs) > 1 and (self._gathers(agent_addr) or (
                    reduce and config.gather_replies != "off")):
                each["gather"] = True
                if reduce:
                    each["reduce"] = reduce
            h = Header(Kind.FANOUT, src=self.proc_id, extra=each)
            send(agent_addr, framing.build(self.token_for(agent_addr), h, body, buffers),
                 port)
        self.cast_messages += len(by_agent)
        return None
