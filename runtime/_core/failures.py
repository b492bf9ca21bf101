"""Failures: a proc or actor that fails becomes a MeshFailure that fails the waits on it
and goes to the mesh's owner (a supervising actor, or the controller's fault hook).

Runs on the I/O thread.
"""

from __future__ import annotations

import collections
import logging
import signal
import time
import weakref
from typing import Any, Optional, Protocol

from ..config import config
from ..errors import MeshStoppedError, SupervisionError, actor_failed_message
from ..supervision import MeshFailure
from ..supervision.health import ActorState, HealthModel
from ..transport import casttree
from ..transport.framing import Header, Kind
from ..transport.loop import IOLoop
from ..transport.payloads import RelayLostExtra
from ..transport.serialization import loads
from .messenger import Messenger
from .ports import Ports
from .records import ActorMeshRecord
from .state import State

__all__ = ["FailuresHost", "Failures", "users_failure", "tail"]

def _point(m: ActorMeshRecord, rank: int) -> str:
    """The actor's point in its mesh in Monarch's form ("{'gpus': 1/2}"), or "" if unknown."""
    try:
        from ..shapes import Point, Shape

        return str(Point(rank, Shape(tuple(m.sizes), tuple(m.sizes.values()))))
    except Exception:  # noqa: BLE001 - a report detail only
        return ""


log = logging.getLogger("runtime")


class FailuresHost(Protocol):
    """What Failures uses of its process's Runtime: its parts (state, ports, messenger, I/O
    loop, health model), its role (where a failure nobody here handles goes), its owner's
    address, whether it is closing, and sending."""

    @property
    def closed(self) -> bool: ...

    @property
    def owner_address(self) -> str: ...

    @property
    def state(self) -> State: ...

    @property
    def ports(self) -> Ports: ...

    @property
    def messenger(self) -> Messenger: ...

    @property
    def loop(self) -> IOLoop: ...

    @property
    def health(self) -> HealthModel: ...

    @property
    def role(self) -> Any: ...

    def send(self, addr: str, header: Header, body: bytes = b"", buffers: tuple = ()) -> None: ...


