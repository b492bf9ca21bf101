"""Fault injection: each fault injected for real, with its outcome and detection time."""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
import zmq

import runtime
from runtime import ActorError, MessageTooLargeError, SupervisionError, this_host
from runtime.config import config
from runtime.transport import framing
from runtime.transport.framing import Header, Kind
from _actors import Cleaner, Echo, Parent
from _procs import end_popen, stop_all_threads
from _util import wait_until

pytestmark = pytest.mark.timeout(90)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def failures(monkeypatch):
    """Capture root-level unhandled failures instead of the default policy."""
    class Got(list):
        event: threading.Event

    got = Got()
    ev = threading.Event()

    def hook(f):
        got.append(f)
        ev.set()

    monkeypatch.setattr(runtime, "unhandled_fault_hook", hook)
    got.event = ev
    return got


@pytest.fixture
def mesh():
    pm = this_host().spawn_procs(per_host={"procs": 2}, name="faulty")
    am = pm.spawn("w", Echo)
    am.initialized.get(timeout=30)
    yield pm, am
    pm.stop().get(timeout=15)


def _busy_in(mesh: str, rank: int, endpoint: str, timeout: float = 20.0) -> None:
    """Wait until the health model shows actor `rank` of `mesh` running `endpoint`."""
    from runtime import ActorState

    deadline = time.monotonic() + timeout
    while True:
        m = runtime.get_runtime().health.mesh(mesh)
        a = {a.rank: a for a in m.actors}.get(rank) if m else None
        if a is not None and a.state == ActorState.BUSY and a.endpoint == endpoint:
            return
        assert time.monotonic() < deadline, f"{mesh}[{rank}] never ran {endpoint}()"
        time.sleep(0.02)


def _wait_error(fut, timeout=10.0):
    t0 = time.monotonic()
    with pytest.raises(SupervisionError) as ei:
        fut.get(timeout=timeout)
    return ei.value, time.monotonic() - t0


def test_sigkill_during_call(mesh, failures, record_detection, monkeypatch):
    # seen through the proc's exit (its agent's report), not a heartbeat: there is none to
    # miss within the wait (the detection time goes to the report, not into an assertion)
    monkeypatch.setattr(config, "heartbeat_timeout", 120.0)
    pm, am = mesh
    pid = pm.procs[1].pid
    fut = am.sleep.call(3)  # rank 0 answers the ping below once this is done
    _busy_in("w", 1, "sleep")
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    err, _ = _wait_error(fut, timeout=30)
    record_detection("SIGKILL of a proc during a call", time.monotonic() - t0)
    assert "killed by SIGKILL" in str(err) and err.failure.pid == pid
    assert failures.event.wait(5) and failures[0].mesh == "w" and failures[0].ranks == [1]
    # calls to the failed actor raise at once; the survivor keeps working
    with pytest.raises(SupervisionError):
        am.ping.call(1)
    assert am.slice(procs=0).ping.call_one(7).get(timeout=40) == 7
    # new procs can be spawned on the same host mesh afterwards
    pm2 = this_host().spawn_procs(per_host={"procs": 1})
    assert pm2.spawn("again", Echo).ping.call_one(3).get(timeout=30) == 3
    pm2.stop().get(timeout=10)


def test_os_exit_in_endpoint(mesh, failures, record_detection):
    pm, am = mesh
    t0 = time.monotonic()
    err, _ = _wait_error(am.slice(procs=0).exit_hard.call_one(3))
    record_detection("os._exit(3) inside an endpoint", time.monotonic() - t0)
    assert "exited with code 3" in str(err) and err.failure.exit_code == 3


def test_segfault_in_endpoint(mesh, failures, record_detection):
    pm, am = mesh
    t0 = time.monotonic()
    err, _ = _wait_error(am.slice(procs=1).segfault.call_one())
    record_detection("segfault (ctypes) inside an endpoint", time.monotonic() - t0)
    assert "SIGSEGV" in str(err)
    assert failures.event.wait(5)
    tail = "\n".join(failures[0].stderr_tail)
    assert "Segmentation fault" in tail, tail


