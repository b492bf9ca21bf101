"""The cast tree (runtime/transport/casttree.py, docs/transport.md "The cast tree"): its
shape as pure logic, then casts, gathered replies, order and a dead relay on a real tree of
20 host agents (LocalJob) with a small fan-out, so the tree has relays."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import runtime
from runtime import Actor, endpoint
from runtime.config import configured
from runtime.transport import casttree
from _procs import stop_all_threads
from _util import wait_until

# -- the shape (pure) -------------------------------------------------------------------------


def _names(n: int) -> list[str]:
    return [f"a{i}" for i in range(n)]


def _paths(tree: casttree.Tree) -> dict[str, tuple]:
    """agent -> the agents a message to it passes, from the sender's child down."""
    out = {}
    for agent in tree.own:
        path, up = [agent], tree.parent[agent]
        while up:
            path.append(up)
            up = tree.parent[up]
        out[agent] = tuple(reversed(path))
    return out


def test_chunks_are_near_equal_and_cover_everything() -> None:
    assert casttree.chunks(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert casttree.chunks(3, 16) == [(0, 1), (1, 2), (2, 3)]
    assert casttree.chunks(0, 4) == []


@pytest.mark.parametrize("n,fanout", [(5, 16), (20, 4), (100, 3), (1024, 16), (4096, 16)])
def test_every_agent_once_and_no_node_has_more_children_than_the_fanout(n: int,
                                                                        fanout: int) -> None:
    base = _names(n)
    tree = casttree.build(base, {a: [a + "/p"] for a in base}, fanout)
    seen = [p for node in tree.roots for p in casttree.procs_of(node)]
    assert sorted(seen) == sorted(a + "/p" for a in base)
    assert len(tree.roots) <= fanout

    def check(node: list) -> None:
        assert len(node[2]) <= fanout
        for k in node[2]:
            check(k)

    for node in tree.roots:
        check(node)
    depth = 1
    while fanout ** depth < n:
        depth += 1
    assert tree.depth <= depth  # log_fanout(n) levels, rounded up
    assert n <= fanout or tree.depth >= 2


def test_a_slice_takes_the_same_path_to_each_agent_as_the_whole_mesh() -> None:
    base = _names(50)
    whole = _paths(casttree.build(base, {a: [a] for a in base}, 4))
    for picked in (["a49"], ["a7", "a30"], base[10:20], base[::7]):
        part = _paths(casttree.build(base, {a: [a] for a in picked}, 4))
        for a in picked:
            assert part[a] == whole[a]
        # relays with no target of their own are there only on the way to a target
        assert set(part) - set(picked) <= {x for a in picked for x in whole[a]}


def test_a_dead_relay_moves_only_its_own_subtree() -> None:
    base = _names(20)
    want = {a: [a] for a in base}
    before = casttree.build(base, want, 3)
    relay = next(a for a in before.below if before.parent[a])  # a relay below a relay
    under = set(before.below[relay])
    after = casttree.build(base, want, 3, dead={relay})
    assert relay not in after.own
    assert sorted(p for n in after.roots for p in casttree.procs_of(n)) == \
        sorted(set(base) - {relay})
    old, new = _paths(before), _paths(after)
    for a in base:
        if a == relay:
            continue
        if a in under:  # promoted: the same path without the dead relay
            assert new[a] == tuple(x for x in old[a] if x != relay)
        else:
            assert new[a] == old[a]
    assert after.nearest_live_ancestor(next(iter(under)), {relay}) == before.parent[relay]


def test_subtree_and_deep_procs() -> None:
    base = _names(20)
    tree = casttree.build(base, {a: [a + "/p"] for a in base}, 4)
    root = tree.roots[0][0]
    assert tree.subtree(root) == {a + "/p" for a in base[:5]}
    assert tree.deep_procs() == {a + "/p" for a in base} - {n[0] + "/p" for n in tree.roots}


@pytest.mark.parametrize("bad,why", [
    ([["a", ["p"]]], "not [agent, procs, children]"),
    ([["a", "p", []]], "wrong types"),
    ([["a", [1], []]], "not a string"),
    ("x", "wrong types"),
])
def test_a_malformed_tree_is_refused(bad: object, why: str) -> None:
    assert why in (casttree.valid_node(["", [], bad]) or "")
    assert casttree.valid_node(["", [], [["a", ["p"], [["b", [], []]]]]]) is None


def test_a_fanout_below_two_is_refused() -> None:
    with pytest.raises(ValueError, match="cast_fanout must be at least 2"):
        casttree.build(["a"], {"a": ["p"]}, 1)


# -- a real tree: 20 host agents (LocalJob, TCP with CurveZMQ on loopback) --------------------

class Node(Actor):
    """What the tree tests ask of each rank."""

    def __init__(self) -> None:
        self.seen: list = []

    @endpoint
    def rank(self) -> int:
        return runtime.current_rank().rank

    @endpoint
    def note(self, x: int) -> None:
        self.seen.append(x)

    @endpoint
    def notes(self) -> list:
        return list(self.seen)

    @endpoint
    def agent_pid(self) -> int:
        """The pid of this proc's host agent (proc <- zygote <- agent)."""
        import psutil

        return psutil.Process(os.getppid()).ppid()

    @endpoint
    def tagged(self) -> dict:
        """This rank, to fold: {"ranks": [rank], "where": []} (combines add their pid)."""
        return {"ranks": [runtime.current_rank().rank], "where": []}

    @endpoint
    def opaque(self) -> "Opaque":
        return Opaque(runtime.current_rank().rank)

    @endpoint
    def wait_for(self, path: str) -> int:
        """Answer once `path` exists (bounded: 60 s)."""
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.02)
        return runtime.current_rank().rank

    @endpoint
    def answer_then_die(self, dies: int, others_after: float) -> int:
        """Rank `dies` answers at once and is SIGKILLed 0.3 s later; the others answer after
        `others_after` seconds (so the answer of `dies` waits in its agents' batches)."""
        import threading

        me = runtime.current_rank().rank
        if me == dies:
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
        else:
            time.sleep(others_after)
        return me


