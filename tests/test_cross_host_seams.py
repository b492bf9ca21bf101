"""Across hosts, the same promises as on one host (docs/transport.md, "Across hosts"): host
agents reached over TCP with CurveZMQ (`LocalJob`, the code of SLURM and SSH agents), their
procs sending other hosts through their agent.

- a remote proc SIGKILLed while answering pipelined calls: every answer it sent counts,
  with the controller's I/O thread idle or busy meanwhile, and the rest fail naming SIGKILL;
- gathered replies (proc -> agent -> caller) and an actor's failure report after them
  arrive in the order the actor sent them;
- a proc owned by another proc dies: the controller's calls on it fail at once, in the
  words of the death (its owner tells its own owner), not after a ping's timeout as a
  "network partition".
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

import runtime
from runtime import Actor, SupervisionError, current_rank, endpoint, this_host
from runtime.config import configured
from runtime.job import LocalJob
from _util import pipeline_until_death

pytestmark = pytest.mark.timeout(180)


def _job(n: int) -> LocalJob:
    here = os.path.dirname(os.path.abspath(__file__))  # this module's actors, by reference
    path = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH", "")]))
    return LocalJob(n, progress=False, env={"PYTHONPATH": path})


@pytest.fixture(scope="module")
def hosts():
    job = _job(1)
    try:
        yield job.state().hosts
    finally:
        job.kill()


@pytest.fixture
def two_hosts():
    job = _job(2)
    try:
        yield job.state().hosts
    finally:
        job.kill()


class DiesAt(Actor):
    @endpoint
    def step(self, i: int, size: int, die_at: int) -> bytes:
        if i == die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return bytes(size)

@pytest.mark.parametrize("size", [1 << 10, 1 << 20], ids=["1KiB", "1MiB"])
@pytest.mark.parametrize("busy", [0.0, 0.5], ids=["idle", "busy"])
def test_every_answer_a_remote_proc_sent_counts_when_it_dies(hosts, failures, size, busy):
    """300 answers sent, then SIGKILL inside call 300 of 400: all 300 count, whatever the
    controller's I/O thread was doing (the agent relays the proc's answers and its death on
    one connection, in that order); the other 100 fail naming the signal."""
    pm = hosts.spawn_procs(per_host={"procs": 1}, name=f"dies{size}{int(busy * 10)}")
    try:
        m = pm.spawn("dies", DiesAt)
        m.step.call_one(-1, 1, 300).get(timeout=60)
        answered, errors = pipeline_until_death(m, size, busy)
        assert answered == 300, f"{answered} of the 300 answers sent counted"
        assert len(errors) == 100 and all("SIGKILL" in e for e in errors), errors[:2]
    finally:
        pm.stop().get(timeout=30)


class Work(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def nap(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    @endpoint
    def work(self) -> int:
        r = current_rank().rank
        if r == 1:
            time.sleep(1.0)
        return r

    @endpoint
    def boom(self) -> None:
        raise RuntimeError("failed after answering")


def test_gathered_answers_arrive_before_the_failure_that_followed_them(hosts, failures):
    """Rank 0 answers a gathered call (its agent holds the answer until rank 1 answers a
    second later), then fails: the failure report, relayed by the same agent, goes after the
    held answer, so the call returns both answers instead of failing."""
    pm = hosts.spawn_procs(per_host={"procs": 2}, name="gathered")
    try:
        with configured(gather_replies="on"):
            m = pm.spawn("work", Work)
            assert list(m.work.call().get(timeout=60).values()) == [0, 1]
            fut = m.work.call()
            time.sleep(0.2)  # rank 0 has answered; rank 1 sleeps
            m.slice(procs=0).boom.broadcast()
            assert list(fut.get(timeout=30).values()) == [0, 1]
            with pytest.raises(SupervisionError, match="failed after answering"):
                m.work.call().get(timeout=30)  # and the failure was not lost either
    finally:
        pm.stop().get(timeout=30)


class Holder(Actor):
    """Owns a proc mesh of its own (the controller's grandchild) and handles its failures."""

    def __init__(self) -> None:
        self.procs = this_host().spawn_procs(per_host={"procs": 1}, name="grandchild")
        self.mesh = self.procs.spawn("sleeper", Work)

    @endpoint
    def child(self) -> Any:
        return self.mesh

    def __supervise__(self, failure: Any) -> bool:
        return True  # handled here: the holder lives on


def test_a_grandchild_procs_death_fails_the_controllers_call_in_its_words(failures):
    """The controller calls an actor on a proc that one of its actors owns; the proc is
    SIGKILLed: the call fails well within the 5 s liveness ping (bound: 4 s), naming SIGKILL,
    and a new call fails at once the same way."""
    pm = this_host().spawn_procs(per_host={"procs": 1}, name="holder")
    try:
        holder = pm.spawn("holder", Holder)
        child = holder.child.call_one().get(timeout=60)
        pid = child.pid.call_one().get(timeout=30)
        fut = child.work.call_one()  # rank 0 of the grandchild mesh: answers at once
        fut.get(timeout=30)
        fut = child.nap.call_one(60)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(SupervisionError) as err:
            fut.get(timeout=4)
        text = str(err.value)
        assert "SIGKILL" in text and "partition" not in text, text
        with pytest.raises(SupervisionError, match="SIGKILL"):
            child.work.call_one().get(timeout=4)
        assert holder.child.call_one().get(timeout=30) is not None  # the holder lives
    finally:
        pm.stop().get(timeout=30)


class Asker(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def ask(self, other: Any, n: int) -> list:
        """Calls `other` (an actor in the controller) n times, pipelined."""
        futs = [other.work.call_one() for _ in range(n)]
        return [f.get(timeout=30) for f in futs]


def test_a_remote_proc_listens_on_no_tcp_port_and_is_reached_through_its_agent(hosts):
    """Other hosts reach a remote proc through its agent (one path, in order, and one place
    that knows whether it still runs); the proc holds no TCP listener of its own. An actor
    in the controller answers the proc's pipelined calls there."""
    import psutil

    pm = hosts.spawn_procs(per_host={"procs": 1}, name="routed")
    try:
        asker = pm.spawn("asker", Asker)
        here = runtime.this_proc().spawn("here", Work)
        assert asker.ask.call_one(here, 50).get(timeout=60) == [0] * 50
        pid = asker.pid.call_one().get(timeout=30)
        listening = [c for c in psutil.Process(pid).net_connections(kind="tcp")
                     if c.status == psutil.CONN_LISTEN]
        assert listening == []
    finally:
        pm.stop().get(timeout=30)


def test_chaos_across_hosts_loses_no_answer_and_hangs_no_call(two_hosts, failures,
                                                              tmp_path):
    """Two threads pipeline calls to random actors on 2 hosts x 2 procs while a random proc
    is SIGKILLed every second for 8 s (tests/_chaos.py): no answer wrong, no call hung,
    every answer a killed proc sent counted, every kill detected naming SIGKILL."""
    from _chaos import run

    out = run(two_hosts, str(tmp_path), seconds=8, every=1.0)
    assert out.kills and out.answered > 100, out
    assert not out.wrong and not out.hung and not out.other_errors, out
    assert not out.lost, f"{len(out.lost)} answers sent and not counted: {out.lost[:5]}"
    assert not out.undetected, out.undetected


_PULL_THAT_HOLDS_ITS_GIL = """
import ctypes, sys, time, zmq
s = zmq.Context().socket(zmq.PULL)
port = s.bind_to_random_port("tcp://127.0.0.1")
print(port, flush=True)
sys.stdin.readline()
print("holding", flush=True)
ctypes.PyDLL(None).sleep(3)  # its GIL held 3 s: no Python runs, zmq's own thread does
print("released", flush=True)
time.sleep(60)
"""


def test_a_watched_link_stays_up_while_the_peer_holds_its_gil_and_goes_down_when_it_stops():
    """`Peers.watch_link`'s connection (zmq's heartbeats, answered by the peer's zmq thread):
    up while the peer's GIL is held past the heartbeat timeout, down when the peer is
    stopped (SIGSTOP) or killed. What an agent asks of its controller's link."""
    import select
    import subprocess
    import sys

    import zmq

    from runtime.transport.peers import LinkWatch, push_socket
    from _procs import end_popen, stop_all_threads
    from _util import wait_until

    p = subprocess.Popen([sys.executable, "-c", _PULL_THAT_HOLDS_ITS_GIL], text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    ctx = zmq.Context()
    sock = link = None
    try:
        port = int(p.stdout.readline())
        sock = push_socket(ctx, f"tcp://127.0.0.1:{port}", None, link=(0.1, 0.5))
        link = LinkWatch(sock)
        wait_until(link.up, 10, what="the link up after its handshake")
        p.stdin.write("hold\n")
        p.stdin.flush()
        assert p.stdout.readline() == "holding\n"
        seen = []
        while not select.select([p.stdout], [], [], 0.05)[0]:  # 3 s: 6 heartbeat timeouts
            seen.append(link.up())
        assert p.stdout.readline() == "released\n"
        assert len(seen) > 20 and all(seen), seen
        stop_all_threads(p.pid)
        wait_until(lambda: not link.up(), 10, what="the link down once the peer is stopped")
        os.kill(p.pid, signal.SIGCONT)
        wait_until(link.up, 10, what="the link up again once the peer runs")
        p.kill()
        wait_until(lambda: not link.up(), 10, what="the link down once the peer is killed")
    finally:
        if link is not None:
            sock.disable_monitor()
            link.close()
        if sock is not None:
            sock.close(linger=0)
        ctx.term()
        end_popen(p)
