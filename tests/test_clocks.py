"""Durations as contracts, on a clock the test drives (no sleeping): a kept proc's lease and
a kept job's agent's (runtime/host/lease.py), `heartbeat_timeout` (runtime/_core/liveness.py)
and `debug_timeout` (runtime/debugging/registry.py) end when their duration says, not
before. (A notebook's output grace, `OutputRouter.settle`, is tested the same way in
kernel/test_pure.py.)"""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from runtime.config import config
from _util import FakeClock


# -- leases ---------------------------------------------------------------------------------
class _Agent:
    """What `Leases` uses of a host agent."""

    def __init__(self, clock: FakeClock) -> None:
        self.owner, self.owner_id, self.owner_last_seen = "ipc://controller", "c1", clock()
        self.stopping = False
        self.procs: dict = {}
        self.killed: list = []
        self.ended: list = []
        self.args = SimpleNamespace(address_file=None, job_dir=None)

    def kill_procs(self, why: str, kept_too: bool = False) -> None:
        self.killed.append(why)

    def shutdown(self, why: str) -> None:
        self.ended.append(why)
        self.stopping = True


@pytest.fixture
def signals(monkeypatch):
    """The signals `Leases` sends (os.kill recorded, nothing killed)."""
    from runtime.host import lease

    sent: list = []
    monkeypatch.setattr(lease.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    return sent


def test_a_kept_procs_lease_ends_exactly_after_its_keep_seconds(signals):
    from runtime.host.lease import Leases

    clock = FakeClock()
    agent = _Agent(clock)
    leases = Leases(agent, keep_default=0.0, clock=clock)
    leases.spawned("p-kept", 4242, {"mesh": "m", "rank": 0, "keep": 30.0})
    leases.spawned("p-plain", 4343, {"mesh": "m", "rank": 1})
    agent.procs = {"p-kept": SimpleNamespace(pid=4242), "p-plain": SimpleNamespace(pid=4343)}
    clock.advance(5.0)  # the controller was last heard 5 s ago; its lease runs from then
    agent.owner_last_seen = clock() - 5.0
    leases.orphan("controller gone")
    assert agent.killed == ["controller gone"] and agent.owner == ""
    clock.advance(25.0)  # exactly 30 s since the controller was last heard
    leases.check()
    assert signals == [], "the lease ended before its 30 s"
    clock.advance(0.001)
    leases.check()
    assert signals == [(4242, signal.SIGKILL)]
    leases.check()  # once ending, not again
    assert signals == [(4242, signal.SIGKILL)] and agent.ended == []


def test_a_controller_that_reattaches_within_the_lease_keeps_the_procs(signals):
    from runtime.host.lease import Leases

    clock = FakeClock()
    agent = _Agent(clock)
    leases = Leases(agent, keep_default=0.0, clock=clock)
    leases.spawned("p", 4242, {"mesh": "m", "rank": 0, "keep": 10.0})
    agent.procs = {"p": SimpleNamespace(pid=4242, proc_id="p", owner="")}
    leases.orphan("controller gone")
    clock.advance(10.0)
    answer = leases.adopt("ipc://next", now=clock())
    assert [k["proc_id"] for k in answer["kept"]] == ["p"]
    assert answer["prev_silent_for"] == 10.0
    clock.advance(3600.0)
    leases.check()  # a controller is attached: no lease runs
    assert signals == []


def test_a_kept_jobs_agent_ends_itself_exactly_after_its_lease_with_no_proc_left(signals):
    from runtime.host.lease import Leases

    clock = FakeClock()
    agent = _Agent(clock)
    agent.owner = ""  # started for a kept job, no controller yet: its lease runs from now
    leases = Leases(agent, keep_default=60.0, clock=clock)
    clock.advance(60.0)
    leases.check()
    assert agent.ended == []
    agent.procs = {"p": SimpleNamespace(pid=4242)}  # a proc still there: the agent stays
    clock.advance(0.001)
    leases.check()
    assert agent.ended == []
    agent.procs = {}
    leases.check()
    assert agent.ended == ["lease ended (60 s without a controller)"]


# -- heartbeat_timeout ----------------------------------------------------------------------
def _runtime_with(procs: dict, agents: dict) -> SimpleNamespace:
    """What `Liveness.check` and `on_heartbeat` use of a Runtime: its records, a loop that
    has heard nothing more, no gateway, and a failure sink that records."""
    failed: list = []
    state = SimpleNamespace(
        procs=procs, agents=agents, dead_procs=set(), agent_alias={},
        actor_meshes=SimpleNamespace(all_values=lambda: [], get=lambda k: None),
        proc=procs.get, agent_for=agents.get)
    return SimpleNamespace(
        state=state, failed=failed,
        loop=SimpleNamespace(read_pending=lambda: None, last_heard=lambda peer: 0.0),
        messenger=SimpleNamespace(gateway_of=lambda address: None),
        failures=SimpleNamespace(
            proc_failed=lambda p, cause, kill=False: failed.append((p, cause)),
            relay_died=lambda address, why: failed.append((address, why))),
        ports=SimpleNamespace(fail_waiting=lambda who, e: None, waited_procs=lambda: []))


def test_a_silent_proc_fails_exactly_after_heartbeat_timeout(monkeypatch):
    from runtime._core.liveness import Liveness
    from runtime._core.records import ProcRecord
    from runtime.transport.framing import Header, Kind

    monkeypatch.setattr(config, "heartbeat_timeout", 3.0)
    clock = FakeClock()
    rec = ProcRecord("p0", 0, "m", None, "ipc://p0", state="running", last_seen=clock())
    rt = _runtime_with({"p0": rec}, {})
    live = Liveness(rt, clock=clock)
    clock.advance(2.0)
    live.on_heartbeat(Header(Kind.HEARTBEAT, src="p0"), None, [])  # heard at +2 s
    assert rec.last_seen == clock()
    clock.advance(3.0)  # exactly heartbeat_timeout since: still alive
    live.check()
    assert rt.failed == [] and rec.state == "running"
    clock.advance(0.001)
    live.check()
    assert rt.failed == [("p0", "proc unresponsive (no heartbeat for 3 s)")]


def test_a_silent_proc_its_agent_says_runs_is_failed_once_the_agent_stops_saying_so(
        monkeypatch):
    """Silence while the proc's host agent says its process runs (its GIL held by C code)
    is waited out; the proc fails `heartbeat_timeout` after the agent last said so (it was
    stopped, or it is gone). An agent vouches only for its own procs."""
    from runtime._core.liveness import Liveness
    from runtime._core.records import AgentRecord, ProcRecord
    from runtime.transport.framing import Header, Kind

    monkeypatch.setattr(config, "heartbeat_timeout", 3.0)
    clock = FakeClock()
    agent = AgentRecord("a1", "ipc://a1", "h1", last_seen=clock())
    other = AgentRecord("a2", "ipc://a2", "h1", last_seen=clock())
    rec = ProcRecord("p0", 0, "m", agent, "ipc://p0", state="running", last_seen=clock())
    rt = _runtime_with({"p0": rec}, {"a1": agent, "a2": other})
    live = Liveness(rt, clock=clock)
    for _ in range(10):  # 10 s of silence from the proc, its agent saying it runs
        clock.advance(1.0)
        live.on_heartbeat(Header(Kind.HEARTBEAT, src="a1", extra={"running": ["p0"]}),
                          None, [])
        live.check()
    assert rt.failed == [] and rec.vouched == clock()
    live.on_heartbeat(Header(Kind.HEARTBEAT, src="a2", extra={"running": ["p0"]}), None, [])
    live.on_heartbeat(Header(Kind.HEARTBEAT, src="a1", extra={"running": []}), None, [])
    clock.advance(3.0)  # exactly heartbeat_timeout since the last word: still waited for
    live.check()
    assert rt.failed == []
    clock.advance(0.001)
    live.check()
    assert rt.failed == [("p0", "proc unresponsive (no heartbeat for 3 s)")]


def test_a_silent_remote_host_is_lost_exactly_after_heartbeat_timeout(monkeypatch):
    from runtime._core.liveness import Liveness
    from runtime._core.records import AgentRecord

    monkeypatch.setattr(config, "heartbeat_timeout", 3.0)
    clock = FakeClock()
    agent = AgentRecord("a1", "tcp://h1:1", "h1", remote=True, hello=True, last_seen=clock())
    agent.procs = {"p1"}
    rt = _runtime_with({}, {"a1": agent})
    live = Liveness(rt, clock=clock)
    clock.advance(3.0)
    live.check()
    assert agent.alive and rt.failed == []
    clock.advance(0.001)
    live.check()
    why = "host h1 unreachable (no heartbeat for 3 s)"
    assert not agent.alive and agent.lost
    assert rt.failed == [("p1", why), ("tcp://h1:1", f"h1 ({why})")]


# -- debug_timeout --------------------------------------------------------------------------
def test_an_unattended_breakpoint_meets_the_policy_exactly_at_debug_timeout(monkeypatch):
    """A note after NOTE_AFTER seconds, the policy ('fail': the call fails) once the session
    has waited `debug_timeout` seconds unattended: at it, not before."""
    from runtime.debugging.protocol import header
    from runtime.debugging.registry import NOTE_AFTER, DebugRegistry

    monkeypatch.setattr(config, "debug_timeout", 5.0)
    monkeypatch.setattr(config, "debug_policy", "fail")
    clock = FakeClock()
    sent: list = []
    rt = SimpleNamespace(
        loop=SimpleNamespace(call_soon=lambda fn, *a: None, call_later=lambda d, fn, *a: None),
        send=lambda addr, h: sent.append(h.extra["op"]), actor_meshes={}, dead_procs=set())
    reg = DebugRegistry(rt, clock=clock)
    notes: list = []
    reg.notify = notes.append
    reg.on_message(header("read", sid="s1", addr="ipc://p", kind="breakpoint", mesh="m",
                          rank=0, file="train.py", line=3, function="work"), None, [])
    assert sent == ["ack"] and [s.sid for s in reg.paused()] == ["s1"]
    clock.advance(NOTE_AFTER - 0.5)
    reg.tick()
    assert notes == []
    clock.advance(0.5)  # NOTE_AFTER: the note
    reg.tick()
    assert len(notes) == 1 and "paused at train.py:3" in notes[0], notes
    clock.advance(5.0 - NOTE_AFTER - 0.25)
    reg.tick()
    assert sent == ["ack"] and len(notes) == 1
    clock.advance(0.25)  # debug_timeout
    reg.tick()
    assert sent == ["ack", "abort"] and reg.paused() == []
    assert "unattended for 5 s" in notes[-1] and "failing the call" in notes[-1]
