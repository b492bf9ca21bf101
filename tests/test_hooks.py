"""runtime.hooks (display and start-up hooks) and the public API the front-ends use instead
of runtime's internals: current_runtime, ProcMesh.root/.stopped, ActorMesh.restricted_to,
.health_name, .class_name, .stopped, Future.interrupt_hook, Runtime.proc_state."""

from __future__ import annotations

import pytest

import runtime
from runtime import Future, hooks, this_host
from _actors import Echo

pytestmark = pytest.mark.timeout(60)


class Thing:
    def __repr__(self) -> str:
        return "<Thing & co>"


@pytest.fixture
def no_display_hook():
    old = hooks.set_display_hook(None)
    yield
    hooks.set_display_hook(old)


def test_display_hook_and_text_fallback(no_display_hook):
    assert hooks.mesh_html(Thing(), "proc_mesh") == "<pre>&lt;Thing &amp; co&gt;</pre>"
    seen = []

    def hook(mesh, kind):
        seen.append(kind)
        return {"proc_mesh": "<b>grid</b>", "actor_mesh": None}[kind]

    assert hooks.set_display_hook(hook) is None
    assert hooks.get_display_hook() is hook
    assert hooks.mesh_html(Thing(), "proc_mesh") == "<b>grid</b>"
    assert hooks.mesh_html(Thing(), "actor_mesh").startswith("<pre>")  # None: the text
    hooks.set_display_hook(lambda mesh, kind: 1 / 0)
    assert hooks.mesh_html(Thing(), "proc_mesh").startswith("<pre>")  # a failing hook
    assert seen == ["proc_mesh", "actor_mesh"]
    with pytest.raises(TypeError):
        hooks.set_display_hook("not callable")


def test_widgets_install_their_display_hook_on_import(no_display_hook):
    import monarch_widgets

    monarch_widgets.install_display_hook(replace=False)
    assert hooks.get_display_hook() is monarch_widgets.mesh_html
    mine = lambda mesh, kind: "mine"  # noqa: E731
    hooks.set_display_hook(mine)
    monarch_widgets.install_display_hook(replace=False)  # a user's hook is kept
    assert hooks.get_display_hook() is mine
    monarch_widgets.install_display_hook()  # %load_ext monarch_widgets: the views' hook
    assert hooks.get_display_hook() is monarch_widgets.mesh_html


def test_startup_hooks_run_when_the_controller_runtime_starts():
    runtime.shutdown()
    assert runtime.current_runtime() is None
    started = []

    def hook(rt):  # get_runtime() in a hook: this runtime (no deadlock, no second one)
        started.append(rt if runtime.get_runtime() is rt else "another runtime")

    runtime.add_startup_hook(hook)
    runtime.add_startup_hook(hook)  # once
    def bad(rt):
        raise RuntimeError("a broken hook is logged; the others still run")

    runtime.add_startup_hook(bad)
    try:
        rt = runtime.get_runtime()
        assert started == [rt] and runtime.current_runtime() is rt
        runtime.get_runtime()
        assert started == [rt]  # not again for the same runtime
    finally:
        hooks.remove_startup_hook(hook)
        hooks.remove_startup_hook(bad)
    runtime.shutdown()
    assert runtime.current_runtime() is None
    runtime.get_runtime()
    assert len(started) == 1  # removed


def test_public_mesh_api_for_front_ends():
    procs = this_host().spawn_procs(per_host={"hosts": 2, "procs": 2}, name="pubapi")
    try:
        rt = runtime.current_runtime()
        assert rt is runtime.get_runtime()
        echo = procs.spawn("pubecho", Echo)
        echo.initialized.get(timeout=30)
        assert procs.root is procs and not procs.stopped
        view = procs.slice(hosts=1)
        assert view.root is procs
        assert {rt.proc_state(p.proc_id) for p in procs.procs} == {"running"}
        assert rt.proc_state("nope") is None
        assert echo.class_name == "Echo" and echo.health_name == "pubecho"
        assert rt.health.mesh(echo.health_name) is not None
        part = echo.restricted_to(view)
        assert part.sizes == {"procs": 2}
        ranks = [v["rank"] for v in part.whoami.call().get(timeout=10).values()]
        assert ranks == [2, 3]
        other = this_host().spawn_procs(per_host={"procs": 1}, name="other")
        with pytest.raises(ValueError, match="not a view"):
            echo.restricted_to(other)
        fut = echo.ping.call(1)
        out: Future = Future("derived")
        out.interrupt_hook = fut.interrupt_hook
        assert out.interrupt_hook is fut.interrupt_hook
        fut.get(timeout=10)
        assert not echo.stopped
        echo.stop().get(timeout=10)
        assert echo.stopped
        view.stop().get(timeout=15)
        assert procs.stopped and view.stopped and procs.slice(hosts=0).stopped
    finally:
        procs.stop().get(timeout=15)
        for m in runtime.get_runtime().meshes():
            m.stop().get(timeout=15)
