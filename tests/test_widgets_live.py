"""The views against real meshes: a killed proc shows as failed in the dashboard and through
the admin endpoint; `monarch-admin` attaches to a plain script controller."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import runtime
from runtime import Actor, endpoint, this_host
from runtime.admin import AdminClient, serve
from runtime.admin.server import AdminServer
from monarch_widgets.state import STATE_NAMES, actor_at
from monarch_widgets.widget import Dashboard
from monarch_widgets.admin_cli import main as admin_main
from _util import wait_until
from _procs import end_popen

pytestmark = pytest.mark.timeout(90)


class Talker(Actor):
    @endpoint
    def say(self, text: str) -> int:
        print(text, flush=True)
        return os.getpid()

    @endpoint
    def nap(self, t: float) -> float:
        time.sleep(t)
        return t


class SelfCaller(Actor):
    @endpoint
    def call_self(self, me) -> int:
        return me.ping.call_one().get(timeout=60)  # queued behind this very handler

    @endpoint
    def ping(self) -> int:
        return 1


def grid(widget: Dashboard, mesh: str) -> list[str]:
    for m in widget.state["meshes"]:
        if m["name"] == mesh:
            return [STATE_NAMES[a[1]] for a in m["actors"]]
    return []


def test_dashboard_and_admin_follow_a_killed_proc():
    procs = this_host().spawn_procs(per_host={"procs": 4}, name="wlive")
    try:
        talkers = procs.spawn("talkers", Talker)
        pids = talkers.say.call("hello from a talker").get(timeout=30)
        rt = runtime.get_runtime()
        w = Dashboard(rt.health, runtime=rt, max_rate=10)
        try:
            wait_until(lambda: grid(w, "talkers") == ["idle"] * 4, 20.0,
                       what=lambda: grid(w, "talkers"))
            # frontends without widgets: the meshes' own HTML comes from render_html
            assert talkers._repr_html_().count('data-state="idle"') == 4
            assert procs._repr_html_().count('data-state="idle"') == 4
            srv = serve(rt)  # already started by the first mesh; same object
            assert isinstance(srv, AdminServer) and srv.connection_file.exists()
            client = AdminClient.from_connection_file(srv.connection_file, timeout=10)
            try:
                victim = procs.procs[1]
                assert victim.pid == list(pids.values())[1]
                wait_until(lambda: any("hello from a talker" in ln for ln in
                                       client.output_tail(victim.proc_id)), 10,
                           what="the talker's output in the proc's tail", every=0.05)
                stack = client.dump_stack(procs.procs[2].proc_id)
                assert "Thread actor-talkers-2" in stack and "File " in stack
                # a busy actor shows its endpoint
                fut = talkers.slice(procs=3).nap.call_one(3.0)
                wait_until(lambda: grid(w, "talkers")[3] == "busy", 10,
                           what=lambda: grid(w, "talkers"))
                assert actor_at(w.state, "talkers", 3)["endpoint"] == "nap"
                fut.get(timeout=10)
                # kill one proc through the admin endpoint
                assert client.kill_proc(victim.proc_id)
                wait_until(lambda: grid(w, "talkers")[1] == "failed", 20.0,
                           what=lambda: grid(w, "talkers"))
                failed = actor_at(w.state, "talkers", 1)
                assert failed["last_error"], failed
                # the others live on (rank 3 is idle: its nap has answered)
                wait_until(lambda: grid(w, "talkers") == ["idle", "failed", "idle", "idle"],
                           20.0, what=lambda: grid(w, "talkers"))
                snap = {m.name: m for m in client.snapshot()}
                assert snap["talkers"].actors[1].state.value == "failed"
                # stop the whole mesh through the endpoint
                assert client.stop_mesh("wlive") == 1
                wait_until(lambda: set(grid(w, "talkers")) <= {"failed", "stopped"}, 20.0,
                           what=lambda: grid(w, "talkers"))
            finally:
                client.close()
        finally:
            w.close()
    finally:
        procs.stop().get(timeout=20)


SCRIPT = """
import time
from runtime import Actor, endpoint, this_host

class Worker(Actor):
    @endpoint
    def ping(self):
        return 1