def test_sigstop_is_declared_hung(mesh, failures, record_detection, monkeypatch):
    monkeypatch.setattr(config, "heartbeat_timeout", 2.0)
    pm, am = mesh
    pid = pm.procs[0].pid
    fut = am.slice(procs=0).sleep.call_one(30)
    _busy_in("w", 0, "sleep")
    t0 = time.monotonic()
    stop_all_threads(pid)
    try:
        err, _ = _wait_error(fut, timeout=15)  # not the 30 s call's end
        dt = time.monotonic() - t0
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    record_detection("SIGSTOP of a proc (heartbeat timeout 2 s)", dt)
    assert "unresponsive" in str(err)  # declared by the heartbeat timeout, nothing else
    # the hung proc is killed, not left behind
    assert not _wait_dead(_procs([pid]), 5.0)


def test_a_proc_holding_its_gil_is_waited_for_not_declared_dead(mesh, failures, monkeypatch,
                                                                  caplog):
    """C code holding a proc's GIL past the heartbeat timeout (a long import, an extension's
    loop) stops its heartbeats, but its host agent says its process runs: the call is waited
    for and answers, the silence is said once in the log, the proc is neither failed nor
    killed. (SIGSTOP, above, is declared hung: a stopped process does not run.)"""
    monkeypatch.setattr(config, "heartbeat_timeout", 2.0)
    pm, am = mesh
    pid = pm.procs[0].pid
    health = runtime.get_runtime().health

    def waits() -> object:  # what the dashboard and diagnose() show for rank 0
        return next(a.waits for m in health.snapshot() if m.name == "w"
                    for a in m.actors if a.rank == 0)

    with caplog.at_level(logging.WARNING, logger="runtime"):
        fut = am.slice(procs=0).hold_gil.call_one(5)
        wait_until(lambda: "C code holding its GIL?" in str(waits()), 20,
                   what=lambda: f"the silence on the dashboard: {waits()!r}")
        assert fut.get(timeout=30) == 5
        wait_until(lambda: "is answering again" in caplog.text, 10,
                   what=lambda: f"the proc heard again, in the log: {caplog.text!r}")
        wait_until(lambda: "GIL" not in str(waits()), 10,
                   what=lambda: f"the dashboard redrawn once heard: {waits()!r}")
    assert "has sent nothing for 2 s but its process runs" in caplog.text
    assert caplog.text.count("C code is holding its GIL") == 1
    assert am.slice(procs=0).whoami.call_one().get(timeout=10)["pid"] == pid
    assert not failures


def test_an_actor_waits_for_a_peer_holding_its_gil(failures):
    """An actor's call to a peer it does not own (pinged by the caller itself: silence reads
    as a partition) waits while C code holds the peer's GIL: the peer's host agent answers
    the pings for it while its process runs."""
    with runtime.configured(heartbeat_timeout=2.0):
        pm = this_host().spawn_procs(per_host={"procs": 2}, name="peers")
        try:
            am = pm.spawn("w", Echo)
            am.initialized.get(timeout=30)
            caller, peer = am.slice(procs=0), am.slice(procs=1)
            assert caller.call_hold_gil.call_one(peer, 5).get(timeout=60) == 5
            assert not failures
        finally:
            pm.stop().get(timeout=15)


def test_a_controller_holding_its_gil_keeps_its_procs(tmp_path):
    """The controller's heartbeats stop while C code holds its GIL; its host agent sees
    that it runs, on this host, and keeps its procs past twice the heartbeat timeout
    (it ended them, a notebook cell's long C call losing the mesh)."""
    script = _controller_script(tmp_path, "gil.py", """
        import ctypes
        pm = this_host().spawn_procs(per_host={"procs": 2})
        am = pm.spawn("e", Echo)
        before = [v["pid"] for v in am.whoami.call().get(timeout=60).values()]
        ctypes.PyDLL(None).sleep(4)  # this process's GIL held 4 s: 2 x 1.5 s timeout and more
        after = [v["pid"] for v in am.whoami.call().get(timeout=60).values()]
        print(before == after, flush=True)
        pm.stop().get(timeout=30)
    """)
    env = {**os.environ, "MONARCH_HEARTBEAT_TIMEOUT": "1.5"}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True"], r.stdout + r.stderr


def test_exception_under_broadcast_fails_actor(mesh, failures, record_detection):
    pm, am = mesh
    t0 = time.monotonic()
    am.slice(procs=1).boom.broadcast("no one listens")
    assert failures.event.wait(5)
    record_detection("exception under broadcast (reported to owner)", time.monotonic() - t0)
    f = failures[0]
    assert f.mesh == "w" and f.ranks == [1] and "no one listens" in f.cause
    assert "raise ValueError(msg)" in f.traceback
    with pytest.raises(SupervisionError):
        am.slice(procs=1).ping.call_one(1)
    assert am.slice(procs=0).ping.call_one(1).get(timeout=10) == 1


