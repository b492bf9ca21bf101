"""The runtime across real hosts (network namespaces of the test cluster): attach, spawn,
calls, slicing by host, actor-to-actor, output forwarding, faults with detection times."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import runtime
from runtime.config import config

from .actors import Where
from .agents import HB_TIMEOUT, REPO
from .mhcluster import pid_alive
from _util import pipeline_until_death, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", autouse=True)
def short_heartbeats():
    old = config.heartbeat_timeout
    config.heartbeat_timeout = HB_TIMEOUT
    yield
    config.heartbeat_timeout = old


@pytest.fixture(scope="module")
def key_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("key")
    d.chmod(0o700)
    k = d / "cluster.key"
    subprocess.run([sys.executable, "-m", "runtime.transport.auth", "keygen", str(k)],
                   check=True, capture_output=True)
    return k


@pytest.fixture
def mesh3(cluster, agents, key_file):
    """HostMesh over the 3 namespaced hosts, with a {hosts: 3, procs: 2} Where mesh."""
    addrs = [agents.start(n) for n in cluster.nodes]
    hosts = runtime.attach_to_workers(addrs, key_file=str(key_file))
    procs = hosts.spawn_procs(per_host={"procs": 2}, name="mh")
    where = procs.spawn("where", Where)
    where.initialized.get(timeout=60)
    yield hosts, procs, where
    try:
        hosts.shutdown()
    except Exception:
        pass


def test_attach_spawn_call_slice(cluster, mesh3):
    hosts, procs, where = mesh3
    assert dict(hosts.sizes) == {"hosts": 3}
    assert sorted(hosts.hosts) == cluster.nodes
    assert dict(procs.sizes) == {"hosts": 3, "procs": 2}
    got = where.where.call().get(timeout=30)
    items = list(got.items())
    assert len(items) == 6
    for point, (name, rank) in items:  # each actor sees its own coordinates, on its host
        assert dict(point) == rank and name == hosts.hosts[rank["hosts"]]
    assert sorted(v[0] for _, v in items) == sorted(cluster.nodes * 2)
    # slicing by host reaches only that host's two procs
    for i, node in enumerate(hosts.hosts):
        sub = where.slice(hosts=i).where.call().get(timeout=30)
        assert [v[0] for _, v in sub.items()] == [node, node]
    assert sorted(procs.slice(hosts=1).procs[j].host for j in range(2)) == [hosts.hosts[1]] * 2


def test_actor_to_actor_across_hosts(cluster, mesh3):
    hosts, procs, where = mesh3
    first = where.slice(hosts=0, procs=0)
    # the actor on host 0 calls the actor at rank 5 (host 2, proc 1) directly
    assert first.ask.call_one(where, 5).get(timeout=30) == hosts.hosts[2]


def test_output_forwarded_with_host_names(cluster, mesh3):
    hosts, procs, where = mesh3
    seen = []
    rt = runtime.get_runtime()
    rt.set_output_sink(lambda label, stream, text: seen.append((label, stream, text)))
    try:
        where.shout.call("hello").get(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and sum("hello" in t for _, _, t in seen) < 6:
            time.sleep(0.05)
    finally:
        rt.set_output_sink(None)
    lines = [(label, t) for label, _, t in seen if "hello" in t]
    assert len(lines) == 6
    for label, text in lines:
        host = text.split("from ")[1].strip()
        assert host in cluster.nodes and f"@{host}" in label


def test_ports_across_hosts(cluster, mesh3):
    hosts, procs, where = mesh3
    port, recv = runtime.Channel.open()
    where.report.call(port).get(timeout=30)
    got = sorted(recv.recv().get(timeout=10)[0] for _ in range(6))
    assert got == sorted(cluster.nodes * 2)
    recv.close()


@pytest.mark.parametrize("size", [1 << 10, 1 << 20], ids=["1KiB", "1MiB"])
def test_every_answer_a_remote_proc_sent_counts_when_it_dies(cluster, mesh3, size,
                                                            monkeypatch):
    """A proc on another host SIGKILLed inside call 300 of 400, the controller's I/O thread
    busy for 0.5 s meanwhile: its 300 answers all count (it sent them through its agent,
    which reports its death after them on the same connection), the rest fail naming
    SIGKILL."""
    from .actors import DiesAt

    monkeypatch.setattr(runtime, "unhandled_fault_hook", lambda failure: None)
    hosts, procs, where = mesh3
    dies = procs.slice(hosts=2, procs=0).spawn(f"dies{size}", DiesAt)
    dies.step.call_one(-1, 1, 300).get(timeout=30)
    answered, errors = pipeline_until_death(dies, size, busy=0.5)
    assert answered == 300, f"{answered} of the 300 answers sent counted"
    assert len(errors) == 100 and all("SIGKILL" in e for e in errors), errors[:2]


def test_cast_sends_one_message_per_host(cluster, mesh3):
    hosts, procs, where = mesh3
    rt = runtime.get_runtime()
    where.add.call(1, 2).get(timeout=30)
    before = rt.stats["sent"]
    assert all(v == 3 for _, v in where.add.call(1, 2).get(timeout=30).items())
    # one per host agent, not one per actor (6); fewer down a cast tree (cast_fanout < 3:
    # MONARCH_CAST_FANOUT=2 runs these tests with the tree on)
    assert rt.stats["sent"] - before == min(3, config.cast_fanout)


def test_a_reduced_call_is_folded_on_the_hosts(cluster, mesh3):
    """Accumulator(associative=True) across the namespaced hosts: each host's agent folds
    its procs' answers (its combines run on that host), the controller only the partial
    values (one per agent it hears from: 3, or 2 down a tree of fan-out 2)."""
    import socket

    hosts, procs, where = mesh3

    def combine(a, b):
        import socket

        def acc(v):
            return v if isinstance(v, dict) else {"n": 1, "by": []}

        a, b = acc(a), acc(b)
        return {"n": a["n"] + b["n"], "by": a["by"] + b["by"] + [socket.gethostname()]}

    got = runtime.Accumulator(where.where, {"n": 0, "by": []}, combine,
                              associative=True).accumulate().get(timeout=30)
    assert got["n"] == 6 and len(got["by"]) == 6
    here = got["by"].count(socket.gethostname())
    assert 1 <= here <= min(3, config.cast_fanout)
    assert set(got["by"]) - {socket.gethostname()} <= set(cluster.nodes)
    assert len(set(got["by"]) - {socket.gethostname()}) >= 2  # folded on several hosts


def _wait_failure(call_future, budget: float):
    t0 = time.monotonic()
    with pytest.raises(runtime.SupervisionError) as e:
        call_future.get(timeout=budget)
    return time.monotonic() - t0, e.value


def test_link_down_fails_actors_on_that_host_only(cluster, mesh3, record_detection):
    hosts, procs, where = mesh3
    lost = hosts.hosts[2]
    deadline = time.monotonic() + 10
    while not all(p.pid for p in procs.slice(hosts=2).procs):  # pid known after the proc's hello
        assert time.monotonic() < deadline
        time.sleep(0.05)
    old_pids = [p.pid for p in procs.slice(hosts=2).procs]
    assert all(pid_alive(p) for p in old_pids), old_pids
    cluster.link(lost, False)
    t0 = time.monotonic()
    try:
        # a call to the cut-off host fails within the heartbeat timeout (plus slack)
        fut = where.slice(hosts=2).where.call()
        dt, err = _wait_failure(fut, HB_TIMEOUT * 2 + 3)  # else the wait's TimeoutError
        detect = time.monotonic() - t0
        record_detection(f"multihost: link down ({lost}), heartbeat timeout {HB_TIMEOUT:g} s", detect)
        assert lost in str(err)
        failure = getattr(err, "failure", None)
        assert failure is None or failure.host == lost
        # survivors keep working
        ok = where.slice(hosts=0).where.call().get(timeout=20)
        assert [v[0] for _, v in ok.items()] == [hosts.hosts[0]] * 2
    finally:
        cluster.link(lost, True)
    # after the link returns (the next heartbeat), new procs can be spawned on that host
    deadline = time.monotonic() + 30
    t_up = time.monotonic()
    while True:
        try:
            p2 = hosts.slice(hosts=2).spawn_procs(per_host={"procs": 1}, name="again")
            w2 = p2.spawn("where2", Where)
            w2.initialized.get(timeout=20)
            assert [v[0] for _, v in w2.where.call().get(timeout=20).items()] == [lost]
            break
        except (runtime.SupervisionError, runtime.MeshStoppedError):
            assert time.monotonic() < deadline, "the host never came back"
            time.sleep(0.2)
    record_detection(f"multihost: link back ({lost}) to new procs answering", time.monotonic() - t_up)
    # the procs that were declared failed while cut off do not linger on the host
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in old_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in old_pids)


def test_a_controller_holding_its_gil_keeps_its_remote_procs(cluster, mesh3):
    """C code holds the controller's GIL past twice the agents' heartbeat timeout: no
    heartbeat goes out, but zmq's own heartbeats on each agent's link to the controller are
    answered (its zmq thread needs no GIL), so the agents on the other hosts keep its procs
    (they ended them), and the same procs answer afterwards."""
    import ctypes

    hosts, procs, where = mesh3
    wait_until(lambda: all(p.pid for p in procs.procs), 10, what="every proc's pid known")
    before = [p.pid for p in procs.procs]
    ctypes.PyDLL(None).sleep(int(HB_TIMEOUT * 2 + 2))  # this process's GIL held 8 s
    got = where.where.call().get(timeout=30)
    assert [v[0] for _, v in got.items()] == [h for h in hosts.hosts for _ in range(2)]
    assert [p.pid for p in procs.procs] == before and all(pid_alive(p) for p in before)


def test_agent_killed_is_detected_and_named(cluster, mesh3, agents, record_detection):
    hosts, procs, where = mesh3
    victim = hosts.hosts[1]
    t0 = time.monotonic()
    agents.procs[victim].kill()
    # fails by twice the heartbeat timeout (plus slack), else the wait's TimeoutError
    dt, err = _wait_failure(where.slice(hosts=1).where.call(), HB_TIMEOUT * 2 + 3)
    detect = time.monotonic() - t0
    record_detection(f"multihost: agent killed ({victim}), heartbeat timeout {HB_TIMEOUT:g} s", detect)
    assert victim in str(err)
    ok = where.slice(hosts=2).where.call().get(timeout=20)
    assert [v[0] for _, v in ok.items()] == [hosts.hosts[2]] * 2


def test_partition_between_agents_is_reported_not_fatal(cluster, mesh3, record_detection):
    hosts, procs, where = mesh3
    a, b = hosts.hosts[0], hosts.hosts[1]
    src = where.slice(hosts=0, procs=0)
    assert src.ask.call_one(where, 2).get(timeout=20) == b  # rank 2 = host 1, proc 0
    cluster.partition(a, b)
    try:
        t0 = time.monotonic()
        with pytest.raises((runtime.ActorError, runtime.SupervisionError, TimeoutError)) as e:
            src.ask.call_one(where, 2, HB_TIMEOUT * 2).get(timeout=HB_TIMEOUT * 4 + 10)
        dt = time.monotonic() - t0
        record_detection(f"multihost: partition {a}<->{b} reported to the caller "
                         f"({type(e.value).__name__})", dt)
        # the caller's runtime pings the peer it waits on and names the partition
        # (not the call's own timeout, HB_TIMEOUT * 2: that error names no partition)
        assert "unreachable" in str(e.value) and "network partition" in str(e.value), e.value
        # nobody mistook the partition for a dead controller or a dead host
        late = where.where.call()
        if config.cast_fanout >= 3:  # the star: the controller reaches every host itself
            got = late.get(timeout=20)
            assert sorted(v[0] for _, v in got.items()) == sorted(cluster.nodes * 2)
        else:  # down a cast tree host 0 relays to host 1, across the partition: host 0's
            # agent pings host 1's, hears nothing, and the call fails naming host 1's ranks
            # and the partition instead of waiting for the link (docs/transport.md)
            with pytest.raises(runtime.SupervisionError, match="network partition") as e2:
                late.get(timeout=HB_TIMEOUT * 4 + 10)
            assert "ranks 2-3" in str(e2.value), e2.value
            # not gathered either (a stream: its answers go straight back, not through
            # the relay): host 0's agent says it could not pass the call on; the other
            # ranks answer
            answered, failed = [], []
            for f in where.where.stream():
                try:
                    answered.append(f.get(timeout=HB_TIMEOUT * 4 + 10)[0])
                except runtime.SupervisionError as e3:
                    failed.append(str(e3))
            assert sorted(answered) == sorted([a, a, hosts.hosts[2], hosts.hosts[2]])
            assert len(failed) == 2 and all("network partition" in f for f in failed), failed
    finally:
        cluster.heal(a)

    def asked() -> bool:
        """Whether rank 0 reaches rank 2 again: TCP resends what waited across the cut on
        its own back-off, which grows with what was queued during the cut (a relayed cast
        too, down a tree), so the first try may still miss the ping's 3 s."""
        try:
            return src.ask.call_one(where, 2).get(timeout=20) == b
        except runtime.ActorError as e:
            assert "unreachable" in str(e), e
            return False

    wait_until(asked, 60, "the healed link carries calls again", every=0.5)
    got = where.where.call().get(timeout=30)  # the tree relays across the healed link
    assert sorted(v[0] for _, v in got.items()) == sorted(cluster.nodes * 2)