procs = this_host().spawn_procs(per_host={"procs": 2}, name="script")
workers = procs.spawn("workers", Worker)
workers.ping.call().get(timeout=30)
print("ready", flush=True)
time.sleep(60)
"""


def test_monarch_admin_attaches_to_a_plain_script(tmp_path, monkeypatch, capsys):
    rundir = tmp_path / "run"
    env = dict(os.environ, MONARCH_RUNTIME_DIR=str(rundir),
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        monkeypatch.setenv("MONARCH_RUNTIME_DIR", str(rundir))
        wait_until(lambda: admin_main(["--status"]) == 0, 10, what="monarch-admin --status",
                   every=0.05)
        out = capsys.readouterr().out
        assert "mesh workers [procs=2] on script:" in out, out
        files = list(rundir.glob("admin-*.json"))
        assert len(files) == 1 and oct(files[0].stat().st_mode & 0o777) == "0o600"
    finally:
        end_popen(p)


def test_an_answered_call_shows_idle_at_once_and_stays_idle():
    """Heartbeats sample actor states on another socket than replies: a busy sample taken
    during a call may arrive after its reply. The model shows the actor idle once the call
    has answered, and no late sample turns it busy again."""
    procs = this_host().spawn_procs(per_host={"procs": 1}, name="idlecheck")
    try:
        talker = procs.spawn("idlers", Talker)
        rt = runtime.get_runtime()

        def state() -> str:
            mesh = next(m for m in rt.health.snapshot() if m.name == "idlers")
            return mesh.actors[0].state.value

        talker.nap.call_one(0.01).get(timeout=30)
        fut = talker.nap.call_one(1.2)
        wait_until(lambda: state() == "busy", 10, what=state)  # a heartbeat saw the nap
        fut.get(timeout=10)
        assert state() == "idle"
        seen = []
        for _ in range(40):  # short calls, each racing a heartbeat's sample
            talker.nap.call_one(0.04).get(timeout=10)
            seen.append(state())
        assert seen == ["idle"] * 40, seen
    finally:
        procs.stop().get(timeout=20)


def test_dashboard_draws_the_timeline_and_takes_stacks_on_request():
    """The timeline tab's and the actor detail's actions, as the front end sends them."""
    import json

    from runtime import stacks

    procs = this_host().spawn_procs(per_host={"procs": 2}, name="wtl")
    rt = runtime.get_runtime()
    w = Dashboard(rt.health, runtime=rt, max_rate=10)
    try:
        talkers = procs.spawn("tltalkers", Talker)
        talkers.nap.call(0.01).get(timeout=30)
        assert w.handle_action({"action": "timeline"}) == "timeline drawn"
        assert 'data-mesh="wtl"' in w.timeline and w.timeline.count('class="mt-lane"') >= 2
        msg = w.handle_action({"action": "stacks", "mesh": "tltalkers", "rank": 1})
        got = json.loads(w.stacks)
        assert got["mesh"] == "tltalkers" and got["rank"] == 1
        assert got["text"].startswith("== wtl rank 1")
        if stacks.find_py_spy()[0] is not None:
            assert msg == "stacks of tltalkers[1] taken by py-spy", msg
            assert "'actor-tltalkers-1'" in got["text"], got["text"]
        assert "stacks failed: KeyError" in w.handle_action(
            {"action": "stacks", "mesh": "nobody", "rank": 0})
    finally:
        w.close()
        procs.stop().get(timeout=30)


def test_the_dashboard_and_admin_show_what_a_stuck_actor_waits_on():
    """A sync endpoint calling its own actor: the dashboard's state and the admin
    endpoint's snapshot say what its handler waits on and that a message waits behind it
    (the heartbeats' diagnosis data); once cancelled, it shows idle with nothing queued."""
    from runtime.admin.codec import decode_snapshot, encode_snapshot

    procs = this_host().spawn_procs(per_host={"procs": 1}, name="stuckview")
    try:
        a = procs.spawn("selfcaller", SelfCaller)
        rt = runtime.get_runtime()
        w = Dashboard(rt.health, runtime=rt, max_rate=10)
        try:
            fut = a.call_self.call_one(a)

            def shown():
                rec = actor_at(w.state, "selfcaller", 0)
                return rec if rec and rec["waits"] and rec["queued"] == 1 else None

            wait_until(shown, 20.0, what=lambda: actor_at(w.state, "selfcaller", 0))
            rec = shown()
            assert rec["state"] == "busy" and rec["endpoint"] == "call_self"
            assert rec["waits"] == "a call SelfCaller.ping to selfcaller rank 0", rec
            (m,) = [m for m in decode_snapshot(encode_snapshot(rt.health.snapshot()))
                    if m.name == "selfcaller"]
            assert m.actors[0].waits == rec["waits"] and m.actors[0].queued == 1
            assert fut.cancel()
            wait_until(lambda: (r := actor_at(w.state, "selfcaller", 0)) is not None
                       and r["state"] == "idle" and r["queued"] == 0 and not r["waits"], 20.0,
                       what=lambda: actor_at(w.state, "selfcaller", 0))
        finally:
            w.close()
    finally:
        procs.stop().get(timeout=20)
