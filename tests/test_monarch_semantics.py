"""Monarch's semantics through the public API: __init__ failures are supervision events at
once, a BaseException fails the actor, graceful proc stop, a clean controller exit while
procs start, and RDMA transfer sizes as in Monarch and batches (RDMAAction, submitted again)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import runtime
from runtime import SupervisionError, this_host, this_proc
from runtime.rdma import RDMAAction, RDMABuffer, RDMASizeError
from _monarch_actors import BadInit, ForeverInInit, Graceful, Parent, SlowInit, Where
from _procs import fault_hooks_done
from _util import wait_until

pytestmark = pytest.mark.timeout(90)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_init_failure_reaches_the_fault_hook_at_once(failures):
    pm = this_host().spawn_procs(per_host={"procs": 1}, name="badinit_root")
    try:
        pm.spawn("bad_at_once", BadInit)  # never used: the failure still arrives
        wait_until(lambda: any("init exploded at once" in f.cause for f in failures), 20.0,
                   what=lambda: failures, every=0.02)
        f = [f for f in failures if f.mesh == "bad_at_once"][0]
        assert "ValueError" in f.cause and "raise ValueError" in f.traceback
    finally:
        pm.stop().get(timeout=20)


def test_init_failure_reaches_the_owners_supervise(failures):
    pm = this_host().spawn_procs(per_host={"procs": 1}, name="badinit_owner")
    try:
        parent = pm.spawn("parent", Parent)
        parent.spawn_bad.call_one().get(timeout=20)
        wait_until(lambda: parent.seen.call_one().get(timeout=10) != [], 20.0, every=0.02)
        assert "init exploded at once" in parent.seen.call_one().get(timeout=10)[0]
        assert parent.seen.call_one().get(timeout=10) and not failures
    finally:
        pm.stop().get(timeout=20)


def test_stop_of_an_actor_whose_init_never_returns_ends_by_the_stop_timeout(failures):
    """Monarch's run-forever-on-init case: what `__init__` did before blocking (spawning
    and sending a mesh) works, and stop() completes after the stop timeout instead of
    hanging: the actor is declared stopped (no failure); its proc keeps serving others."""
    with runtime.configured(stop_timeout=1.0):
        pm = this_host().spawn_procs(per_host={"procs": 1}, name="forever_procs")
    try:
        port, recv = runtime.Channel.open()
        forever = pm.spawn("forever", ForeverInInit, pm, port)
        made = recv.recv().get(timeout=20)
        assert made.where.call_one().get(timeout=20)["tag"] == "from init"
        assert forever.stop().get(timeout=6) is None  # by the 1 s stop timeout, no hang
        with pytest.raises(SupervisionError, match="stopped"):
            forever.unreachable.call_one().get(timeout=20)
        other = pm.spawn("after_forever", Where)
        assert other.where.call_one().get(timeout=20)["pid"] == made.where.call_one().get(
            timeout=20)["pid"]
        assert not [f for f in failures if f.mesh == "forever"]
    finally:
        pm.stop().get(timeout=30)


def test_proc_stop_while_actors_are_still_in_init_reports_no_failure(failures, tmp_path):
    """A proc mesh stopped while its actors' `__init__` still runs (12 procs importing
    torch on a small machine, as in Monarch's test_mesh_len): the stop's interrupt ends
    them without a failure (which would end a script through the fault hook)."""
    with runtime.configured(stop_timeout=1.0):
        pm = this_host().spawn_procs(per_host={"procs": 2}, name="slow_init_procs")
    started = tmp_path / "started"
    slow = pm.spawn("slow_init", SlowInit, 30.0, str(started))
    wait_until(lambda: all(Path(f"{started}{r}").exists() for r in range(2)), 20.0,
               what="the actors are inside __init__", every=0.02)
    pm.stop().get(timeout=10)
    assert fault_hooks_done()  # a failure report, had there been one, reached `failures`
    assert not [f for f in failures if f.mesh == "slow_init"], [f.report() for f in failures]
    with pytest.raises(SupervisionError):
        slow.ping.call().get(timeout=10)


def test_system_exit_in_an_endpoint_fails_the_actor(failures):
    m = this_proc().spawn("exiter", Where)
    with pytest.raises(SupervisionError, match="Actor Where exiter .*exited because of the "
                                               "following reason: .*SystemExit"):
        m.exit.call_one().get(timeout=20)
    with pytest.raises(RuntimeError, match="Actor Where exiter .*exited because of the "
                                           "following reason"):
        m.where.call_one().get(timeout=20)
    wait_until(lambda: any(f.mesh == "exiter" for f in failures), 20.0, every=0.02)


def test_proc_stop_runs_finally_del_and_atexit(tmp_path):
    with runtime.configured(stop_timeout=4.0):  # restores the setting (unset) after
        _graceful_stop(tmp_path)


def _graceful_stop(tmp_path) -> None:
    path = str(tmp_path / "log")
    pm = this_host().spawn_procs(per_host={"procs": 1}, name="graceful")
    g = pm.spawn("graceful", Graceful, path)
    assert g.ping.call_one().get(timeout=20) == 1
    busy = g.busy.call_one()
    wait_until(lambda: os.path.exists(path + ".busy"), 20.0, what="inside busy() now",
               every=0.02)
    pm.stop().get(timeout=10)
    with open(path) as f:
        lines = f.read().split()
    # the atexit handler holds the instance, so __del__ may come after it; a module
    # global's object is collected last, as interpreter finalization would (Monarch)
    assert lines[0] == "finally" and sorted(lines[1:3]) == ["atexit", "del"], lines
    assert lines[3:] == ["module-global"], lines
    with pytest.raises(Exception):
        busy.get(timeout=5)


SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from runtime import this_host
    pm = this_host().spawn_procs(per_host={{"procs": 2}})
    print("spawned", flush=True)
    sys.exit({code})
""")