def _readable_here(v: int, where: list) -> "Opaque":
    if threading.current_thread().name == "agent-folds":  # a host agent's fold worker
        raise RuntimeError("only the caller and the procs can read this value")
    return Opaque(v, where)


class Opaque:
    """A value host agents cannot unpickle (its reconstructor refuses their fold worker)."""

    def __init__(self, v: int, where: list = ()) -> None:
        self.v, self.where = v, list(where)  # where: the pids of the combines that made it

    def __reduce__(self) -> tuple:
        return (_readable_here, (self.v, self.where))


def _tagging_combine():
    """A combine defined in a function (so it pickles by value) that records where it ran."""
    def combine(a: dict, b: dict) -> dict:
        import os

        return {"ranks": a["ranks"] + b["ranks"], "where": a["where"] + b["where"] + [os.getpid()]}
    return combine


def _job(n: int):
    from runtime.job import LocalJob

    here = os.path.dirname(os.path.abspath(__file__))  # this module's actors, by reference
    path = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH", "")]))
    return LocalJob(n, progress=False, env={"PYTHONPATH": path})


def _mesh(job, name: str):
    procs = job.state().hosts.spawn_procs(per_host={"procs": 1}, name=name)
    m = procs.spawn(name, Node)
    m.initialized.get(timeout=120)
    return m


def _rank_slice(m, lo: int, hi: int):
    return m.slice(hosts=slice(lo, hi))


@pytest.fixture(scope="module")
def tree20():
    """20 agents, one proc each, with cast_fanout=4: the controller sends 4, each of those
    relays to 4 (three levels, the controller's included)."""
    with configured(cast_fanout=4):
        job = _job(20)
        try:
            yield _mesh(job, "tree")
        finally:
            job.kill()


