"""The terminal admin app, driven with textual's pilot against a fake admin source."""

from __future__ import annotations

import asyncio
import re
import threading
from importlib.metadata import version

import pytest
from textual.widgets import Log, Static, Tree

from monarch_widgets.tui import AdminApp, ConfirmScreen, stack_text
from runtime.supervision.health import ActorHealth, ActorState, HealthModel, ProcStats

pytestmark = pytest.mark.timeout(60)
NOW = 1_000_000.0


class FakeSource:
    """Stands in for an AdminClient: a HealthModel plus recorded actions."""

    def __init__(self) -> None:
        self.health = HealthModel()
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        actors = []
        for r in range(4):
            host = f"host{r // 2}"
            actors.append(ActorHealth("trainers", r, {"hosts": r // 2, "gpus": r % 2},
                                      ActorState.IDLE, proc_id=f"trainers-{r}", host=host,
                                      pid=5000 + r, since=NOW - 30, handled=10 * r))
            self.health.update_proc(ProcStats(f"trainers-{r}", host, 5000 + r,
                                              cpu_percent=25.0 * r, rss_bytes=(r + 1) << 28,
                                              gpu_mem_bytes=(r + 1) << 30))
        self.health.add_mesh("trainers", "procs", {"hosts": 2, "gpus": 2}, actors)
        self.health.update("trainers", 1, ActorState.BUSY, endpoint="train_step",
                           since=NOW - 2.5)

    def snapshot(self):
        return self.health.snapshot()

    def output_tail(self, proc_id: str, n: int = 200) -> list[str]:
        return [f"[{proc_id}] step {i} loss {1.0 / (i + 1):.3f}" for i in range(3)]

    def dump_stack(self, proc_id: str, timeout: float = 10.0) -> str:
        return (f"Thread 0x00007f (most recent call first):\n"
                f'  File "train.py", line 42 in train_step\n  # {proc_id}')

    def stop_mesh(self, name: str) -> int:
        with self.lock:
            self.calls.append(("stop_mesh", name))
        for a in self.health.mesh(name).actors:
            self.health.update(name, a.rank, ActorState.STOPPED)
        return 1

    def kill_proc(self, proc_id: str) -> bool:
        with self.lock:
            self.calls.append(("kill_proc", proc_id))
        rank = int(proc_id.rsplit("-", 1)[1])
        self.health.update("trainers", rank, ActorState.FAILED,
                           last_error="proc trainers-%d died (SIGKILL)" % rank,
                           since=NOW - 1)
        return True


def make_app(source: FakeSource) -> AdminApp:
    return AdminApp(source, refresh_interval=0, clock=lambda: NOW, label="controller pid 4242")


async def settle(pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def tree_labels(app: AdminApp) -> list[str]:
    out = []

    def walk(node, depth):
        out.append("  " * depth + str(node.label))
        for c in node.children:
            walk(c, depth + 1)

    walk(app.query_one("#tree", Tree).root, 0)
    return out


async def select(pilot, key) -> None:
    app = pilot.app
    app.query_one("#tree", Tree).move_cursor(app.tree_nodes[key])
    await settle(pilot)


def test_tree_detail_and_output():
    asyncio.run(_test_tree_detail_and_output())


async def _test_tree_detail_and_output():
    src = FakeSource()
    app = make_app(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        labels = tree_labels(app)
        assert labels[0] == "controller pid 4242"
        assert labels[1].startswith("  host0") and "2 procs" in labels[1]
        assert any("trainers[1] \u25cf busy train_step" in ln for ln in labels)
        assert sum("\u25cf idle" in ln for ln in labels) == 3
        await select(pilot, ("actor", "trainers", 1))
        detail = str(app.query_one("#detail", Static).render())
        assert "trainers[1]" in detail and "busy for 2.5s" in detail
        assert "endpoint train_step" in detail and "messages 10 handled" in detail
        out = app.query_one("#output", Log)
        assert out.lines[-1] == "[trainers-1] step 2 loss 0.333"
        assert "trainers-1" in str(out.border_title)
        await select(pilot, ("proc", "trainers-3"))
        detail = str(app.query_one("#detail", Static).render())
        assert "pid 5003" in detail and "CPU 75%" in detail and "GPU mem 4.0G" in detail


def test_a_busy_actor_shows_what_it_waits_on():
    asyncio.run(_test_a_busy_actor_shows_what_it_waits_on())


async def _test_a_busy_actor_shows_what_it_waits_on():
    """The diagnosis data (what the handler waits on, the messages queued behind it) shows
    on the actor's tree line and in its detail pane; an idle actor shows none."""
    src = FakeSource()
    src.health.update("trainers", 1, waits="a call Model.fetch to trainers rank 1", queued=3)
    app = make_app(src)
    async with app.run_test(size=(160, 40)) as pilot:
        await settle(pilot)
        labels = tree_labels(app)
        line = next(ln for ln in labels if "trainers[1]" in ln)
        assert "train_step  waits on a call Model.fetch to trainers rank 1" in line, line
        assert not any("waits on" in ln for ln in labels if "trainers[0]" in ln)
        await select(pilot, ("actor", "trainers", 1))
        detail = str(app.query_one("#detail", Static).render())
        assert "waits on a call Model.fetch to trainers rank 1" in detail, detail
        assert "3 message(s) queued behind it" in detail, detail
        await select(pilot, ("actor", "trainers", 0))
        assert "waits on" not in str(app.query_one("#detail", Static).render())


def test_stack_on_demand():
    asyncio.run(_test_stack_on_demand())


async def _test_stack_on_demand():
    src = FakeSource()
    app = make_app(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("s")  # nothing selected yet: a warning, no request
        await settle(pilot)
        await select(pilot, ("proc", "trainers-2"))
        await pilot.press("s")
        await settle(pilot)
        stack = app.query_one("#stack", Log)
        assert stack.has_class("shown")
        assert "in train_step" in "\n".join(stack.lines)
        assert stack.lines[-1] == "  # trainers-2"


class SpySource(FakeSource):
    """A source offering py-spy stacks (AdminClient.py_spy_stack); one proc cannot be read."""

    def py_spy_stack(self, proc_id: str, native: bool = False, timeout: float = 10.0) -> str:
        with self.lock:
            self.calls.append(("py_spy_stack", f"{proc_id} native={native}"))
        if proc_id == "trainers-3":
            return f"== trainers rank 3 (pid 5003, host1), py-spy\n!! py-spy not found; looked at /x"
        return (f"== {proc_id}, py-spy\nGIL held by thread 'actor-t-2'\n"
                f"Thread 7 'actor-t-2' (holds the GIL, active)\n    spin [native, libx.so]")


def test_stack_view_takes_py_spy_stacks_and_falls_back_with_the_reason():
    src = SpySource()
    assert "GIL held by thread" in stack_text(src, "trainers-2")
    text = stack_text(src, "trainers-3")
    assert "py-spy not found; looked at /x" in text and "in train_step" in text
    assert "in train_step" in stack_text(FakeSource(), "trainers-1")  # no py-spy offered
    asyncio.run(_test_native_stack_key(src))


async def _test_native_stack_key(src):
    app = make_app(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await select(pilot, ("proc", "trainers-2"))
        await pilot.press("S")
        await settle(pilot)
        assert "spin [native, libx.so]" in "\n".join(app.query_one("#stack", Log).lines)
        assert ("py_spy_stack", "trainers-2 native=True") in src.calls


def test_stop_proc_needs_confirmation_and_shows_failure():
    asyncio.run(_test_stop_proc_needs_confirmation_and_shows_failure())


async def _test_stop_proc_needs_confirmation_and_shows_failure():
    src = FakeSource()
    app = make_app(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await select(pilot, ("actor", "trainers", 2))
        await pilot.press("k")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")  # declined: nothing happens
        await settle(pilot)
        assert src.calls == []
        await pilot.press("k")
        await pilot.pause()
        await pilot.click("#yes")
        await settle(pilot)
        assert src.calls == [("kill_proc", "trainers-2")]
        assert any("trainers[2] \u25cf failed" in ln for ln in tree_labels(app))
        detail = str(app.query_one("#detail", Static).render())
        assert "last error: proc trainers-2 died (SIGKILL)" in detail
        assert "1 failed" in app.sub_title


def test_stop_mesh_with_confirmation():
    asyncio.run(_test_stop_mesh_with_confirmation())


async def _test_stop_mesh_with_confirmation():
    src = FakeSource()
    app = make_app(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await select(pilot, ("host", "host1"))
        await pilot.press("x")  # a host is not a mesh: refused with a notice
        await settle(pilot)
        assert not isinstance(app.screen, ConfirmScreen)
        await select(pilot, ("actor", "trainers", 0))
        await pilot.press("x")
        await pilot.pause()
        assert "Stop mesh trainers?" in str(app.screen.query_one("#question").render())
        await pilot.press("y")
        await settle(pilot)
        assert src.calls == [("stop_mesh", "trainers")]
        assert sum("\u25cf stopped" in ln for ln in tree_labels(app)) == 4


def test_disconnected_source_is_reported():
    asyncio.run(_test_disconnected_source_is_reported())


async def _test_disconnected_source_is_reported():
    class Gone(FakeSource):
        def snapshot(self):
            raise ConnectionError("controller went away")

    app = make_app(Gone())
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        assert "controller went away" in app.sub_title


# -- snapshot tests (pytest-textual-snapshot; SVGs under tests/__snapshots__) ----------------
# The SVGs were recorded with the lock's textual (requirements/lock.txt); textual 6.0 and later
# (checked to 8.2.8) draw these screens identically, older releases lay them out differently.
# The app itself works from pyproject's lower bound (textual 3.0; the pilot tests above run
# there), so with an older textual only the pixel comparison is skipped, naming the version. A
# newer textual that draws differently fails them: re-record with --snapshot-update if intended.
same_rendering = pytest.mark.skipif(
    int(re.match(r"\d+", version("textual")).group()) < 6,
    reason=f"snapshots are drawn as textual >= 6.0 draws them; textual {version('textual')} "
           "lays the screen out differently")


@same_rendering
def test_snapshot_overview(snap_compare):
    app = make_app(FakeSource())

    async def run_before(pilot):
        await settle(pilot)
        await select(pilot, ("actor", "trainers", 1))

    assert snap_compare(app, terminal_size=(120, 36), run_before=run_before)


@same_rendering
def test_snapshot_failed_actor_and_stack(snap_compare):
    src = FakeSource()
    src.kill_proc("trainers-3")
    src.calls.clear()
    app = make_app(src)

    async def run_before(pilot):
        await settle(pilot)
        await select(pilot, ("actor", "trainers", 3))
        await pilot.press("s")
        await settle(pilot)

    assert snap_compare(app, terminal_size=(120, 36), run_before=run_before)


@same_rendering
def test_snapshot_confirm(snap_compare):
    app = make_app(FakeSource())

    async def run_before(pilot):
        await settle(pilot)
        await select(pilot, ("actor", "trainers", 0))
        await pilot.press("x")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(120, 36), run_before=run_before)