class Failures:
    """Turns deaths and actor errors into MeshFailures and hands them to owners."""

    #: causes kept of dead procs this process does not own (told by PROC_DEAD)
    CAUSES_KEPT = 1024

    def __init__(self, rt: FailuresHost) -> None:
        self.rt = rt
        self.causes: collections.OrderedDict = collections.OrderedDict()

    def dead_message(self, proc_id: str) -> str:
        rec = self.rt.state.proc(proc_id)
        failure = rec.failure if rec is not None else self.causes.get(proc_id)
        if failure is not None:
            return f"actor failed: {failure}"
        if rec is not None and rec.state == "stopped":  # asked for: in the mesh's words
            return (f"proc mesh {rec.mesh!r} was stopped while the call was in flight "
                    f"(rank {rec.rank}, proc {proc_id}); the call did not finish")
        return f"proc {proc_id} is dead"

    # -- procs ------------------------------------------------------------------------------
    def proc_failed(self, proc_id: str, cause: str, code: Optional[int] = None,
                    sig: Optional[int] = None, kill: bool = False) -> None:
        rt = self.rt
        rec = rt.state.proc(proc_id)
        if rec is None or rec.state in ("failed", "stopped"):
            return
        rt.loop.drain_from(proc_id)  # what it sent before it died counts (docs/transport.md)
        if rec.state in ("failed", "stopped"):  # its stream said so meanwhile
            return
        if kill and time.monotonic() - max(rec.last_seen, rt.loop.last_heard(proc_id)) \
                <= config.heartbeat_timeout:
            return  # failed for silence, but its stream had more: alive after all
        rec.state = "failed"
        if rec.killed_by:  # killed on purpose (kill(), chaos): say so first
            cause = f"{rec.killed_by} ({cause})"
        injected = rec.kill_injected
        if kill and rec.agent is not None and rec.agent.alive:
            rt.send(rec.agent.address, Header(Kind.KILL_PROCS, extra={
                "procs": [proc_id], "signal": int(signal.SIGKILL)}))
        base = MeshFailure(mesh=rec.mesh, ranks=[rec.rank], cause=cause, host=rec.place,
                           pid=rec.pid, proc_id=proc_id, exit_code=code, signal=sig,
                           stderr_tail=tail(list(rec.stderr_tail), config.stderr_tail_lines),
                           is_injected=injected)
        rec.failure = base
        failures = []
        for m, rank in rt.state.meshes_on(proc_id):
            if m.stopped or rank in m.failed:
                continue
            f = MeshFailure(mesh=m.name, ranks=[rank], cause=cause, host=rec.place, pid=rec.pid,
                            proc_id=proc_id, exit_code=code, signal=sig,
                            stderr_tail=base.stderr_tail, point=_point(m, rank),
                            actor_name=m.actor_name(rank), is_injected=injected)
            m.failed[rank] = f
            if m.ready[rank] is None:
                m.ready[rank] = cause
                self.check_initialized(m)
            rt.health.update(m.health_name, rank, ActorState.FAILED,
                             detail=cause, last_error=cause)
            if m.owned:  # the supervisor hears of it before the waits on it fail
                failures.append((m, f))
                self.deliver(m, f)
            self.fail_ports_for_actor(m, rank, f)
            base.seen_by_waiter |= f.seen_by_waiter
        # a wait that raises for this death shows it: the fault hook need not report it too
        base.seen_by_waiter |= bool(rt.ports.waiting_on(proc_id))
        self.mark_dead(proc_id, base)
        self.tell_others(proc_id, base)
        if not failures and rec.agent is not None:
            self.deliver(None, base)
        self.retire(proc_id)
        if rec.exited is not None and not rec.exited.done():  # kill() waits on it
            rec.exited.set_result(None)

    def retire(self, proc_id: str) -> None:
        """Drop a dead proc (and actor meshes with no live proc left) from the live tables.
        A retired mesh's health entry goes when its record does: at once if it was
        stopped, else (a failed mesh, whose report the user may still read) when the last
        user object holding the record is gone."""
        rt = self.rt
        rec = rt.state.proc(proc_id)
        if rec is not None and rec.tcp_address:
            rt.messenger.forget_cluster_of(rec.tcp_address)
        rt.health.remove_proc(proc_id)
        for m in rt.state.retire_proc(proc_id):
            if m.stopped:
                rt.health.remove_mesh(m.health_name)
            elif m.health_name:
                weakref.finalize(m, _remove_health_later, rt, m.health_name)

    def tell_others(self, proc_id: str, failure: Optional[MeshFailure],
                    skip: str = "") -> None:
        """Tell whoever may wait on `proc_id` that it died, and why: the other procs this
        process owns, and its own owner (which tells its procs and its owner in turn), so
        that a call from anywhere fails at once in the words of the death (the exit code or
        signal), whoever owned the proc. `skip`: the process that told us."""
        rt = self.rt
        why = _why(failure) if failure is not None else None
        others = [(o.address, o.route) for o in rt.state.running_procs()
                  if o.proc_id != proc_id and o.proc_id != skip]
        if others:
            rt.messenger.cast(others, Header(Kind.PROC_DEAD, extra={
                "procs": [proc_id], "why": why}))
        if rt.owner_address:
            rt.send(rt.owner_address, Header(Kind.PROC_DEAD, extra={
                "procs": [proc_id], "why": why, "up": True}))

    def relay_died(self, address: str, label: str) -> None:
        """The host agent at `address` died (`label`: where, and why): casts go around it
        from now on, and the calls in flight down a cast tree through it fail the ranks of
        its subtree (runtime/transport/casttree.py): at once, or once the nearest live
        relay above it, told here, says they are gone (I/O thread)."""
        rt = self.rt
        rt.messenger.agent_down(address)
        rt.messenger.relay_down(address)  # spawns through it reach its subtree directly
        dead = rt.messenger.dead_agents
        tell: dict[str, set] = {}
        for _port, w in rt.ports.waiters():
            relay_died = getattr(w, "relay_died", None)
            if relay_died is None:
                continue
            got = relay_died(address, dead, label)
            if got is not None:
                tell.setdefault(got[0], set()).update(got[1])
        for up, procs in tell.items():  # the dead relay's live ancestor stops waiting for it
            lost: RelayLostExtra = {"relays": [address], "procs": sorted(procs)}
            rt.send(up, Header(Kind.RELAY_LOST, extra=lost))
        self._release_behind(address, label)

    def _release_behind(self, address: str, label: str) -> None:
        """Messages without an answer (broadcast, send) to ranks below a dead relay may be
        lost with it: they leave the call window (nothing will confirm them), said once
        per mesh in the log."""
        rt = self.rt
        fanout = config.cast_fanout
        for m in list(rt.state.actor_meshes.values()):
            base = m.agents() if m.routes else ()
            if len(base) <= fanout or not m.unconfirmed or address not in base:
                continue
            want: dict = {}
            for r, route in enumerate(m.routes):
                if route:
                    want.setdefault(route[0], []).append(r)
            tree = casttree.build(base, want, fanout,
                                  rt.messenger.dead_agents - {address})
            behind = [r for r in tree.below.get(address, ()) if m.unconfirmed.get(r)]
            for r in behind:
                m.confirmed(r, len(m.unconfirmed[r]))
            if behind:
                from ..supervision.fold import ranks_phrase

                log.warning("actor mesh %r: messages without an answer to %s went through "
                            "host %s, which died: they may not have arrived", m.name,
                            ranks_phrase(behind), label)

    def mark_dead(self, proc_id: str, failure: Optional[MeshFailure]) -> None:
        rt = self.rt
        rt.loop.drain_from(proc_id)  # what it sent before it died counts (docs/transport.md)
        rt.state.dead_procs.add(proc_id)
        msg = self.dead_message(proc_id)
        rec = rt.state.proc(proc_id)
        cls = MeshStoppedError if rec is not None and rec.state == "stopped" else \
            SupervisionError
        rt.ports.fail_waiting(proc_id, cls(
            msg + ("\n" + failure.report() if failure is not None else ""), failure))
        if rec is not None:  # its connections go: nothing dials a dead proc again
            for addr in (rec.address, rec.tcp_address):
                if addr:
                    rt.loop.forget_peer(addr)

    def on_proc_exit(self, h: Header, body: Any, buffers: list) -> None:
        e = h.extra or {}
        proc_id = e.get("proc", "")
        rec = self.rt.state.proc(proc_id)
        if rec is None:
            return
        for ln in e.get("stderr", []):
            if not rec.stderr_tail or rec.stderr_tail[-1] != ln:
                rec.stderr_tail.append(ln)
        code, sig = e.get("code"), e.get("signal")
        if rec.state == "stopped":  # counted stopped already (stopped_unreported)
            pass
        elif rec.stopping:
            rec.state = "stopped"
            self.mark_dead(proc_id, None)
            self.retire(proc_id)
        else:
            from .._base.process import describe_status

            self.proc_failed(proc_id, f"process {describe_status(code, sig)}", code=code,
                             sig=sig)
        if rec.exited is not None:
            rec.exited.set_result(None)

    def stopped_unreported(self, proc_id: str) -> None:
        """A proc whose end this runtime asked for (its host shut down, or its mesh stopped
        and no exit report came in time: its agent is gone, or the report was lost with the
        connection): it counts as stopped, as a report would have made it; a report that
        comes later changes nothing (I/O thread)."""
        rec = self.rt.state.proc(proc_id)
        if rec is None or rec.state in ("failed", "stopped"):
            return
        rec.state = "stopped"
        self.mark_dead(proc_id, None)
        self.retire(proc_id)
        if rec.exited is not None and not rec.exited.done():
            rec.exited.set_result(None)

    def on_proc_dead(self, h: Header, body: Any, buffers: list) -> None:
        """Procs another process owned are dead (from our owner; or from a proc we own,
        `up`: told on to our other procs and our owner)."""
        e = h.extra if isinstance(h.extra, dict) else {}
        rt = self.rt
        for p in e.get("procs", []):
            if not isinstance(p, str):
                continue
            rec = rt.state.proc(p)
            if rec is not None and rec.state in ("failed", "stopped"):
                continue
            failure = _failure(p, e.get("why"))
            if failure is not None and rec is None:
                self.causes[p] = failure
                self.causes.move_to_end(p)
                while len(self.causes) > self.CAUSES_KEPT:
                    self.causes.popitem(last=False)
            known = p in rt.state.dead_procs
            self.mark_dead(p, failure)
            if e.get("up") and not known:
                self.tell_others(p, failure, skip=h.src)

    # -- actors -------------------------------------------------------------------------------
    def check_initialized(self, m: ActorMeshRecord) -> None:
        if m.initialized is None or m.initialized.done():
            return
        if any(r is None for r in m.ready):
            return
        errors = [(i, r) for i, r in enumerate(m.ready) if r is not True]
        if errors:
            i, text = errors[0]
            m.initialized.set_exception(SupervisionError(
                f"actor mesh {m.name!r} rank {i} failed in __init__:\n{text}"))
        else:
            m.initialized.set_result(None)

    def on_actor_ready(self, h: Header, body: Any, buffers: list) -> None:
        m = self.rt.state.actor_meshes.get(h.actor)
        if m is None or h.rank < 0 or h.rank >= len(m.ready):
            return
        if m.ready[h.rank] is None:
            m.ready[h.rank] = True
        self.rt.health.update(m.health_name, h.rank, ActorState.IDLE)
        self.check_initialized(m)

    def on_actor_failed(self, h: Header, body: Any, buffers: list) -> None:
        rt = self.rt
        m = rt.state.actor_meshes.get(h.actor)
        e = h.extra or {}
        if m is None:
            return
        rank = h.rank
        rec = rt.state.proc(m.proc_ids[rank]) if 0 <= rank < len(m.proc_ids) else None
        caused_by = None
        if body is not None and len(memoryview(body)):
            try:
                caused_by = loads(body, buffers)
            except Exception:
                caused_by = None
        failure = MeshFailure(
            mesh=m.name, ranks=[rank], cause=e.get("cause", "actor failed"),
            host=rec.place if rec else "", pid=rec.pid if rec else 0,
            proc_id=rec.proc_id if rec else "", traceback=e.get("traceback", ""),
            caused_by=caused_by if isinstance(caused_by, MeshFailure) else None,
            point=_point(m, rank), actor_name=m.actor_name(rank), call=e.get("call") or "",
            is_injected=e.get("injected") is True,
        )
        if e.get("init"):
            m.init_failed.add(rank)
            m.ready[rank] = f"{failure.cause}\n{failure.traceback}"
            m.failed[rank] = failure
            rt.health.update(m.health_name, rank, ActorState.FAILED, detail=failure.cause,
                             last_error=failure.cause, last_traceback=failure.traceback)
            self.check_initialized(m)
            self.deliver(m, failure)  # a supervision event at once, as in Monarch
            return
        if rank in m.failed:
            return
        m.failed[rank] = failure
        rt.health.update(m.health_name, rank, ActorState.FAILED, detail=failure.cause,
                         last_error=failure.cause, last_traceback=failure.traceback)
        self.deliver(m, failure)  # the supervisor hears of it before the waits on it fail
        self.fail_ports_for_actor(m, rank, failure)

    def fail_ports_for_actor(self, m: ActorMeshRecord, rank: int, failure: MeshFailure) -> None:
        """Fail the waits on an actor that failed. Its answers sent before the failure came
        first, on the same connection: those calls are settled already."""
        proc = m.proc_ids[rank]
        ports = self.rt.ports
        msg = failure.report() + "\n" + actor_failed_message(m.cls_name, m.name, rank,
                                                              failure.cause, m.actor_name(rank))
        for pid in ports.waiting_on(proc):
            failure.seen_by_waiter = True
            ports.fail(pid, SupervisionError(msg, failure), proc=proc, actor=m.actor_id)

    def on_actor_stopped(self, h: Header, body: Any, buffers: list) -> None:
        m = self.rt.state.actor_meshes.get(h.actor)
        if m is not None and 0 <= h.rank < len(m.proc_ids):
            self.rt.health.update(m.health_name, h.rank, ActorState.STOPPED)

    def send_failed(self, addr: str, ports: list, error: str, gone: bool) -> None:
        """A message could not be sent to `addr` (I/O thread): the calls it carried fail,
        naming the peer and the error. When the peer went away and the call waits on a
        proc this process owns and believes alive, its exit report (which its agent sends
        once the proc is reaped, or the agent's own death) fails the call instead, with
        the cause (a signal, an exit code) rather than a broken pipe."""
        exc = SupervisionError(f"a message to {addr} could not be sent: {error}")
        state = self.rt.state
        for pid in ports:
            if gone and any(state.is_running(p) for p in self.rt.ports.procs_of(pid)):
                continue
            self.rt.ports.fail(pid, exc)

    # -- supervision ------------------------------------------------------------------------
    def deliver(self, m: Optional[ActorMeshRecord], failure: MeshFailure) -> None:
        """Hand a failure of something this process owns to its owner (I/O thread)."""
        if self.rt.closed:
            return  # shutting down: the agents and procs ending now are no failure
        if not users_failure(self.rt.state, failure):
            return
        owner_actor = m.owner_actor if m is not None else None
        self.rt.role.on_unhandled_failure(owner_actor, failure)