@pytest.mark.timeout(240)
def test_a_cast_reaches_every_rank_once_through_at_most_fanout_messages(tree20) -> None:
    rt = runtime.get_runtime()
    stats = rt.loop.stats
    from runtime.transport.framing import Kind

    tree20.rank.call().get(timeout=60)  # warm: connections opened
    sent0, batches0, replies0 = (rt.messenger.cast_messages, stats.by_kind[Kind.REPLY_BATCH],
                                 stats.by_kind[Kind.REPLY])
    for _ in range(10):
        got = tree20.rank.call().get(timeout=60)
        assert sorted(got.values()) == list(range(20))
    assert rt.messenger.cast_messages - sent0 == 10 * 4
    assert stats.by_kind[Kind.REPLY_BATCH] - batches0 <= 10 * 4
    assert stats.by_kind[Kind.REPLY] - replies0 == 0  # every answer came in a batch
    for i in range(30):
        tree20.note.broadcast(i)
    notes = tree20.notes.call().get(timeout=60)
    assert all(list(n) == list(range(30)) for n in notes.values())


@pytest.mark.timeout(240)
def test_a_direct_call_after_casts_sees_them(tree20) -> None:
    """Order per sender: casts to the mesh and a call to one actor take the same path, so a
    call_one right after broadcasts sees every one of them, on every rank."""
    for r in range(20):
        one = _rank_slice(tree20, r, r + 1)
        before = len(one.notes.call_one().get(timeout=30))
        for i in range(20):
            tree20.note.broadcast(1000 + i)
        after = one.notes.call_one().get(timeout=30)
        assert after[before:] == [1000 + i for i in range(20)], r


@pytest.mark.timeout(240)
def test_an_associative_accumulator_folds_in_the_agents(tree20) -> None:
    """Accumulator(associative=True): the relays fold their subtree's answers, so the caller
    gets at most fan-out partial values and combines only those with the identity."""
    rt = runtime.get_runtime()
    stats = rt.loop.stats
    from runtime.transport.framing import Kind

    agents = set(tree20.agent_pid.call().get(timeout=60).values())
    acc = runtime.Accumulator(tree20.tagged, {"ranks": [], "where": []}, _tagging_combine(),
                              associative=True)
    batches0, replies0 = stats.by_kind[Kind.REPLY_BATCH], stats.by_kind[Kind.REPLY]
    got = acc.accumulate().get(timeout=60)
    assert sorted(got["ranks"]) == list(range(20))
    assert stats.by_kind[Kind.REPLY_BATCH] - batches0 <= 4
    assert stats.by_kind[Kind.REPLY] - replies0 == 0
    here = got["where"].count(os.getpid())
    assert 1 <= here <= 4  # the identity with each partial value
    assert len(got["where"]) == 20  # 20 values and the identity: 20 combines in all
    assert set(got["where"]) - {os.getpid()} <= agents  # the rest ran in the host agents


@pytest.mark.timeout(240)
def test_a_combine_that_raises_in_an_agent_fails_the_call(tree20) -> None:
    def combine(a: dict, b: dict) -> dict:
        if 7 in a["ranks"] + b["ranks"]:
            raise ValueError("no seven")
        return {"ranks": a["ranks"] + b["ranks"], "where": []}

    acc = runtime.Accumulator(tree20.tagged, {"ranks": [], "where": []}, combine,
                              associative=True)
    with pytest.raises(runtime.ActorError, match="(?s)combine raised in host agent.*no seven"):
        acc.accumulate().get(timeout=60)
    assert sorted(tree20.rank.call().get(timeout=60).values()) == list(range(20))  # usable


@pytest.mark.timeout(240)
def test_values_an_agent_cannot_read_are_folded_by_the_caller(tree20) -> None:
    acc = runtime.Accumulator(
        tree20.opaque, Opaque(1000),
        lambda a, b: Opaque(a.v + b.v, a.where + b.where + [os.getpid()]), associative=True)
    got = acc.accumulate().get(timeout=60)
    assert got.v == 1000 + sum(range(20))
    assert got.where == [os.getpid()] * 20  # every value came up as it was


@pytest.mark.timeout(240)
def test_agents_fold_without_a_tree_too() -> None:
    """Two agents, three procs each, no tree (fewer agents than the fan-out): each agent
    still folds its procs' answers into one partial value."""
    job = _job(2)
    try:
        pm = job.state().hosts.spawn_procs(per_host={"procs": 3}, name="star")
        m = pm.spawn("star", Node)
        m.initialized.get(timeout=120)
        agents = set(m.agent_pid.call().get(timeout=60).values())
        acc = runtime.Accumulator(m.tagged, {"ranks": [], "where": []}, _tagging_combine(),
                                  associative=True)
        got = acc.accumulate().get(timeout=60)
        assert sorted(got["ranks"]) == list(range(6))
        assert got["where"].count(os.getpid()) == 2  # one partial value per agent
        assert set(got["where"]) - {os.getpid()} <= agents and len(got["where"]) == 6
    finally:
        job.kill()


