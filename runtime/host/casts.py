"""The host agent's part in a cast: delivering a FANOUT to its procs and, in a cast tree,
relaying it to its child agents first (runtime/transport/casttree.py), with the replies of
its subtree gathered here (runtime/host/gather.py); a SPAWN_PROCS down the hosts' tree
relayed the same way; a local proc's message to another host passed on. Runs on the
agent's I/O thread.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any, Callable, cast

from ..transport import casttree, framing
from ..transport.framing import Header, Kind
from ..transport.payloads import FanoutExtra, SpawnExtra
from .gather import ReplyGather

__all__ = ["SPAWNED_KEPT", "UNSURE_KEPT", "CastRelay"]

log = logging.getLogger("runtime.host")

#: proc ids an agent remembers being asked to spawn (a spawn that comes twice starts once)
SPAWNED_KEPT = 4096

#: calls forwarded to one child relay and not yet known to have got there, newest kept
UNSURE_KEPT = 1024


class CastRelay:
    """Delivers casts to this agent's procs and relays them down its cast tree."""

    def __init__(self, loop: Any, token: bytes, agent_id: str, rundir: str,
                 gather: ReplyGather, tcp_address: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.loop = loop
        self.token = token
        self.agent_id = agent_id
        self.rundir = rundir
        self.gather = gather
        self.tcp_address = tcp_address  # where agents on other hosts answer ("" if none)
        self.address = gather.address  # where same-host agents (and local procs) answer
        #: child relay -> (when this agent started asking it, when it last answered)
        self.asked: dict[str, list] = {}
        #: child relay -> calls forwarded to it whose answers do not come back through this
        #: agent (call_one, stream: not gathered), until a pong after them says they got
        #: there: (when, caller, port, the subtree's procs), oldest first
        self.unsure: dict[str, collections.deque] = {}
        self.clock = clock
        self.spawned: dict[str, None] = {}  # proc ids asked of this agent (oldest first)

    def on_fanout(self, h: Header, body: Any, buffers: list) -> None:
        """Deliver the enclosed message to several local procs, and in a cast tree forward
        it to the child agents of `sub` first (runtime/transport/casttree.py); gathered,
        the replies of the whole subtree come back here and go up as one batch."""
        e = h.extra or {}
        raw = e["header"]
        inner = framing.decode_header(raw if isinstance(raw, bytes) else bytes(raw))
        procs = e.get("procs", [])
        sub = e.get("sub") or []
        if sub:
            why = casttree.valid_node(["", [], sub])
            if why is not None:
                log.warning("agent: a cast from %s dropped: its tree is malformed (%s)",
                            h.src, why)
                return
        gather = bool(e.get("gather") and inner.port and inner.reply)
        reduce = e.get("reduce") if gather else None
        if reduce is not None and type(reduce) is not bytes:
            log.warning("agent: a cast from %s dropped: its combine is not bytes", h.src)
            return
        if gather:
            inner = self.gather.start(inner, procs, sub, reduce)
        if sub:
            self._forward(inner, sub, gather, body, buffers, reduce)
        frames = framing.build(self.token, inner, body, buffers)
        for proc_id in procs:
            self.loop.send(f"ipc://{self.rundir}/{proc_id}", frames)

    def _forward(self, inner: Header, sub: list, gather: bool, body: Any,
                 buffers: list, reduce: Any = None) -> None:
        """A cast on to this agent's children in its tree: each gets its own subtree;
        gathered, they answer to this agent (over TCP where they are other hosts)."""
        by_reach: dict[bool, bytes] = {}
        unsure = not gather and bool(inner.port and inner.reply)  # answers go straight back
        for agent, procs, kids in sub:
            if agent in self.gather.lost:  # dead (the caller said so): nothing to relay
                continue
            if unsure:
                q = self.unsure.get(agent)
                if q is None:
                    q = self.unsure[agent] = collections.deque(maxlen=UNSURE_KEPT)
                q.append((self.clock(), inner.reply, inner.port,
                          casttree.procs_of([agent, procs, kids])))
            far = agent.startswith("tcp://")
            raw = by_reach.get(far)
            if raw is None:
                h = inner
                if gather and far and self.tcp_address:
                    h = framing.decode_header(framing.encode_header(inner))
                    h.reply = self.tcp_address
                raw = by_reach[far] = framing.encode_header(h)
            extra: FanoutExtra = {"header": raw, "procs": procs}
            if kids:
                extra["sub"] = kids
            if gather:
                extra["gather"] = True
                if reduce:
                    extra["reduce"] = reduce
            self.loop.send(agent, framing.build(
                self.token, Header(Kind.FANOUT, src=self.agent_id, extra=extra), body,
                buffers))

    def relay_spawn(self, h: Header) -> bool:
        """A SPAWN_PROCS down the hosts' cast tree: pass each child its part (`specs`) and
        the parts of its subtree; False (and nothing sent) when the tree is malformed."""
        e = h.extra
        sub, specs = e.get("sub"), e.get("specs")
        why = casttree.valid_node(["", [], sub]) if isinstance(sub, list) else "no tree"
        if why is None and not (isinstance(specs, dict) and all(
                isinstance(s, dict) and isinstance(s.get("procs"), list)
                for s in specs.values())):
            why = "its specs are not per agent"
        if why is not None:
            log.warning("agent: a spawn from %s dropped: its tree is malformed (%s)",
                        h.src, why)
            return False
        common = {k: v for k, v in e.items() if k not in ("sub", "specs", "procs", "owner")}
        for node in sub:
            if node[0] in self.gather.lost:
                continue
            extra = cast(SpawnExtra, {**common, **specs.get(node[0], {})})  # checked above
            if node[2]:
                extra["sub"] = node[2]
                extra["specs"] = {a: specs[a] for k in node[2] for a in casttree.agents_of(k)
                                  if a in specs}
            self.loop.send(node[0], framing.build(
                self.token, Header(Kind.SPAWN_PROCS, src=self.agent_id, extra=extra)))
        return True

    def on_relay(self, h: Header, body: Any, buffers: list) -> None:
        """A local proc's message to a peer on another host (`peers.relay_peer`): sent on,
        after any gathered replies of that proc this agent still holds (they were sent
        first). Its frames are passed as they came; the receiver checks them."""
        to = framing.extra_get(h, "to")
        if not isinstance(to, str) or not to.startswith("tcp://") or not buffers:
            log.warning("agent: a relay from %s to %r dropped: not a message for another "
                        "host", h.src, to)
            return
        if framing.peek_kind(buffers[0], len(self.token)) != Kind.HEARTBEAT:
            self.gather.flush_from(h.src)  # (a heartbeat needs no order: batches stay)
        self.loop.send(to, buffers)

    def first_spawn(self, proc_id: str) -> bool:
        """Whether `proc_id` is asked of this agent for the first time (a spawn sent again
        around a dead relay may come twice: it starts once)."""
        if proc_id in self.spawned:
            return False
        self.spawned[proc_id] = None
        while len(self.spawned) > SPAWNED_KEPT:
            del self.spawned[next(iter(self.spawned))]
        return True

    def on_relay_lost(self, h: Header, body: Any, buffers: list) -> None:
        """A relay below this agent died (its caller says so): stop waiting for its
        subtree's replies, and tell the caller they are gone."""
        procs, relays = framing.extra_get(h, "procs"), framing.extra_get(h, "relays")
        if isinstance(procs, list) and isinstance(relays, list) and \
                all(isinstance(p, str) for p in procs + relays):
            self.gather.relay_lost(relays, procs)
        else:
            log.warning("agent: a malformed RELAY_LOST from %s dropped", h.src)

    # -- child relays this agent waits on: reachable? ---------------------------------------
    def check_children(self, interval: float, timeout: float) -> None:
        """Ping the child relays that gathered replies have waited on for over `interval`
        (I/O thread, every heartbeat): one silent past `timeout` is unreachable from here
        (a partition between two hosts the caller both reaches), and its subtree's ranks
        are reported gone with that cause instead of waited for."""
        now = self.clock()
        waiting = self.gather.waiting_children(interval)
        for child, q in list(self.unsure.items()):
            if not q or child in self.gather.lost:
                del self.unsure[child]
            elif now - q[0][0] > interval:
                waiting.add(child)
        for child in list(self.asked):
            if child not in waiting:
                del self.asked[child]
        for child in waiting:
            since, heard = self.asked.setdefault(child, [now, now])
            if now - heard > timeout:
                del self.asked[child]
                why = (f"host agent {child} did not answer its relay {self.agent_id} for "
                       f"{now - heard:.1f} s (a network partition between the two hosts?); "
                       "the call may reach it when the link heals")
                self.gather.child_unreachable(child, why)
                self._unreached(child, why)
                continue
            reply = self.tcp_address if child.startswith("tcp://") and self.tcp_address \
                else self.address
            self.loop.send(child, framing.build(self.token, Header(
                Kind.HEARTBEAT, src=self.agent_id, reply=reply, extra={"ping": child,
                                                                      "at": now})))

    def _unreached(self, child: str, why: str) -> None:
        """The calls forwarded to `child` not known to have got there: their callers are
        told its subtree's procs are gone, with `why` (an empty REPLY_BATCH to each call's
        port), so those calls fail instead of waiting for the link."""
        by_call: dict[tuple, list] = {}
        for _t, caller, port, procs in self.unsure.pop(child, ()):
            by_call.setdefault((caller, port), []).extend(procs)
        for (caller, port), procs in by_call.items():
            h, body = framing.reply_batch(port, [], [])
            h.src = self.agent_id
            h.extra["gone"] = sorted(set(procs))
            h.extra["why"] = dict.fromkeys(h.extra["gone"], why)
            self.loop.send(caller, framing.build(self.token, h, body))

    def on_heartbeat(self, h: Header) -> bool:
        """A relay's ping (answered) or a child's answer to ours; False for any other
        heartbeat (the controller's: the agent's own business)."""
        e = h.extra
        if not isinstance(e, dict) or ("ping" not in e and "pong" not in e):
            return False
        if "ping" in e and h.reply:
            self.loop.send(h.reply, framing.build(self.token, Header(
                Kind.HEARTBEAT, src=self.agent_id, extra={"pong": e["ping"],
                                                          "at": e.get("at")})))
        elif isinstance(e.get("pong"), str):
            child = e["pong"]
            got = self.asked.get(child)
            if got is not None:  # reachable
                got[1] = self.clock()
            q, at = self.unsure.get(child), e.get("at")
            while q and isinstance(at, float) and q[0][0] <= at:
                q.popleft()  # sent before the ping this answers, on the same connection
        return True