def test_unpicklable_return_does_not_fail_actor(mesh, failures):
    pm, am = mesh
    with pytest.raises(ActorError, match="cannot be pickled"):
        am.slice(procs=0).unpicklable.call_one().get(timeout=10)
    assert am.slice(procs=0).ping.call_one(1).get(timeout=10) == 1
    assert not failures


def test_message_over_the_limit(mesh, monkeypatch):
    pm, am = mesh
    import numpy as np

    monkeypatch.setattr(config, "max_message_bytes", 1 << 20)
    big = np.arange(1 << 20, dtype=np.float32)  # 4 MiB: over the limit
    with pytest.raises(MessageTooLargeError, match="over the message limit.*broadcast"):
        am.ping.broadcast(big)
    with pytest.raises(MessageTooLargeError, match="pickled part alone"):
        am.ping.call(b"x" * (2 << 20))
    # a call's arrays travel over the data plane instead (docs/runtime.md)
    got = am.ping.call(big).get(timeout=30)
    assert all(np.array_equal(v, big) for v in got.values())
    assert list(am.ping.call(1).get(timeout=10).values()) == [1, 1]


def test_sigkill_of_host_agent(failures, record_detection, monkeypatch):
    # seen through the agent's exit, not a heartbeat (none is missed within the wait)
    monkeypatch.setattr(config, "heartbeat_timeout", 120.0)
    host = this_host()
    pm = host.spawn_procs(per_host={"procs": 2})
    am = pm.spawn("onagent", Echo)
    pids = [p for p in am.whoami.call().get(timeout=30).values()]
    agent = host._agents[0]
    fut = am.sleep.call(30)
    t0 = time.monotonic()
    agent.popen.send_signal(signal.SIGKILL)
    err, _ = _wait_error(fut, timeout=30)
    record_detection("SIGKILL of the host agent", time.monotonic() - t0)
    assert "host agent" in str(err)
    assert not _wait_dead(_procs(p["pid"] for p in pids), 2.0)
    # a new host agent is started for the next spawn
    pm2 = this_host().spawn_procs(per_host={"procs": 1})
    assert pm2.spawn("after", Echo).ping.call_one(1).get(timeout=30) == 1
    pm2.stop().get(timeout=10)