@pytest.mark.timeout(240)
def test_an_answer_sent_before_a_death_counts_through_the_tree(tree20) -> None:
    """Rank 13 (a proc below a relay) answers, then dies while its answer waits in the batches
    of its agents for the slow ranks: its death reaches the controller first, on another
    path, yet the call returns every answer."""
    got = tree20.answer_then_die.call(13, 2.0).get(timeout=60)
    assert sorted(got.values()) == list(range(20))


@pytest.mark.timeout(240)
def test_an_answer_folded_before_a_death_counts(tree20) -> None:
    """The same with the answers folded on the way up: rank 6 (a leaf below relay 5) answers
    and dies while its answer waits, folded, in relay 5's partial value (rank 13 died in
    the test above: the call goes to ranks 0-12)."""
    import operator

    acc = runtime.Accumulator(_rank_slice(tree20, 0, 13).answer_then_die, 0, operator.add,
                              associative=True)
    assert acc.accumulate(6, 2.0).get(timeout=60) == sum(range(13))


@pytest.mark.timeout(240)
def test_a_relay_killed_mid_cast_fails_exactly_its_subtree(tmp_path, capfd) -> None:
    """fan-out 3 over 20 agents: rank 1's agent relays to rank 2's, below rank 0's. It is
    SIGKILLed while a gathered call() and a stream() wait on every rank: the call fails
    naming ranks 1 and 2 (their answers would have come through it), the stream fails
    exactly ranks 1 and 2 and answers the other 18; the next casts go around it."""
    with configured(cast_fanout=3):
        job = _job(20)
        try:
            m = _mesh(job, "relays")
            # each agent announced its procs' log directory before its procs ran (all came
            # in before these answers): the controller prints one line for all 20
            m.rank.call().get(timeout=60)
            err = []
            wait_until(lambda: err.append(capfd.readouterr().err) or
                       "proc output files: " in "".join(err), 30, every=0.05)
            m.rank.call().get(timeout=60)
            said = ("".join(err) + capfd.readouterr().err).count("proc output files: ")
            assert said == 1, f"{said} lines for 20 agents writing side by side"
            base = [str(r) for r in range(20)]
            tree = casttree.build(base, {a: [a] for a in base}, 3)
            assert tree.parent["1"] == "0" and tree.below["1"] == ["2"]  # the shape tested
            pids = m.agent_pid.call().get(timeout=60)
            relay_pid = list(pids.values())[1]
            gate = str(tmp_path / "go")
            call = m.wait_for.call(gate)
            stream = list(m.wait_for.stream(gate))
            os.kill(relay_pid, signal.SIGKILL)
            with pytest.raises(runtime.SupervisionError) as err:
                call.get(timeout=60)
            assert "ranks 1-2" in str(err.value) or "ranks 1, 2" in str(err.value), err.value
            open(gate, "w").close()
            answered, failed = [], 0
            for f in stream:
                try:
                    answered.append(f.get(timeout=60))
                except runtime.SupervisionError:
                    failed += 1
            assert sorted(answered) == [0] + list(range(3, 20)) and failed == 2
            # around the dead relay: rank 2 is reached through rank 0's agent now
            rest = _rank_slice(m, 2, 20).rank.call().get(timeout=60)
            assert sorted(rest.values()) == list(range(18))  # ranks within the slice
            assert _rank_slice(m, 0, 1).rank.call_one().get(timeout=30) == 0
        finally:
            job.kill()