@pytest.mark.timeout(150)
def test_slurm_job_end_to_end(cluster, monkeypatch, tmp_path):
    from runtime.job import SlurmJob

    monkeypatch.setenv("SLURM_CONF", str(cluster.dir / "slurm.conf"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("MONARCH_HEARTBEAT_TIMEOUT", str(HB_TIMEOUT))
    job = SlurmJob({"trainers": 3}, workdir=tmp_path / "jobs", chdir=REPO, progress=False,
                   timeout=60)
    before = cluster.ns_pids()
    try:
        hosts = job.state().trainers
        assert sorted(hosts.hosts) == cluster.nodes
        procs = hosts.spawn_procs(per_host={"procs": 2})
        where = procs.spawn("where", Where)
        got = where.where.call().get(timeout=60)
        assert sorted(v[0] for _, v in got.items()) == sorted(cluster.nodes * 2)
        for i, node in enumerate(hosts.hosts):
            assert [v[0] for _, v in where.slice(hosts=i).where.call().get(timeout=30).items()] \
                == [node] * 2
        assert sum(v for _, v in where.add.call(1, 1).get(timeout=30).items()) == 12
    finally:
        job.kill()
    deadline = time.monotonic() + 20
    while True:
        new = [p for n, ps in cluster.ns_pids().items() for p in ps if p not in before[n]]
        if not new or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not new, f"left on nodes after kill: {new}"


@pytest.mark.timeout(200)
def test_slurm_notebook_runs(cluster, monkeypatch):
    """notebooks/slurm.ipynb with the Monarch kernel: one magic allocates on SLURM, the
    cells train across the 3 namespaced hosts, %mesh stop ends the job."""
    import sys

    import nbformat
    from nbclient import NotebookClient

    sys.path.insert(0, str(REPO / "tests" / "kernel"))
    from _kernel_helpers import install_kernelspec

    install_kernelspec()
    monkeypatch.setenv("SLURM_CONF", str(cluster.dir / "slurm.conf"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("MONARCH_HEARTBEAT_TIMEOUT", str(HB_TIMEOUT))
    before = cluster.ns_pids()
    nb = nbformat.read(REPO / "notebooks" / "slurm.ipynb", as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="monarch",
                   resources={"metadata": {"path": str(REPO)}}).execute()
    outs = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                   for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "'hosts': 3, 'procs': 2" in outs
    for i, node in enumerate(cluster.nodes):
        assert f"{i} ['{node}']" in outs, outs
        assert f"@{node}] hello from {node}" in outs, outs
    m = re.search(r"loss ([\d.]+) -> ([\d.]+) over 6 actors on 3 hosts", outs)
    assert m and float(m.group(2)) < 0.01 * float(m.group(1)), outs
    assert "stopped 1 mesh: trainers" in outs
    deadline = time.monotonic() + 20  # %mesh stop also ended the SLURM job and its agents
    while True:
        new = [p for n, ps in cluster.ns_pids().items() for p in ps if p not in before[n]]
        if not new or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not new, f"left on nodes after %mesh stop: {new}"

def test_tensor_reduce_across_hosts(cluster, mesh3):
    """The tensor engine's collectives across hosts: refused unless allowed (torch's sockets
    are unauthenticated), then a TCPStore on the controller and gloo between the hosts."""
    from runtime.tensor import mesh_rank

    _, procs, _ = mesh3
    with procs.activate():
        with pytest.raises(RuntimeError, match="collectives_across_hosts=True"):
            mesh_rank().float().reduce("hosts")  # off by default: torch's sockets
    # the procs import torch and build gloo groups here: on a loaded 2-core machine (the
    # suite's other worker) a proc can miss the module's 3 s heartbeat timeout meanwhile,
    # which is no failure of what this test checks
    with runtime.configured(collectives_across_hosts=True, heartbeat_timeout=15), \
            procs.activate():
        r = mesh_rank().float()              # 2*host + proc
        by_host = r.reduce("hosts")          # 0+2+4 = 6 for proc 0, 1+3+5 = 9 for proc 1
        both = (r + 1).reduce(("hosts", "procs"), "max")
        moved = runtime.slice_mesh(r, hosts=0).to_mesh(procs.slice(hosts=2))
    assert [runtime.inspect(by_host, hosts=h, procs=p, timeout=60).item()
            for h in range(3) for p in range(2)] == [6.0, 9.0] * 3
    assert runtime.inspect(both, hosts=1, procs=0, timeout=60).item() == 6.0
    assert [runtime.inspect(moved, procs=p, timeout=60).item() for p in range(2)] == \
        [0.0, 1.0]
