"""`%mesh chaos` in a plain IPython shell (in this process): random procs of the named mesh
are SIGKILLed at an interval while calls go on, one line per kill, every kill reported as a
failure; with --raise, random actors raise InjectedFault at their next call instead (each
raise announced as injected, no proc killed); a mesh the user did not name is refused."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from IPython.core.error import UsageError
from _kernel_helpers import ipython_with_extension
from IPython.utils.capture import capture_output

import runtime
from _util import wait_until

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def ip():
    with ipython_with_extension() as shell:
        yield shell


def test_chaos_kills_under_calls_and_every_kill_is_reported(ip, monkeypatch, tmp_path):
    failures: list = []
    monkeypatch.setattr(runtime, "unhandled_fault_hook", failures.append)
    ip.user_ns["h"] = runtime.this_host()
    ip.run_line_magic("mesh", "alloc cp --hosts h --per-host procs=4 --no-progress")
    ip.user_ns["d"] = str(tmp_path)  # Logged's files: pytest's tmp_path, not left in /tmp
    ip.run_cell("from _chaos import Logged")
    ip.run_line_magic("mesh", "spawn cp Logged --as w d")
    w = ip.user_ns["w"]
    w.initialized.get(timeout=30)
    answered, failed = 0, 0
    with capture_output() as cap:
        ip.run_line_magic("mesh", "chaos cp --kill-every 0.5s --for 3s")
        deadline = time.monotonic() + 20
        while "chaos ended" not in cap.stdout and time.monotonic() < deadline:
            for r in range(4):  # the notebook keeps working: calls to every rank
                try:
                    w.slice(procs=r).step.call_one(0, r).get(timeout=15)
                    answered += 1
                except runtime.SupervisionError:
                    failed += 1
    out = cap.stdout
    assert "killing a random proc of 'cp' every 0.5 s for 3 s" in out, out
    killed = [int(r) for r in re.findall(r"killed rank (\d+) \(host .*, pid \d+\) with SIGKILL",
                                         out)]
    assert len(killed) >= 2 and len(set(killed)) == len(killed), out
    assert re.search(r"chaos ended \((--for reached|no live proc left)\): "
                     rf"{len(killed)} proc\(s\) killed", out), out
    assert answered > 0 and failed > 0, (answered, failed)
    # every kill reported: at the root, and to a call on the killed rank
    wait_until(lambda: {r for f in failures if f.mesh == "w" for r in f.ranks} >= set(killed),
               timeout=15, what=f"failures of ranks {killed}: {[str(f) for f in failures]}")
    for f in failures:  # each kill reported as injected, in the user's words
        assert f.signal == 9, str(f)
        assert f.is_injected is True, str(f)
        assert "killed by %mesh chaos on 'cp', an injected failure" in f.cause, f.cause
        assert "injected on purpose" in f.report(), f.report()
    for r in killed:  # a call to a killed rank says so too, and the dashboard's model
        with pytest.raises(runtime.SupervisionError, match="SIGKILL") as e:
            w.slice(procs=r).step.call_one(0, -1).get(timeout=15)
        assert e.value.failure is not None and e.value.failure.is_injected, str(e.value)
        assert "killed by %mesh chaos" in str(e.value), str(e.value)
    (health,) = [m for m in runtime.get_runtime().health.snapshot() if m.name == "w"]
    for a in health.actors:
        if a.rank in killed:
            assert "killed by %mesh chaos" in (a.last_error or ""), a
    for r in set(range(4)) - set(killed):  # ranks it spared still answer
        assert w.slice(procs=r).step.call_one(0, r).get(timeout=15)[:2] == (0, r)
    ip.run_line_magic("mesh", "stop cp")


def test_chaos_refuses_what_the_user_did_not_name(ip):
    ip.user_ns["h"] = runtime.this_host()
    with pytest.raises(UsageError, match="no live proc mesh 'nosuch'"):
        ip.run_line_magic("mesh", "chaos nosuch --kill-every 1s")
    ip.user_ns["x"] = 3
    with pytest.raises(UsageError, match="not a ProcMesh or ActorMesh"):
        ip.run_line_magic("mesh", "chaos x --kill-every 1s")
    with pytest.raises(UsageError, match="--kill-every"):
        ip.run_line_magic("mesh", "chaos h")
    ip.run_line_magic("mesh", "alloc cq --hosts h --per-host procs=1 --no-progress")
    with capture_output() as cap:
        ip.run_line_magic("mesh", "chaos cq --kill-every 30s")
        with pytest.raises(UsageError, match="already running on 'cq'"):
            ip.run_line_magic("mesh", "chaos cq --kill-every 1s")
        ip.run_line_magic("mesh", "chaos cq --stop")
    assert "chaos ended (stopped): 0 proc(s) killed" in cap.stdout, cap.stdout
    ip.run_line_magic("mesh", "stop cq")


def test_chaos_raise_makes_actors_raise_and_kills_nothing(ip, monkeypatch, tmp_path):
    """`--raise`: random actors of the mesh raise InjectedFault at their next call, each
    raise announced as injected; the calls fail with an ActorError saying chaos did it,
    no proc dies, nothing is supervised, and every rank answers afterwards."""
    failures: list = []
    monkeypatch.setattr(runtime, "unhandled_fault_hook", failures.append)
    ip.user_ns["h"] = runtime.this_host()
    ip.run_line_magic("mesh", "alloc cr --hosts h --per-host procs=2 --no-progress")
    pids: list = []
    try:
        with pytest.raises(UsageError, match="no live actor on 'cr'"):
            ip.run_line_magic("mesh", "chaos cr --raise --every 1s")
        ip.user_ns["d"] = str(tmp_path)  # Logged's files: pytest's tmp_path, not /tmp
        ip.run_cell("from _chaos import Logged")
        ip.run_line_magic("mesh", "spawn cr Logged --as wr d")
        wr = ip.user_ns["wr"]
        wr.initialized.get(timeout=30)
        pids = [p.pid for p in ip.user_ns["cr"].procs]
        assert all(pids), pids
        errors: list = []

        def call(r: int) -> bool:
            try:
                assert wr.slice(procs=r).step.call_one(0, r).get(timeout=15)[:2] == (0, r)
                return True
            except runtime.ActorError as e:
                errors.append(e)
                return False

        with capture_output() as cap:
            ip.run_line_magic("mesh", "chaos cr --raise --every 0.3s --for 2s")
            deadline = time.monotonic() + 20
            while "chaos ended" not in cap.stdout and time.monotonic() < deadline:
                for r in range(2):  # the notebook keeps calling every rank
                    call(r)
        out = cap.stdout
        assert "making a random actor of the actor meshes on 'cr' raise InjectedFault at its " \
               "next call every 0.3 s for 2 s" in out, out
        raised = re.findall(r"injected a raise in rank (\d) of 'wr' \(Logged, host .*, pid "
                            r"\d+\) at [\d:]+: its next call raises InjectedFault, an injected "
                            r"failure", out)
        assert raised, out
        assert re.search(r"chaos ended \(--for reached\): "
                         rf"{len(raised)} raise\(s\) injected", out), out
        for r in range(2):  # a raise armed last still fires once; then each rank answers
            wait_until(lambda r=r: call(r), timeout=30, what=f"rank {r} answering again")
        assert 1 <= len(errors) <= len(raised), (errors, raised)
        for e in errors:  # each failed call says it was injected by chaos
            assert e.exception_type == "InjectedFault", str(e)
            assert "injected failure: %mesh chaos on 'cr' raised in actor Logged wr" in str(e)
            assert "the actor lives on" in str(e), str(e)
        # no proc was killed, no actor failed
        assert [p.pid for p in ip.user_ns["cr"].procs] == pids
        assert all(runtime.get_runtime().proc_state(p.proc_id) == "running"
                   for p in ip.user_ns["cr"].procs)
        assert failures == [], [str(f) for f in failures]
        with capture_output() as cap:  # naming the ActorMesh: only its actors
            ip.run_line_magic("mesh", "chaos wr --raise --every 30s")
            ip.run_line_magic("mesh", "chaos cr --stop")
        assert "making a random actor of 'wr' raise InjectedFault" in cap.stdout, cap.stdout
        assert "chaos ended (stopped): 0 raise(s) injected" in cap.stdout, cap.stdout
    finally:
        ip.run_line_magic("mesh", "chaos cr --stop")
        try:
            ip.run_line_magic("mesh", "stop cr")
        except Exception:  # noqa: BLE001 - it could not stop: end its procs by pid
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