FAIL_FAST_SCRIPT = textwrap.dedent("""
    import atexit, sys, time
    sys.path.insert(0, {root!r})
    sys.path.insert(0, {tests!r})
    from runtime import this_proc
    from _monarch_actors import Where

    def note():
        with open({path!r}, "w") as f:
            f.write("atexit ran")

    atexit.register(note)
    m = this_proc().spawn("dies", Where)
    m.exit.broadcast()  # nobody handles the failure: the fault hook ends the script
    time.sleep(30)
    print("not reached", flush=True)
""")


def test_fail_fast_exit_runs_atexit_handlers(tmp_path):
    """An unhandled failure in a script exits 1 (fail fast) after running the script's
    `atexit` handlers, as Monarch's fault hook does."""
    path = str(tmp_path / "atexit")
    script = tmp_path / "fail_fast.py"
    script.write_text(FAIL_FAST_SCRIPT.format(root=ROOT, tests=os.path.join(ROOT, "tests"),
                                              path=path))
    env = {k: v for k, v in os.environ.items() if k != "MONARCH_FAULT_POLICY"}
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=60, cwd=str(tmp_path), env=env)
    assert p.returncode == 1 and "exiting (fail fast)" in p.stderr, p.stderr
    assert "not reached" not in p.stdout
    with open(path) as f:
        assert f.read() == "atexit ran"


@pytest.mark.parametrize("code", [0, 3])
def test_controller_exiting_while_procs_start_keeps_its_status(tmp_path, code):
    script = tmp_path / "early_exit.py"
    script.write_text(SCRIPT.format(root=ROOT, code=code))
    env = {k: v for k, v in os.environ.items() if k != "MONARCH_FAULT_POLICY"}
    for _ in range(3):
        p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           timeout=60, env=env, cwd=str(tmp_path))
        assert p.returncode == code, p.stderr
        assert "unhandled failure" not in p.stderr and "MeshFailure" not in p.stderr
        assert "Traceback" not in p.stderr, p.stderr


def test_len_of_a_mesh_is_its_number_of_elements():
    pm = this_host().spawn_procs(per_host={"procs": 3}, name="len_procs")
    try:
        actors = pm.spawn("len_actors", Where)
        assert len(actors) == 3 and len(pm) == 3 and len(this_host()) == 1
        assert len(actors.slice(procs=slice(1, 3))) == 2 and len(actors.slice(procs=0)) == 1
        assert len(actors.where.call().get(timeout=20)) == 3
    finally:
        pm.stop().get(timeout=20)