def users_failure(state: State, failure: MeshFailure) -> bool:
    """Make a failure of an internal mesh the user's (reported against the proc mesh it
    served, `MeshFailure.serve`); False when the user hears of it otherwise: its proc died
    and an actor mesh of the user's on that proc reports the death. On the I/O thread."""
    m = state.actor_mesh_of_failure(failure)
    if m is None or not m.internal:
        return True
    proc = state.proc(failure.proc_id) if failure.proc_id else None
    if proc is not None and proc.state == "failed" and any(
            u.owned and not u.internal and not u.stopped and failure.proc_id in u.proc_ids
            for u in state.actor_meshes.all_values()):
        return False
    failure.serve(m.serves, m.name)
    return True


def _remove_health_later(rt: FailuresHost, name: str) -> None:
    """A failed mesh's record is gone: remove its health entry on the I/O thread, unless a
    newer mesh took the name meanwhile."""
    def remove() -> None:
        if name not in rt.state.health_names():
            rt.health.remove_mesh(name)

    rt.loop.schedule(remove)  # a finalizer: maybe inside this thread's send (no flush)


def _why(f: MeshFailure) -> dict:
    """A proc's failure as PROC_DEAD carries it (msgpack types only)."""
    return {"mesh": f.mesh, "ranks": list(f.ranks), "cause": f.cause, "host": f.host,
            "pid": f.pid, "code": f.exit_code, "signal": f.signal,
            "stderr": list(f.stderr_tail), "injected": bool(f.is_injected)}


def _failure(proc_id: str, why: Any) -> Optional[MeshFailure]:
    """The MeshFailure a PROC_DEAD's `why` describes, or None (none, or malformed)."""
    if not isinstance(why, dict):
        return None
    try:
        return MeshFailure(mesh=str(why["mesh"]), ranks=[int(r) for r in why["ranks"]],
                           cause=str(why["cause"]), host=str(why.get("host") or ""),
                           pid=int(why.get("pid") or 0), proc_id=proc_id,
                           exit_code=why.get("code"), signal=why.get("signal"),
                           stderr_tail=[str(x) for x in why.get("stderr") or []],
                           is_injected=why.get("injected") is True)
    except (KeyError, TypeError, ValueError):
        return None


def tail(lines: list, n: int) -> list:
    """The last `n` lines, keeping an earlier 'Fatal Python error' line (segfaults)."""
    out = lines[-n:]
    for ln in lines[:-n] if len(lines) > n else []:
        if ln.startswith("Fatal Python error"):
            return [ln, "..."] + out
    return out