def test_sigkill_of_controller_leaves_no_orphans(tmp_path, record_detection):
    script = _controller_script(tmp_path, "ctl.py", """
        pm = this_host().spawn_procs(per_host={"procs": 3})
        am = pm.spawn("e", Echo)
        print([v["pid"] for v in am.whoami.call().get(timeout=60).values()], flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        pids = eval(line)
        procs = [psutil.Process(x) for x in pids]
        everything = psutil.Process(p.pid).children(recursive=True)
        t0 = time.monotonic()
        p.kill()
        p.wait(5)
        alive = _wait_dead(everything, 10.0)
        record_detection("SIGKILL of the controller (all procs gone)", time.monotonic() - t0)
        assert not alive, alive
        assert len(procs) == 3
    finally:
        end_popen(p)


def test_unauthenticated_frames_are_dropped(mesh, tmp_path, failures):
    pm, am = mesh
    rt = runtime.get_runtime()
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = pickle.dumps(Evil())
    targets = [rt.address, pm.procs[0].address, host_agent_address()]
    ctx = zmq.Context()
    before = rt.stats["dropped"]
    call = framing.encode_header(Header(Kind.CALL, actor="w", method="ping", reply=rt.address,
                                        port=1))
    try:
        for addr in targets:
            # a zmq peer (its greeting is no stream of ours), random bytes, our framing
            # without the preamble, a preamble with a wrong token: each connection dropped
            s = ctx.socket(zmq.PUSH)
            s.connect(addr)
            s.send_multipart([b"x" * 16, call, evil])
            s.close(linger=1000)
            for data in (os.urandom(37),
                         b"".join(framing.stream_message([b"x" * 16 + call, evil])),
                         b"".join(framing.preamble(b"t" * len(rt.token), "intruder") +
                                  framing.stream_message([b"t" * 16 + call, evil]))):
                d = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                d.connect(addr[len("ipc://"):])
                d.sendall(data)
                d.close()
    finally:
        ctx.term()
    expected = before + 4  # the controller's own (procs and the agent count theirs)
    deadline = time.monotonic() + 5
    while rt.stats["dropped"] < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rt.stats["dropped"] >= expected
    assert list(am.ping.call(5).get(timeout=10).values()) == [5, 5]
    assert not marker.exists(), "a frame from an unknown peer was unpickled"
    assert not failures


def _controller_script(tmp_path, name: str, body: str):
    """A controller script that can import the runtime and the test actors."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})
        from runtime import this_host
        from _actors import Echo
    """) + textwrap.dedent(body))
    return path


def _procs(pids) -> list:
    """psutil handles of those of `pids` that still exist (one may exit at any moment)."""
    out = []
    for pid in pids:
        try:
            out.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    return out


def _wait_dead(procs, timeout):
    """Poll until every process is gone or a zombie; returns those still running."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for p in procs:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.005)


def host_agent_address():
    return this_host()._agents[0].address


def test_burst_of_10000_messages_in_order(mesh):
    pm, am = mesh
    one = am.slice(procs=0)
    n = 10_000
    for i in range(n):
        one.record.broadcast(i)
    seen = one.seen_list.call_one().get(timeout=60)
    assert len(seen) == n and seen == list(range(n))


def test_supervise_respawns_child(failures, record_detection):
    pm = this_host().spawn_procs(per_host={"procs": 1})
    parent = pm.spawn("parent", Parent, True)
    child_pid = parent.child_pid.call_one().get(timeout=30)
    t0 = time.monotonic()
    os.kill(child_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while True:
        seen = parent.failures_seen.call_one().get(timeout=10)
        if seen or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    record_detection("child proc SIGKILL seen by __supervise__", time.monotonic() - t0)
    assert seen and "child" in seen[0]
    assert parent.child_ping.call_one("alive").get(timeout=30) == "alive"
    assert parent.child_pid.call_one().get(timeout=30) != child_pid
    assert not failures, "a handled failure must not reach the root"
    pm.stop().get(timeout=15)


def test_unhandled_child_failure_propagates_to_root(failures):
    pm = this_host().spawn_procs(per_host={"procs": 1})
    parent = pm.spawn("parent", Parent, False)
    child_pid = parent.child_pid.call_one().get(timeout=30)
    os.kill(child_pid, signal.SIGKILL)
    assert failures.event.wait(10)
    f = failures[0]
    assert f.mesh == "parent" and f.caused_by is not None and f.caused_by.mesh == "child"
    with pytest.raises(SupervisionError):
        parent.child_ping.call_one(1)
    pm.stop().get(timeout=15)


def test_stop_runs_cleanup_children_first(tmp_path):
    path = str(tmp_path / "cleanup.txt")
    pm = this_host().spawn_procs(per_host={"procs": 2})
    c = pm.spawn("cleaner", Cleaner, path)
    assert list(c.ping.call().get(timeout=30).values()) == [1, 1]
    pids = [p.pid for p in pm.procs]
    pm.stop().get(timeout=15)
    assert sorted(Path(path).read_text().split("\n")[:-1]) == ["cleanup 0", "cleanup 1"]
    assert not _wait_dead(_procs(pids), 0)


def test_script_fails_fast_with_a_report(tmp_path):
    script = _controller_script(tmp_path, "crash.py", """
        pm = this_host().spawn_procs(per_host={"procs": 2}, name="trainers")
        am = pm.spawn("workers", Echo)
        am.initialized.get(timeout=60)
        am.slice(procs=1).exit_hard.broadcast(7)
        time.sleep(30)
        print("not reached")
    """)
    env = dict(os.environ)
    env.pop("MONARCH_FAULT_POLICY", None)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode != 0
    assert "not reached" not in r.stdout
    assert "mesh 'workers' rank(s) [1] failed" in r.stderr
    assert "exited with code 7" in r.stderr and "pid" in r.stderr


def test_normal_exit_without_stop_leaves_no_procs(tmp_path):
    script = _controller_script(tmp_path, "leave.py", """
        pm = this_host().spawn_procs(per_host={"procs": 2})
        am = pm.spawn("e", Echo)
        print([v["pid"] for v in am.whoami.call().get(timeout=60).values()], flush=True)
    """)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    pids = eval(r.stdout.strip().splitlines()[-1])
    alive = _wait_dead(_procs(pids), 3.0)
    assert not alive