def test_rdma_sizes_follow_monarchs_rule():
    """A read fills the first remote-size bytes of a larger local buffer; a write gives a
    smaller local buffer whole, into the remote buffer's first bytes; a smaller read
    destination or a larger write source is refused (ValueError), as in Monarch."""
    remote = torch.arange(10, dtype=torch.float32)
    buf = RDMABuffer(remote)
    dst = torch.full((16,), -1.0)
    assert buf.read_into(dst).get(timeout=20) == 40
    assert dst[:10].tolist() == list(range(10)) and dst[10:].tolist() == [-1.0] * 6
    assert buf.write_from(torch.full((4,), 7.0)).get(timeout=20) == 16
    assert remote.tolist() == [7.0] * 4 + list(range(4, 10))
    with pytest.raises(RDMASizeError, match="36 bytes, fewer than"):
        buf.read_into(torch.empty(9))
    with pytest.raises(RDMASizeError, match="48 bytes, more than the remote buffer's 40"):
        buf.write_from(torch.full((12,), 7.0))
    with pytest.raises(ValueError, match="more than"):
        RDMAAction().write_remote(buf, torch.zeros(11))
    small = torch.full((3,), 5.0)
    RDMAAction().write_remote(buf, small).submit(timeout=20).get(timeout=30)
    assert remote.tolist() == [5.0] * 3 + [7.0] + list(range(4, 10))


def test_rdma_action_submitted_twice_transfers_twice():
    a = torch.arange(8, dtype=torch.float32)
    b = torch.zeros(8, dtype=torch.float32)
    ba, bb = RDMABuffer(a), RDMABuffer(b)
    x, src = torch.zeros(8), torch.ones(8)
    action = RDMAAction().read_remote(x, ba).write_remote(bb, src)
    assert action.submit(timeout=20).get(timeout=30) is None
    assert x.tolist() == a.tolist() and b.tolist() == [1.0] * 8
    x.zero_()
    a += 100
    src.fill_(2.0)
    assert action.submit(timeout=20).get(timeout=30) is None
    assert x.tolist() == a.tolist() and b.tolist() == [2.0] * 8


def test_rdma_action_batches_reads_and_writes():
    a = torch.arange(100, dtype=torch.float32)
    b = torch.zeros(50, dtype=torch.float32)
    ba, bb = RDMABuffer(a), RDMABuffer(b)
    x = torch.zeros(100)
    fut = RDMAAction().read_into(ba, x).write_from(bb, torch.ones(50)).submit(timeout=20)
    assert fut.get(timeout=30) is None
    assert x.tolist() == a.tolist() and b.tolist() == [1.0] * 50
    y = torch.zeros(100)
    RDMAAction().read_remote(y, ba).write_remote(bb, torch.full((50,), 2.0)).submit().get(30)
    assert y.tolist() == a.tolist() and b.tolist() == [2.0] * 50
    with pytest.raises(ValueError, match="same local memory"):
        RDMAAction().read_into(ba, x).read_into(bb, x[:50])
    assert RDMAAction().submit().get(timeout=5) is None


def test_rdma_transfers_start_when_waited_on_in_that_order():
    """As Monarch's: read_into, write_from and RDMAAction.submit return Futures that start
    their transfer when waited on (`get()`, `await`), so transfers on one buffer run in the
    order they are waited on (Monarch's test_rdma_concurrent_2gb_writes_in_order, small)."""
    remote = torch.zeros(1000)
    buf = RDMABuffer(remote)
    a, b = torch.ones(1000), torch.full((1000,), 2.0)
    fa = buf.read_into(a)  # called first, waited on second
    fb = buf.write_from(b)
    fc = RDMAAction().write_remote(buf, torch.full((1000,), 3.0)).submit(timeout=20)
    time.sleep(0.3)
    assert remote.sum() == 0 and a.sum() == 1000, "a transfer started before it was waited on"
    assert fb.get(timeout=20) == 4000
    assert fa.get(timeout=20) == 4000
    assert a.tolist() == [2.0] * 1000

    async def waited() -> None:
        await fc

    asyncio.run(waited())
    assert remote.tolist() == [3.0] * 1000


LOCAL_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from runtime import Actor, endpoint, this_proc

    class Local(Actor):
        @endpoint
        def ping(self):
            return "pong"

        def __cleanup__(self, exc):
            with open({path!r}, "w") as f:
                f.write("cleaned up")

    m = this_proc().spawn("local", Local)
    print(m.ping.call_one().get(timeout=20), flush=True)
""")


def test_actors_in_the_controller_are_cleaned_up_at_exit(tmp_path):
    path = str(tmp_path / "cleanup")
    script = tmp_path / "local_actor.py"
    script.write_text(LOCAL_SCRIPT.format(root=ROOT, path=path))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=60, cwd=str(tmp_path))
    assert p.returncode == 0 and p.stdout.strip() == "pong", p.stderr
    with open(path) as f:
        assert f.read() == "cleaned up"


FOREIGN_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    import cloudpickle
    from _monarch_actors import Where
    with open({path!r}, "rb") as f:
        procs = cloudpickle.load(f)
    try:
        procs.spawn("foreign", Where)
    except RuntimeError as e:
        print(e, flush=True)
""")


