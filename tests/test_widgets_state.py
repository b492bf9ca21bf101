"""Dashboard state, widget updates and static renderings, against a HealthModel we fill."""

from __future__ import annotations

import json
import threading
import time

import pytest

import monarch_widgets
from monarch_widgets import controls
from monarch_widgets.widget import Dashboard
from monarch_widgets.render import render_html, render_text
from monarch_widgets.state import STATE_NAMES, actor_at, build_state, grid_shape
from runtime.supervision.health import ActorHealth, ActorState, HealthModel, ProcStats
from _util import wait_until

pytestmark = pytest.mark.timeout(30)


def fill(model: HealthModel, name: str = "trainers", hosts: int = 2, gpus: int = 2) -> None:
    actors = []
    for r in range(hosts * gpus):
        actors.append(ActorHealth(name, r, {"hosts": r // gpus, "gpus": r % gpus},
                                  ActorState.IDLE, proc_id=f"{name}-p{r}",
                                  host=f"host{r // gpus}", pid=4000 + r, since=100.0))
        model.update_proc(ProcStats(f"{name}-p{r}", f"host{r // gpus}", 4000 + r,
                                    cpu_percent=50.0 + r, rss_bytes=(r + 1) << 20,
                                    gpu_mem_bytes=None if r else 2 << 30))
    model.add_mesh(name, "procs", {"hosts": hosts, "gpus": gpus}, actors)


def states(widget: Dashboard, mesh: str = "trainers") -> list[str]:
    m = next(m for m in widget.state["meshes"] if m["name"] == mesh)
    return [STATE_NAMES[a[1]] for a in m["actors"]]


def test_build_state_compact_and_decodable():
    model = HealthModel()
    fill(model)
    model.update("trainers", 1, ActorState.BUSY, endpoint="train_step", handled=3)
    model.update("trainers", 2, ActorState.FAILED, last_error="proc killed (SIGKILL)",
                 last_traceback="Traceback ...\nProcessDied", errors=1)
    st = build_state(model.snapshot(), version=model.version, now=200.0)
    json.dumps(st)  # JSON-able
    (m,) = st["meshes"]
    assert m["dims"] == [["hosts", 2], ["gpus", 2]]
    assert m["state"] == "failed" and m["counts"] == {"idle": 2, "busy": 1, "failed": 1}
    assert [STATE_NAMES[a[1]] for a in m["actors"]] == ["idle", "busy", "failed", "idle"]
    assert st["procs"][0] == ["trainers-p0", "host0", 4000, 50.0, 1 << 20, 2 << 30]
    busy = actor_at(st, "trainers", 1)
    assert busy["endpoint"] == "train_step" and busy["handled"] == 3
    assert actor_at(st, "trainers", 0)["since"] == 100.0
    failed = actor_at(st, "trainers", 2)
    assert failed["state"] == "failed" and failed["last_error"] == "proc killed (SIGKILL)"
    assert failed["last_traceback"].endswith("ProcessDied")
    assert failed["proc"][:3] == ["trainers-p2", "host1", 4002]


def test_identical_tracebacks_are_interned():
    model = HealthModel()
    fill(model, hosts=1, gpus=8)
    for r in range(8):
        model.update("trainers", r, ActorState.FAILED, last_error="boom",
                     last_traceback="T" * 3000)
    st = build_state(model.snapshot())
    assert len(st["texts"]) == 2  # one error, one traceback, shared by 8 actors


def test_grid_shape():
    assert grid_shape([["hosts", 2], ["gpus", 4]], 8) == (2, 4)
    assert grid_shape([["procs", 4]], 4) == (1, 4)
    rows, cols = grid_shape([["procs", 1000]], 1000)
    assert cols <= 32 and rows * cols >= 1000


def test_widget_shows_failed_actor_live():
    model = HealthModel()
    fill(model)
    w = Dashboard(model, max_rate=20)
    try:
        assert states(w) == ["idle"] * 4
        # the runtime's thread reports a failure: the widget follows without any call
        threading.Thread(target=model.update, args=("trainers", 3, ActorState.FAILED),
                         kwargs={"last_error": "proc exited with SIGKILL"}).start()
        wait_until(lambda: states(w)[3] == "failed", 5.0, what=lambda: states(w))
        assert actor_at(w.state, "trainers", 3)["last_error"] == "proc exited with SIGKILL"
        # a second mesh appears; a removed one disappears
        fill(model, "evals", 1, 2)
        wait_until(lambda: [m["name"] for m in w.state["meshes"]] == ["trainers", "evals"], 5.0,
                   what=lambda: w.state["meshes"])
        model.remove_mesh("trainers")
        wait_until(lambda: [m["name"] for m in w.state["meshes"]] == ["evals"], 5.0,
                   what=lambda: w.state["meshes"])
    finally:
        w.close()
    wait_until(lambda: not w._thread.is_alive(), 3, what="the widget's thread ended")


def test_widget_coalesces_bursts():
    model = HealthModel()
    fill(model, hosts=1, gpus=100)
    w = Dashboard(model, max_rate=4)
    try:
        start_pushes = w.pushes
        threads = [threading.Thread(target=lambda k=k: [
            model.update("trainers", r, ActorState.BUSY if i % 2 else ActorState.IDLE,
                         handled=i) for i in range(20) for r in range(k, 100, 4)])
            for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wait_until(lambda: w.state["v"] == model.version, 5,  # the last one is shown
                   what=lambda: (w.state["v"], model.version))
        pushes = w.pushes - start_pushes
        # 2,000 changes from 4 threads are coalesced: far fewer pushes than changes (the
        # rate itself, at most max_rate a second, is measured by benchmarks/bench_dashboard.py)
        assert 1 <= pushes <= 2000 // 50, pushes
        assert all(a[5] == 19 for a in w.state["meshes"][0]["actors"])
    finally:
        w.close()


class FakeMesh:
    def __init__(self, name: str) -> None:
        self.name = name
        self.stops = 0

    def stop(self) -> None:
        self.stops += 1


class FakeRuntime:
    def __init__(self) -> None:
        self.health = HealthModel()
        fill(self.health)
        self.mesh = FakeMesh("trainers")

    def meshes(self) -> list:
        return [self.mesh]


def test_controls_from_widget_callbacks():
    rt = FakeRuntime()
    w = monarch_widgets.dashboard(rt, max_rate=20)
    assert monarch_widgets.dashboard(rt, max_rate=20) is w  # a re-run cell reuses it
    try:
        # callbacks arrive on the comm thread; actions run on their own thread
        w._on_front_msg(w, {"action": "stop_mesh", "mesh": "trainers"}, [])
        wait_until(lambda: rt.mesh.stops == 1, 5.0, what=lambda: rt.mesh.stops)
        wait_until(lambda: w.state["notice"] == "stopped mesh trainers", 5.0,
                   what=lambda: w.state["notice"])
        assert "no live mesh named 'x'" in w.handle_action({"action": "stop_mesh", "mesh": "x"})
        controls.set_attach_handler(None)
        assert "no debugger attach handler" in w.handle_action(
            {"action": "attach", "mesh": "trainers", "rank": 1})
        calls = []
        controls.set_attach_handler(lambda mesh, rank: calls.append((mesh, rank)))
        assert w.handle_action({"action": "attach", "mesh": "trainers", "rank": "1"}) == \
            "attached to trainers[1]"
        assert calls == [("trainers", 1)]
    finally:
        controls.set_attach_handler(None)
        w.close()
    w2 = monarch_widgets.dashboard(rt, max_rate=20)  # a closed one is replaced
    assert w2 is not w and w2.is_live()
    w2.close()


def test_bad_arguments():
    with pytest.raises(TypeError, match="HealthModel"):
        Dashboard(object())
    with pytest.raises(ValueError, match="max_rate"):
        Dashboard(HealthModel(), max_rate=0)
    with pytest.raises(ValueError, match="mesh name"):
        controls.stop_mesh("", runtime=FakeRuntime())


def test_render_text_and_html():
    model = HealthModel()
    fill(model)
    model.update("trainers", 2, ActorState.FAILED, last_error="<boom>",
                 last_traceback="Traceback\n  raise <boom>")
    model.update("trainers", 1, ActorState.PAUSED, endpoint="step")
    snap = model.snapshot()
    text = monarch_widgets.render_text(snap, now=110.0)
    assert "mesh trainers [hosts=2 x gpus=2] on procs: failed" in text
    assert "  o P\n  X o" in text
    assert "rank 2 failed for" in text and "<boom>" in text
    assert "rank 1 paused" in text and "step" in text
    html = monarch_widgets.render_html(snap, now=110.0)
    assert html.count('data-state="failed"') == 1 and html.count('data-state="idle"') == 2
    assert "&lt;boom&gt;" in html and "<boom>" not in html  # escaped
    assert "grid-template-columns:repeat(2,14px)" in html
    assert monarch_widgets.render_text([]) == "no meshes"


def test_thousand_actors_state_size():
    """1,000 actors: the pushed state stays small (the cost is measured in benchmarks/)."""
    model = HealthModel()
    fill(model, hosts=10, gpus=100)
    for r in range(0, 1000, 7):
        model.update("trainers", r, ActorState.BUSY, endpoint="forward", handled=r)
    # the heaviest layout: one proc per actor, so every actor also carries a proc row
    w = Dashboard(model, clock=lambda: 200.0)
    w.close()
    size = len(w.payload)  # the bytes one update sends
    assert size < 100 * 1000, size


def test_magic_subcommands():
    from monarch_kernel.views import handle

    rt = FakeRuntime()
    rt.health.update("trainers", 0, ActorState.FAILED, last_error="boom")
    text = handle("status --text", runtime=rt)
    assert "mesh trainers [hosts=2 x gpus=2] on procs: failed" in text
    assert "no meshes" == handle("status --text nope", runtime=rt)
    w = handle(["status"], runtime=rt)
    try:
        assert isinstance(w, Dashboard) and states(w)[0] == "failed"
    finally:
        w.close()
    assert handle("stop trainers", runtime=rt) == "stopped mesh trainers"
    assert rt.mesh.stops == 1
    with pytest.raises(ValueError, match="usage: %mesh attach"):
        handle("attach trainers x", runtime=rt)
    with pytest.raises(ValueError, match="unknown %mesh subcommand 'frob'"):
        handle("frob", runtime=rt)
    assert "usage:" in handle("", runtime=rt)


def test_load_ipython_extension_registers_mesh_magic():
    from IPython.core.interactiveshell import InteractiveShell

    InteractiveShell.clear_instance()  # a fresh shell: other tests may have loaded %mesh
    ip = InteractiveShell.instance()
    try:
        ip.run_line_magic("load_ext", "monarch_widgets")
        assert "mesh" in ip.magics_manager.magics["line"]
        assert "usage:" in ip.run_line_magic("mesh", "")
    finally:
        InteractiveShell.clear_instance()


def test_tensor_engine_memory_is_a_proc_column_where_the_engine_runs():
    model = HealthModel()
    fill(model)
    st = build_state(model.snapshot(), version=model.version, now=200.0)
    assert all(len(p) == 6 for p in st["procs"])  # no engine: no column
    assert "tensors" not in render_text(model.snapshot())
    model.update_proc(ProcStats("trainers-p1", "host0", 4001, cpu_percent=1.0,
                                rss_bytes=1 << 20, tensor_bytes=3 << 20))
    st = build_state(model.snapshot(), version=model.version, now=200.0)
    by_id = {p[0]: p for p in st["procs"]}
    assert by_id["trainers-p1"][6] == 3 << 20 and len(by_id["trainers-p0"]) == 6
    text = render_text(model.snapshot())
    assert "tensors" in text and "3.0M" in text
    assert "<th>tensors</th>" in render_html(model.snapshot())


def test_state_names_the_active_meshes():
    model = HealthModel()
    fill(model)
    assert build_state(model.snapshot())["active"] == []
    assert build_state(model.snapshot(), active=("procs",))["active"] == ["procs"]


def test_busy_actors_show_what_they_wait_on_and_what_is_queued():
    """The diagnosis data of heartbeats (mailbox depth, what the handler waits on) reaches
    the dashboard's state, its detail record and the text and HTML views; an idle actor
    shows none of it."""
    model = HealthModel()
    fill(model)
    model.update("trainers", 1, ActorState.BUSY, endpoint="call_self", queued=2,
                 waits="a call Hangs.answer to trainers rank 1")
    model.update("trainers", 3, ActorState.IDLE, queued=0, waits=None)
    st = build_state(model.snapshot(), version=model.version, now=200.0)
    busy = actor_at(st, "trainers", 1)
    assert busy["waits"] == "a call Hangs.answer to trainers rank 1" and busy["queued"] == 2
    idle = actor_at(st, "trainers", 3)
    assert idle["waits"] is None and idle["queued"] == 0
    text = monarch_widgets.render_text(model.snapshot(), now=200.0)
    assert ("rank 1 busy for" in text and "call_self; waits on a call Hangs.answer to "
            "trainers rank 1; 2 queued") in text, text
    html = monarch_widgets.render_html(model.snapshot(), now=200.0)
    assert html.count('data-waiting="1"') == 1, html
    assert "waits on a call Hangs.answer to trainers rank 1; 2 queued" in html


def test_waits_text_says_what_a_heartbeat_waits_on():
    from runtime.supervision.health import waits_text

    assert waits_text(None) is None
    assert waits_text({"actor": "a-1", "mesh": "first", "ranks": [0],
                       "label": "Hangs.call_back"}) == "a call Hangs.call_back to first rank 0"
    assert waits_text({"label": "PortReceiver.recv"}) == "a value on a Channel port (recv)"
    c = {"call": "time.sleep(60)", "kind": "a sleep"}
    assert waits_text({"label": "a C call", "c": c}).startswith(
        "a C call (a sleep): time.sleep(60), not cancellable")


def test_kept_meshes_show_their_lease_and_when_they_were_reattached():
    """A kept mesh (spawn_procs(keep=), %mesh alloc --keep) says so with its lease, in the
    widget state and the text/HTML renderings; one this controller reattached says when;
    a mesh that ends with its controller says nothing; the admin codec carries both."""
    from runtime.admin.codec import decode_snapshot, encode_snapshot

    model = HealthModel()
    fill(model, "plain")
    actors = [ActorHealth("counters", r, {"procs": r}, ActorState.IDLE, proc_id=f"k{r}",
                          host="h", pid=5000 + r, since=100.0) for r in range(2)]
    model.add_mesh("counters", "trainers", {"procs": 2}, actors, keep=1800.0)
    again = time.mktime((2025, 1, 2, 12, 0, 3, 0, 0, -1))
    model.add_mesh("old", "trainers", {"procs": 2},
                   [ActorHealth("old", r, {"procs": r}, ActorState.IDLE, proc_id=f"k{r}")
                    for r in range(2)], keep=600.0, reattached=again)
    snap = model.snapshot()
    st = build_state(snap, now=200.0)
    json.dumps(st)
    by = {m["name"]: m for m in st["meshes"]}
    assert by["plain"]["keep"] == 0 and by["plain"]["lease"] == ""
    assert by["counters"]["keep"] == 1800.0
    assert by["counters"]["lease"] == ("kept: lease ends 30m00s after its controller "
                                       "goes away")
    assert by["old"]["lease"] == ("kept: lease ends 10m00s after its controller goes "
                                  "away; reattached at 12:00:03")
    text = render_text(snap, now=200.0)
    assert "  kept: lease ends 30m00s after its controller goes away" in text, text
    assert text.count("kept: lease") == 2, text
    html = render_html(snap, now=200.0, mesh="old")
    assert 'class="monarch-lease" data-keep="600"' in html and "reattached at 12:00:03" in html
    assert "monarch-lease" not in render_html(snap, now=200.0, mesh="plain")
    back = {m.name: m for m in decode_snapshot(json.loads(json.dumps(encode_snapshot(snap))))}
    assert (back["counters"].keep, back["counters"].reattached) == (1800.0, None)
    assert (back["old"].keep, back["old"].reattached) == (600.0, again)
    assert (back["plain"].keep, back["plain"].reattached) == (0.0, None)