@pytest.mark.timeout(240)
def test_spawns_go_down_the_tree_and_around_a_relay_that_dies() -> None:
    """fan-out 2 over 10 agents: spawn_procs sends 2 messages, not 10, and every proc
    starts. Then rank 1's agent (the relay of rank 2's, below rank 0's) is stopped, procs
    are spawned, and it is killed before it relayed anything: rank 2's agent is sent its
    spawn directly, so every proc but the dead host's starts."""
    rt = runtime.get_runtime()
    base = [str(r) for r in range(10)]
    tree = casttree.build(base, {a: [a] for a in base}, 2)
    assert tree.parent["1"] == "0" and tree.below["1"] == ["2"]  # the shape tested
    with configured(cast_fanout=2):
        job = _job(10)
        try:
            hosts = job.state().hosts
            sent0 = rt.messenger.cast_messages
            pm = hosts.spawn_procs(per_host={"procs": 1}, name="spawned")
            assert rt.messenger.cast_messages - sent0 == 2
            m = pm.spawn("spawned", Node)
            m.initialized.get(timeout=120)
            assert sorted(m.rank.call().get(timeout=60).values()) == list(range(10))
            relay_pid = list(m.agent_pid.call().get(timeout=60).values())[1]
            stop_all_threads(relay_pid)
            try:
                pm2 = hosts.spawn_procs(per_host={"procs": 1}, name="around")
                time.sleep(0.5)  # the spawn reaches the stopped relay's socket, no further
                assert pm2.procs[2].pid == 0
            finally:
                os.kill(relay_pid, signal.SIGKILL)
            pm2.slice(hosts=slice(2, 10)).initialized.get(timeout=120)
            pm2.slice(hosts=slice(0, 1)).initialized.get(timeout=60)
            with pytest.raises(Exception):
                pm2.slice(hosts=slice(1, 2)).initialized.get(timeout=60)
            m2 = pm2.slice(hosts=slice(2, 10)).spawn("around", Node)
            assert sorted(m2.rank.call().get(timeout=60).values()) == list(range(8))
        finally:
            job.kill()


def test_a_relay_reports_an_unreachable_childs_subtree_gone_with_the_cause() -> None:
    """gather.py alone: a batch waiting on two child relays; one of them does not answer
    (the agent's pings: `check_children`), so its subtree's procs go up as gone, with why,
    while the batch goes on waiting for the other child."""
    from runtime.host.gather import ReplyGather
    from runtime.transport import framing
    from runtime.transport.framing import Header, Kind

    sent: list = []
    g = ReplyGather("ipc:///me", lambda addr, frames: sent.append((addr, frames)), b"t" * 32)
    call = Header(Kind.CALL, src="ctl", reply="tcp://ctl:1", port=7)
    sub = [["tcp://b:1", ["pb"], [["tcp://c:1", ["pc"], []]]], ["tcp://d:1", ["pd"], []]]
    g.start(call, ["pa"], sub)
    assert g.waiting_children(-1) == {"tcp://b:1", "tcp://d:1"}
    g.child_unreachable("tcp://b:1", "no answer (a partition?)")
    (addr, frames), = sent
    h, _, _ = framing.parse(frames, b"t" * 32)
    assert addr == "tcp://ctl:1" and h.kind == Kind.REPLY_BATCH and h.port == 7
    assert sorted(h.extra["gone"]) == ["pb", "pc"]
    assert h.extra["why"] == {"pb": "no answer (a partition?)", "pc": "no answer (a partition?)"}
    assert g.waiting_children(-1) == {"tcp://d:1"}  # the other child is still waited on


class _Loop:
    """What CastRelay sends through: recorded."""

    def __init__(self) -> None:
        self.sent: list = []

    def send(self, addr: str, frames: list, port: int = 0) -> None:
        self.sent.append((addr, frames))