def test_a_proc_mesh_in_another_controller_fails_at_spawn(tmp_path):
    """A ProcMesh pickled into a separately started controller (Monarch's
    test_client_hard_exit_cleanup) cannot be used there: its procs take messages from their
    own session only. Spawning on it says so at once (it hung)."""
    import cloudpickle

    pm = this_host().spawn_procs(per_host={"procs": 1}, name="foreign_procs")
    try:
        pm.spawn("mine", Where).where.call_one().get(timeout=30)
        path = tmp_path / "procs.pkl"
        path.write_bytes(cloudpickle.dumps(pm))
        script = tmp_path / "foreign.py"
        script.write_text(FOREIGN_SCRIPT.format(root=ROOT, path=str(path)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]))
        p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           timeout=60, cwd=str(tmp_path), env=env)
        assert "belongs to another controller's session" in p.stdout, (p.stdout, p.stderr)
    finally:
        pm.stop().get(timeout=30)


def test_this_proc_stop_stops_its_actors_not_the_process():
    pm = this_proc()
    m = pm.spawn("stoppable", Where)
    assert m.where.call_one().get(timeout=20)["pid"] == os.getpid()
    pm.stop().get(timeout=20)
    with pytest.raises(runtime.MeshStoppedError):
        m.where.call_one()
    again = this_proc().spawn("after_stop", Where)
    assert again.where.call_one().get(timeout=20)["pid"] == os.getpid()
    again.stop().get(timeout=20)


def test_failure_report_says_why_in_monarchs_words():
    """MeshFailure.report() carries Monarch's phrases: `The actor X and all its descendants
    have failed:` then why: the actor itself failed, or its process was killed (signal) or
    exited (code); a propagated failure names the actor that failed."""
    own = runtime.MeshFailure(mesh="actor", ranks=[0], cause="run() raised ValueError: x",
                              actor_name="<root>.<m.Lambda actor>")
    assert ("The actor <root>.<m.Lambda actor> and all its descendants have failed:\n"
            "    run() raised ValueError: x\n"
            "  This occurred because the actor itself failed.") in own.report()
    killed = runtime.MeshFailure(mesh="nested", ranks=[0], cause="process killed", signal=9,
                                 point="{'a_dim': 0/1}")
    assert ("The actor nested{'a_dim': 0/1} and all its descendants have failed:\n    the "
            "process this actor was running on failed: Killed(sig=9)") in killed.report()
    assert "killed by SIGKILL" in killed.report()
    assert "itself failed" not in killed.report()
    exited = runtime.MeshFailure(mesh="n", ranks=[0], cause="process exited", exit_code=3)
    assert "the process this actor was running on exited with non-zero code 3" in \
        exited.report()
    assert str(own) == ("mesh 'actor' rank(s) [0] failed: run() raised ValueError: x "
                        "(MeshFailure rank=0, crashed_ranks=[0])")
    up = runtime.MeshFailure(mesh="top", ranks=[0], cause="unhandled failure", caused_by=own)
    assert up.report().count("itself failed") == 1  # only in the nested cause


def test_live_failure_reports_carry_monarchs_phrases(failures):
    """An endpoint that raises, and a proc killed by SIGKILL: the unhandled reports say
    `... and all its descendants have failed:` and `the process this actor was running on
    failed: Killed(sig=9)` under the actor's name and point, as Monarch's reports do."""
    pm = this_host().spawn_procs(per_host={"procs": 1}, name="reports")
    try:
        victim = pm.spawn("victim", Where)
        pid = victim.where.call_one().get(timeout=20)["pid"]
        os.kill(pid, 9)
        wait_until(lambda: any(f.mesh == "victim" for f in failures), 20.0, every=0.02)
        report = next(f for f in failures if f.mesh == "victim").report()
        assert re.search(r"The actor <root>\.<_monarch_actors\.Where victim\{'procs': 0/1\}> "
                         r"and all its descendants have failed:\n    the process this actor "
                         r"was running on failed: Killed\(sig=9\)", report), report
    finally:
        pm.stop().get(timeout=20)
    m = this_proc().spawn("raises_exit", Where)
    with pytest.raises(SupervisionError):
        m.exit.call_one().get(timeout=20)
    wait_until(lambda: any(f.mesh == "raises_exit" for f in failures), 20.0, every=0.02)
    report = next(f for f in failures if f.mesh == "raises_exit").report()
    assert re.search(r"The actor <root>\.<_monarch_actors\.Where raises_exit> and all its "
                     r"descendants have failed:\n    .*SystemExit", report), report


