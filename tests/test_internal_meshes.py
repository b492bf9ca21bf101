"""Internal meshes (`ProcMesh.spawn_internal`): the runtime's and front-ends' own actors
(a notebook's cell runner, the tensor engine's workers, SPMD set-up) stay out of the
user's views, never take a user's name, and fail in terms of the user's proc mesh."""

from __future__ import annotations

import signal
import threading

import pytest

import runtime
from _actors import Echo, ShardUser
from _util import wait_until
from _procs import spawn_procs_fixture

pytestmark = pytest.mark.timeout(90)


trainers = spawn_procs_fixture({"procs": 2}, "trainers", scope="function", ready_timeout=60)


def test_internal_meshes_are_left_out_of_meshes_and_the_snapshot(trainers):
    rt = runtime.get_runtime()
    user = trainers.spawn("trainers", Echo)  # named like its proc mesh, as a user may
    cells = trainers.spawn_internal("cells", Echo)
    user.initialized.get(timeout=30)
    cells.initialized.get(timeout=30)
    assert cells.internal and not user.internal
    assert user.health_name == "trainers"  # not "trainers~2"
    assert cells.health_name == "trainers.cells"
    assert user in rt.meshes() and cells not in rt.meshes()
    assert cells in rt.state.live_meshes(internal=True)
    names = {m.name: m.internal for m in rt.health.snapshot()}
    assert "trainers" in names and "trainers.cells" not in names
    with_internal = {m.name: m.internal for m in rt.health.snapshot(internal=True)}
    assert with_internal["trainers.cells"] is True and with_internal["trainers"] is False
    assert rt.health.mesh("trainers.cells") is not None  # a lookup by name finds it


def test_a_user_name_wins_over_an_internal_one(trainers):
    cells = trainers.spawn_internal("cells", Echo)
    assert cells.health_name == "trainers.cells"
    user = trainers.spawn("trainers.cells", Echo)  # the internal mesh's name, taken later
    assert user.health_name == "trainers.cells"
    assert cells.health_name == "trainers.cells~2"
    rt = runtime.get_runtime()
    snap = {m.name: m for m in rt.health.snapshot(internal=True)}
    assert snap["trainers.cells"].internal is False
    assert snap["trainers.cells~2"].internal is True
    assert {a.mesh for a in snap["trainers.cells~2"].actors} == {"trainers.cells~2"}
    # calls still reach both, and their states are kept under the new names
    assert list(user.ping.call(1).get(timeout=30).values()) == [1, 1]
    assert list(cells.ping.call(2).get(timeout=30).values()) == [2, 2]
    wait_until(lambda: all(a.handled >= 1 for a in rt.health.mesh("trainers.cells~2").actors),
               30.0, what="both renamed actors' handled calls counted")


def test_a_proc_mesh_html_view_shows_only_the_users_meshes(trainers):
    import monarch_widgets

    user = trainers.spawn("workers", Echo)
    trainers.spawn_internal("cells", Echo).initialized.get(timeout=30)
    user.initialized.get(timeout=30)
    html = monarch_widgets.mesh_html(trainers, "proc_mesh")
    assert html is not None and "workers" in html and "cells" not in html
    assert "cells" not in monarch_widgets.status_html(runtime=runtime.get_runtime())
    assert "cells" not in monarch_widgets.status_html("trainers", runtime=runtime.get_runtime())


class _Hook:
    """Collects what `runtime.unhandled_fault_hook` gets."""

    def __init__(self) -> None:
        self.got: list = []
        self.lock = threading.Lock()

    def __call__(self, failure) -> None:
        with self.lock:
            self.got.append(failure)


@pytest.fixture
def hook(monkeypatch):
    h = _Hook()
    monkeypatch.setattr(runtime, "unhandled_fault_hook", h)
    return h


def test_a_proc_that_dies_under_an_internal_mesh_is_reported_against_the_proc_mesh(trainers,
                                                                                      hook):
    cells = trainers.spawn_internal("cells", Echo)
    cells.initialized.get(timeout=30)
    proc = trainers.procs[1]
    runtime.get_runtime().kill_proc(proc.proc_id, signal.SIGKILL)
    wait_until(lambda: hook.got, 30.0, what="the failure reached the hook")
    _all_failures_handed_out()
    assert len(hook.got) == 1
    f = hook.got[0]
    assert (f.mesh, f.ranks, f.internal, f.signal) == ("trainers", [1], "cells", 9)
    report = f.report()
    assert report.startswith("MeshFailure: proc mesh 'trainers' rank 1 failed")
    assert "Echo" not in report and "cells" not in report and "<root>" not in report
    assert f"pid {proc.pid}" in report


def test_with_a_user_mesh_on_the_dead_proc_only_the_users_failure_is_reported(trainers, hook):
    user = trainers.spawn("workers", Echo)
    cells = trainers.spawn_internal("cells", Echo)
    user.initialized.get(timeout=30)
    cells.initialized.get(timeout=30)
    with pytest.raises(runtime.SupervisionError):
        user.slice(procs=0).exit_hard.call(3).get(timeout=30)
    _all_failures_handed_out()
    assert [(f.mesh, f.ranks, f.internal) for f in hook.got] == [("workers", [0], "")]


def _all_failures_handed_out() -> None:
    """Return once every failure the I/O thread has handled so far reached the hook: a
    proc's failures are all handed out in one pass of the I/O thread, each to a hook
    thread of its own."""
    rt = runtime.get_runtime()
    rt.state.change(lambda: None)  # runs on the I/O thread after the pass that handed out
    for t in [t for t in threading.enumerate() if t.name == "monarch-fault-hook"]:
        t.join(timeout=10)


def test_spmd_setup_spawns_an_internal_mesh(trainers):
    import asyncio

    from runtime.spmd import setup_torch_elastic_env, setup_torch_elastic_env_async

    actors = setup_torch_elastic_env(trainers)
    assert actors.internal and actors not in runtime.get_runtime().meshes()
    again = asyncio.run(setup_torch_elastic_env_async(trainers, "127.0.0.1", 29511))
    assert again.internal
    reader = trainers.spawn("reader", ShardUser)
    assert list(reader.env.call("MASTER_PORT").get(timeout=30).values()) == ["29511", "29511"]
    assert [m.name for m in runtime.get_runtime().health.snapshot()
            if m.proc_mesh == "trainers"] == ["reader"]