def test_a_relay_reports_a_call_it_could_not_pass_on_to_its_caller() -> None:
    """casts.py alone: a call_one-style cast (its answers go straight back, not through the
    relay) forwarded to two child relays; one answers the relay's pings, so its entry is
    dropped; the other stays silent past the timeout, so the caller gets an empty batch
    naming that child's subtree's procs gone, with why."""
    from runtime.host.casts import CastRelay
    from runtime.host.gather import ReplyGather
    from runtime.transport import framing
    from runtime.transport.framing import Header, Kind

    tok = b"t" * 32
    now = [100.0]
    loop = _Loop()
    relay = CastRelay(loop, tok, "agent-a", "/run", ReplyGather("ipc:///a", loop.send, tok),
                      "tcp://a:1", clock=lambda: now[0])
    call = Header(Kind.CALL, src="ctl", reply="tcp://ctl:1", port=7)
    sub = [["tcp://b:1", ["pb"], [["tcp://c:1", ["pc"], []]]], ["tcp://d:1", ["pd"], []]]
    relay.on_fanout(Header(Kind.FANOUT, src="ctl", extra={
        "header": framing.encode_header(call), "procs": ["pa"], "sub": sub}), b"x", [])
    assert [a for a, _ in loop.sent] == ["tcp://b:1", "tcp://d:1", "ipc:///run/pa"]
    loop.sent.clear()
    now[0] += 1.0
    relay.check_children(0.5, 3.0)  # both pinged
    pings = {a: framing.parse(f, tok)[0] for a, f in loop.sent}
    assert set(pings) == {"tcp://b:1", "tcp://d:1"}
    at = pings["tcp://d:1"].extra["at"]
    assert relay.on_heartbeat(Header(Kind.HEARTBEAT, src="tcp://d:1",
                                     extra={"pong": "tcp://d:1", "at": at}))
    loop.sent.clear()
    now[0] += 4.0  # b silent past the timeout; d answered after the cast: nothing to say
    relay.check_children(0.5, 3.0)
    (addr, frames), = loop.sent
    h, _, _ = framing.parse(frames, tok)
    assert addr == "tcp://ctl:1" and h.kind == Kind.REPLY_BATCH and h.port == 7
    assert h.extra["items"] == [] and h.extra["gone"] == ["pb", "pc"]
    assert "tcp://b:1 did not answer its relay agent-a" in h.extra["why"]["pb"]
    loop.sent.clear()
    now[0] += 1.0
    relay.check_children(0.5, 3.0)
    assert loop.sent == []  # told once; nothing left to wait on


def test_a_relay_splits_a_spawn_for_its_children_and_an_agent_spawns_a_proc_once() -> None:
    """casts.py alone: a SPAWN_PROCS down the hosts' tree gives each child its own spec
    and the specs of its subtree, nothing else; a malformed tree is dropped; a proc id asked
    twice (sent again around a dead relay) is spawned once."""
    from runtime.host.casts import CastRelay
    from runtime.host.gather import ReplyGather
    from runtime.transport import framing
    from runtime.transport.framing import Header, Kind

    tok = b"t" * 32
    loop = _Loop()
    relay = CastRelay(loop, tok, "agent-a", "/run", ReplyGather("ipc:///a", loop.send, tok),
                      "tcp://a:1")
    specs = {a: {"procs": [{"proc_id": f"p{a[-3]}"}], "owner": "tcp://ctl:1"}
             for a in ("tcp://b:1", "tcp://c:1", "tcp://d:1")}
    sub = [["tcp://b:1", ["pb"], [["tcp://c:1", ["pc"], []]]], ["tcp://d:1", ["pd"], []]]
    assert relay.relay_spawn(Header(Kind.SPAWN_PROCS, src="ctl", extra={
        "procs": [{"proc_id": "pa"}], "owner": "tcp://ctl:1", "cwd": "/w", "sub": sub,
        "specs": specs}))
    got = {a: framing.parse(f, tok)[0].extra for a, f in loop.sent}
    assert set(got) == {"tcp://b:1", "tcp://d:1"}
    assert got["tcp://b:1"]["procs"] == [{"proc_id": "pb"}] and got["tcp://b:1"]["cwd"] == "/w"
    assert got["tcp://b:1"]["sub"] == [["tcp://c:1", ["pc"], []]]
    assert set(got["tcp://b:1"]["specs"]) == {"tcp://c:1"}
    assert "sub" not in got["tcp://d:1"] and "specs" not in got["tcp://d:1"]
    loop.sent.clear()
    assert not relay.relay_spawn(Header(Kind.SPAWN_PROCS, src="ctl", extra={
        "sub": [["tcp://b:1", "not a list", []]], "specs": specs}))
    assert loop.sent == []
    assert relay.first_spawn("p1") and not relay.first_spawn("p1") and relay.first_spawn("p2")