def test_abort_fails_the_actor_after_the_call_answers(failures):
    m = this_proc().spawn("aborter", Where)
    assert m.abort.call_one("enough").get(timeout=20) == "still answered"
    wait_until(lambda: any(f.mesh == "aborter" for f in failures), 20.0, every=0.02)
    f = next(f for f in failures if f.mesh == "aborter")
    assert "actor Where aborter aborted: enough" in f.report()
    with pytest.raises(SupervisionError, match="and all its descendants have failed"):
        m.where.call_one().get(timeout=20)
    m2 = this_proc().spawn("aborter2", Where)
    m2.abort.call_one().get(timeout=20)
    wait_until(lambda: any("no reason provided" in f.report() for f in failures), 20.0,
               what=lambda: failures, every=0.02)
    with pytest.raises(RuntimeError, match="inside the actor"):
        runtime.context().actor_instance.abort("from the controller")


def test_stopped_meshes_raise_supervision_errors_in_monarchs_words(failures):
    pm = this_host().spawn_procs(per_host={"procs": 1}, name="stopping")
    a, b = pm.spawn("a_stop", Where), pm.spawn("b_stop", Where)
    a.where.call_one().get(timeout=20)
    a.stop().get(timeout=20)
    with pytest.raises(SupervisionError, match=r"Actor <root>\.<_monarch_actors\.Where a_stop-\w+> "
                                               "exited because of the following reason: stopped"):
        a.where.call_one().get(timeout=20)
    # Monarch's test_actor_mesh_stop pattern
    with pytest.raises(SupervisionError, match=r"(?s)Supervision event: actor <root>\.<\S+ "
                                               r"a_stop-\w+> has status:\n  stopped"):
        a.where.call().get(timeout=20)
    pm.stop().get(timeout=20)
    with pytest.raises(runtime.MeshStoppedError,
                       match="actor mesh is stopped due to proc mesh shutdown"):
        b.where.call_one().get(timeout=20)
    with pytest.raises(SupervisionError, match="`ProcMesh` has already been stopped"):
        pm.spawn("late", Where)


def test_a_call_to_a_dying_actor_fails_in_monarchs_words(failures):
    m = this_proc().spawn("exiter2", Where)
    with pytest.raises(SupervisionError) as ei:
        m.exit.call_one().get(timeout=20)
    # Monarch's line (its test_process_exit_handling's pattern), and our first line
    assert re.search(r"Endpoint call exiter2\.exit\(\) failed, The actor .*exiter2.* and all "
                     r"its descendants have failed", str(ei.value))
    assert re.search(r"Actor Where exiter2 .*exited because of the following reason: The actor "
                     r".* and all its descendants have failed", str(ei.value))


def test_libraries_installed_outside_the_environment_are_not_user_code(tmp_path,
                                                                        monkeypatch):
    """At exit a proc drops the globals of the user's modules only: a distribution installed
    with `pip install --target` on PYTHONPATH (the runtime's own zmq, say) stays intact."""
    from runtime.proc import user_modules

    site, mine = tmp_path / "site", tmp_path / "mine"
    (site / "exitlib").mkdir(parents=True)
    (site / "exitlib" / "__init__.py").write_text("X = 1\n")
    info = site / "exitlib-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: exitlib\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("exitlib\n")
    mine.mkdir()
    (mine / "my_experiment.py").write_text("Y = 2\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(mine))
    try:
        import exitlib  # noqa: F401
        import my_experiment  # noqa: F401

        from runtime.proc import _exit

        looked_up: list = []  # top-level names whose distributions had to be read
        real = _exit._installed_top_levels
        monkeypatch.setattr(_exit, "_installed_top_levels",
                            lambda tops: looked_up.extend(tops) or real(tops))
        names = user_modules()
        assert "my_experiment" in names and "exitlib" not in names, names
        # the project's own modules are known by their place, without reading metadata (a
        # wrong place made every proc's exit read it: 20 ms per proc)
        assert not {"runtime", "monarch_kernel", "monarch_widgets"} & set(looked_up), looked_up
        assert not [n for n in names if n.partition(".")[0] in ("zmq", "torch", "runtime")]
    finally:
        sys.modules.pop("exitlib", None)
        sys.modules.pop("my_experiment", None)
