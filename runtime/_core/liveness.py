"""Liveness: heartbeats out, heartbeats in, and declaring agents, procs and peers dead.

Runs on the I/O thread, on timers the runtime starts.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any, Callable, Optional, Protocol

from .._base.process import describe_status
from ..config import config
from ..errors import SupervisionError
from ..supervision.health import ActorState, ProcStats, waits_text
from ..transport.framing import Header, Kind
from .failures import FailuresHost
from .records import AgentRecord, ProcRecord

__all__ = [
    "FailureSink", "LivenessHost", "stale_busy", "note_reply", "Liveness", "split_status",
    "gateway_outage", "gateway_lost",
]

log = logging.getLogger("runtime")


_STATES = {s.value: s for s in ActorState}  # a dict lookup, not an Enum call per actor


class FailureSink(Protocol):
    """Where liveness reports a death it found (the runtime's `failures.Failures`)."""

    def proc_failed(self, proc_id: str, cause: str, code: Optional[int] = None,
                    sig: Optional[int] = None, kill: bool = False) -> None: ...

    def relay_died(self, address: str, label: str) -> None: ...


class LivenessHost(FailuresHost, Protocol):
    """What liveness uses of its process's Runtime: what Failures does (its parts, role,
    owner, sending), and who it is (proc id, host), where deaths go (`failures`) and how a
    peer reaches it back."""

    @property
    def proc_id(self) -> str: ...

    @property
    def host(self) -> str: ...

    @property
    def failures(self) -> FailureSink: ...

    def reply_address_for(self, target_addr: str) -> str: ...


def stale_busy(m: Any, rank: int, since: float) -> bool:
    """Whether a heartbeat's 'busy since `since`' is older news than a reply already here.

    A proc samples its actors on its I/O thread while replies leave on the actor's own
    socket, so a heartbeat sampled during a call can arrive after that call's reply. Such a
    report is ignored for a few heartbeat intervals (then any busy report counts again,
    in case a call from elsewhere began just before the reply arrived)."""
    replied = m.replied.get(rank)
    return replied is not None and since <= replied and \
        time.time() - replied < 4 * config.heartbeat_interval


def note_reply(rt: LivenessHost, m: Any, rank: int) -> None:
    """A call to `rank` of actor mesh `m` has answered (on the thread that received the
    reply; the health model has its own lock): stamp it, and show the actor idle again if
    a heartbeat showed it busy and no other call of ours is out."""
    m.replied[rank] = time.time()
    if m.shown_busy and rank in m.shown_busy and m.inflight[rank] == 0 and m.health_name:
        m.shown_busy.discard(rank)
        rt.health.update(m.health_name, rank, ActorState.IDLE, waits=None)


class Liveness:
    """Sends heartbeats, records them, and fails what stops answering: a peer silent for
    more than `heartbeat_timeout` seconds on `clock` (the clock of every `last_seen` stamp
    and of the loop's `last_heard`: time.monotonic; tests pass theirs)."""

    def __init__(self, rt: LivenessHost, clock: Callable[[], float] = time.monotonic) -> None:
        self.rt = rt
        self.clock = clock
        self._peer_last: dict[str, float] = {}  # peers we wait on but do not own
        self._next_ping = 0.0

    def start(self) -> None:
        """Start the timer (I/O thread): one wake-up per heartbeat interval, idle or not."""
        self.rt.loop.call_every(config.heartbeat_interval, self.tick)

    def tick(self) -> None:
        """Heartbeats out, then the checks of what stopped answering (I/O thread)."""
        self.send_heartbeats()
        self.check()

    def watch_exit(self, pid: int) -> None:
        """Check at once when this child (a local host agent) exits, not at the next tick
        (a pidfd the I/O thread polls; I/O thread)."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already, or no pidfd: the next tick finds it
            return
        loop = self.rt.loop

        def exited() -> None:
            loop.remove_reader(fd)
            os.close(fd)
            self.check()

        loop.add_reader(fd, exited)

    # -- out ----------------------------------------------------------------------------------
    def send_heartbeats(self) -> None:
        rt = self.rt
        for agent in rt.state.agents.values():
            if agent.alive or agent.lost:  # keep a lost host's agent from giving up on us
                rt.send(agent.address, Header(Kind.HEARTBEAT))
        if rt.owner_address:
            rt.send(rt.owner_address, Header(Kind.HEARTBEAT, extra=rt.role.heartbeat_extra()))

    # -- in -----------------------------------------------------------------------------------
    def on_heartbeat(self, h: Header, body: Any, buffers: list) -> None:
        rt = self.rt
        now = self.clock()
        e = h.extra
        if isinstance(e, dict) and ("ping" in e or "pong" in e):
            if "ping" in e and h.reply:  # a peer waiting on us checks we are reachable
                rt.send(h.reply, Header(Kind.HEARTBEAT, extra={"pong": e["ping"]}))
            else:  # the peer's answer, or its host agent's for it (its process runs)
                peer = e.get("pong")
                self._peer_last[peer if isinstance(peer, str) and peer in self._peer_last
                                else h.src] = now
            return
        agent = rt.state.agent_for(h.src)
        if agent is not None:
            agent.last_seen = now
            running = e.get("running") if isinstance(e, dict) else None
            if isinstance(running, list):
                self._vouched(agent, running, now)
            if agent.lost:  # the link came back: usable for new procs; old ones are failed
                agent.lost, agent.alive = False, True
                log.warning("host %s is reachable again", agent.host)
                stale = [p for p in agent.procs if p in rt.state.dead_procs] + list(agent.stale)
                agent.stale.clear()
                if stale:
                    rt.send(agent.address, Header(Kind.KILL_PROCS, extra={
                        "procs": stale, "signal": int(signal.SIGKILL)}))
            return
        rec = rt.state.proc(h.src)
        if rec is None or rec.state in ("failed", "stopped"):  # a late one: it is retired
            return
        rec.last_seen = now
        if rec.silent_running:
            rec.silent_running = False
            log.warning("proc %s (%s rank %d) is answering again", rec.proc_id, rec.mesh,
                        rec.rank)
        e = h.extra or {}
        if "rss" in e:
            rt.health.update_proc(ProcStats(rec.proc_id, rec.place, rec.pid, e.get("cpu", 0.0),
                                            e.get("rss", 0), e.get("gpu"), e.get("tensor_bytes")))
        for actor_id, st in (e.get("actors") or {}).items():
            m = rt.state.actor_meshes.get(actor_id)
            if m is None or m.stopped:
                continue
            state, endpoint, since, handled, errors = st[:5]
            rank = m.rank_of(rec.proc_id)
            if rank < 0 or rank in m.failed or m.ready[rank] is None:
                continue
            if state != "busy" and m.last_beat.get(rank) == st:
                continue  # nothing new (a busy one is checked again: stale_busy)
            m.last_beat[rank] = st
            queued, waits = 0, None
            if len(st) >= 7:  # what waits in its mailbox, and what it waits on (diagnose)
                m.diag[rank] = (state, endpoint, since, st[5], st[6])
                queued = st[5] if isinstance(st[5], int) else 0
                waits = waits_text(st[6]) if st[6] is not None else None
            if state == "busy":
                if stale_busy(m, rank, since):
                    continue
                m.shown_busy.add(rank)
            else:
                m.shown_busy.discard(rank)
            rt.health.update(m.health_name, rank, _STATES.get(state), endpoint=endpoint,
                             since=since, handled=handled, errors=errors, queued=queued,
                             waits=waits)

    # -- checks -------------------------------------------------------------------------------
    def check(self) -> None:
        """Fail what has been silent past `heartbeat_timeout` (I/O thread). Silence is judged
        on what has come: if anything looks silent, everything waiting in this process's
        connections is read first (the I/O thread may have been busy), and only a peer from
        which nothing at all came meanwhile (no message, no byte of one) is failed."""
        rt = self.rt
        now = self.clock()
        timeout = config.heartbeat_timeout
        if self._any_silent(now, timeout):
            rt.loop.read_pending()
        self._check_peers(now)
        cut_off: set = set()  # agents behind a gateway cut off within its lease
        for agent in list(rt.state.agents.values()):
            if not agent.alive:
                continue
            cause = ""
            if agent.popen is not None and agent.popen.poll() is not None:
                code, sig = split_status(agent.popen.returncode)
                cause = f"host agent {describe_status(code, sig)}"
            elif agent.remote and now - self._heard(agent.agent_id, agent.last_seen) > timeout:
                cause = f"host {agent.label} unreachable (no heartbeat for {timeout:g} s)"
                link = rt.messenger.gateway_of(agent.address)
                if link is not None and 2 * config.heartbeat_interval < link.silent_for(now) \
                        <= timeout:
                    # the whole gateway is going quiet: the other hosts' last heartbeats came
                    # up to an interval later than this one's, so its silence passes the
                    # timeout first; one partition is decided at a later tick, not this host
                    continue
                if link is not None and link.silent_for(now) > timeout:  # one partition
                    behind = [a for a in rt.state.agents.values()
                              if rt.messenger.gateway_of(a.address) is link]
                    cause = link.partition_cause(now, timeout, len(behind))
                    if link.silent_for(now) <= config.gateway_lease:
                        cut_off |= {a.agent_id for a in behind}
                        gateway_outage(rt, link, behind, cause)
                        continue
            if cause:
                agent.alive = False
                agent.lost = agent.remote and agent.popen is None and agent.hello
                for p in list(agent.procs):
                    rt.failures.proc_failed(p, cause)
                rt.failures.relay_died(agent.address, f"{agent.label} ({cause})")
                # requests to the agent itself (workspace sync) fail with it
                rt.ports.fail_waiting(agent.agent_id, SupervisionError(cause))
                if agent.popen is not None:  # a local agent that exited: gone for good
                    rt.state.drop_agent(agent)
                    rt.loop.forget_peer(agent.address)
        for rec in list(rt.state.procs.values()):
            if rec.state == "running" and now - self._heard(rec.proc_id, rec.last_seen) > timeout \
                    and not rec.stopping and not self._behind_silent_gateway(rec, now, cut_off):
                if rec.vouched is not None and now - rec.vouched <= timeout:  # GIL held
                    self._silent_running(rec, timeout)
                    continue
                rt.failures.proc_failed(
                    rec.proc_id, f"proc unresponsive (no heartbeat for {timeout:g} s)", kill=True)

    def _vouched(self, agent: AgentRecord, running: list, now: float) -> None:
        """A host agent's heartbeat named its procs whose process runs: each of them that
        this process owns on that agent is vouched for now (I/O thread)."""
        state = self.rt.state
        for proc_id in running:
            rec = state.proc(proc_id) if isinstance(proc_id, str) else None
            if rec is not None and rec.agent is agent:
                rec.vouched = now

    def _silent_running(self, rec: ProcRecord, timeout: float) -> None:
        """`rec` is silent past the timeout while its agent says its process runs: C code
        holds its GIL (a long import, an extension's loop). It is not failed: said once."""
        if rec.silent_running:
            return
        rec.silent_running = True
        log.warning("proc %s (%s rank %d on %s) has sent nothing for %g s but its process "
                    "runs: C code is holding its GIL? Its calls wait; runtime.proc_stacks "
                    "names the holder, kill() ends it", rec.proc_id, rec.mesh, rec.rank,
                    rec.place, timeout)
        # the dashboard shows it on its actors until its next heartbeat
        note = f"C code holding its GIL? (no heartbeat for {timeout:g} s; its process runs)"
        for m in self.rt.state.actor_meshes.all_values():
            rank = m.rank_of(rec.proc_id)
            if rank >= 0 and m.health_name and rank not in m.failed:
                m.last_beat.pop(rank, None)  # that heartbeat redraws the actor
                self.rt.health.update(m.health_name, rank, waits=note)

    def _heard(self, peer_id: str, last_seen: float) -> float:
        """When anything last came from a peer: a message (`last_seen`, stamped at dispatch)
        or bytes on its stream (a large message still arriving)."""
        return max(last_seen, self.rt.loop.last_heard(peer_id))

    def _any_silent(self, now: float, timeout: float) -> bool:
        """Whether an agent or proc looks silent past `timeout` (before reading what waits)."""
        state = self.rt.state
        return any(a.alive and a.remote and now - a.last_seen > timeout
                   for a in state.agents.values()) or \
            any(r.state == "running" and not r.stopping and now - r.last_seen > timeout
                for r in state.procs.values())

    def _behind_silent_gateway(self, rec: Any, now: float, cut_off: set) -> bool:
        """A proc's silence is its gateway's (decided per host, above), not its own."""
        if rec.agent is None:
            return False
        if rec.agent.agent_id in cut_off:
            return True
        link = self.rt.messenger.gateway_of(rec.agent.address)
        return link is not None and link.silent_for(now) > 2 * config.heartbeat_interval

    def _check_peers(self, now: float) -> None:
        """Ping procs we wait on but do not own (actor-to-actor calls); fail the waits on a
        peer that stops answering: a network partition, not a dead controller."""
        rt = self.rt
        state = rt.state
        targets = {}
        for m in state.actor_meshes.all_values():
            if m.owned:
                continue
            for r, pid in enumerate(m.proc_ids):
                if pid not in targets and pid not in state.procs:
                    targets[pid] = (m.target(r), m.hosts[r] if r < len(m.hosts) else "")
        if not targets:
            self._peer_last.clear()
            return
        waited = rt.ports.waited_procs()
        waiting = [p for p in waited if p in targets and p not in state.dead_procs]
        for p in list(self._peer_last):
            if p not in waiting:
                del self._peer_last[p]
        if not waiting:
            return
        timeout = config.heartbeat_timeout
        ping_now = now >= self._next_ping
        if ping_now:
            self._next_ping = now + config.heartbeat_interval
        for pid in waiting:
            last = self._peer_last.setdefault(pid, now)
            (addr, route), host = targets[pid]
            if now - last > timeout:
                del self._peer_last[pid]
                msg = (f"proc {pid} on host {host or '?'} is unreachable from {rt.host} "
                       f"({rt.proc_id}): no answer for {timeout:g} s (network partition?)")
                log.warning(msg)
                rt.ports.fail_waiting(pid, SupervisionError(msg))
                continue
            if ping_now:
                reply = rt.reply_address_for(addr or (route or ("",))[0])
                rt.messenger.send_to_proc(addr, route, Header(Kind.HEARTBEAT, reply=reply,
                                                              extra={"ping": pid}))
                if route:  # and its host agent, which answers while its process runs
                    rt.send(route[0], Header(Kind.HEARTBEAT, extra={"ping": pid, "runs": pid},
                                             reply=rt.reply_address_for(route[0])))


def split_status(rc: Optional[int]) -> tuple[Optional[int], Optional[int]]:
    """A Popen return code as (exit code, signal)."""
    if rc is None:
        return None, None
    if rc < 0:
        return None, -rc
    return rc, None


def gateway_outage(rt: Any, link: Any, agents: list, cause: str) -> None:
    """The gateway's connection is cut, within its lease: the hosts and procs behind it are
    kept (the agents keep the procs for the lease), the calls waiting on them fail now, and
    new calls fail at once until the connection returns (`link.outage`)."""
    if link.outage:
        return
    link.outage = (f"{cause}; the job keeps its procs for gateway_lease "
                   f"({config.gateway_lease:g} s): calls fail until the connection returns")
    exc = SupervisionError(link.outage)
    for agent in agents:
        for p in list(agent.procs):
            rt.ports.fail_waiting(p, exc)
        rt.ports.fail_waiting(agent.agent_id, exc)


def gateway_lost(rt: Any, link: Any, text: str) -> None:
    """A cut of the gateway's connection lost messages (more than `gateway_buffer_bytes`
    was sent meanwhile): any call waiting on a host behind it may have lost its message or
    its answer, so each fails now, naming the gateway (I/O thread)."""
    exc = SupervisionError(f"{text}: the calls waiting on the hosts behind it fail, since "
                           "their messages or answers may be among those lost")
    for agent in list(rt.state.agents.values()):
        if rt.messenger.gateway_of(agent.address) is link:
            for p in list(agent.procs):
                rt.ports.fail_waiting(p, exc)
            rt.ports.fail_waiting(agent.agent_id, exc)
