"""End to end in a real browser: JupyterLab on loopback, Debian's chromium driven by
Playwright, the dashboard cell run against a real 4-proc mesh, one proc killed while a cell
is busy, the grid checked in the page's DOM, and a screenshot kept as a test artifact."""

from __future__ import annotations

import json
import os
import sys
import shutil
import time
from pathlib import Path

import pytest

from labserver import CHROMIUM, CHROMIUM_ARGS, REPO, JupyterLab, write_notebook

pytestmark = pytest.mark.timeout(150)

ARTIFACTS = REPO / "test-artifacts"

QUICKSTART = REPO / "notebooks" / "quickstart.ipynb"

# used when the quickstart notebook has no dashboard cell (yet)
SETUP = """\
import time
import monarch_widgets, runtime
from runtime import Actor, endpoint, this_host

class Trainer(Actor):
    @endpoint
    def step(self, seconds: float = 0.0) -> int:
        time.sleep(seconds)
        return runtime.current_rank().rank

procs = this_host().spawn_procs(per_host={"procs": 4}, name="trainers")
trainers = procs.spawn("trainers", Trainer)
trainers.step.call().get(timeout=60)"""

DASHBOARD = "monarch_widgets.dashboard()"

# kills rank 1 of the first 4-actor mesh, whichever notebook set it up, once the test has
# seen the mesh idle (the file {go} appears), and stays busy until the test is done ({done})
KILL = """\
import os, time, runtime
def _wait_file(path, seconds=120):
    end = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.02)
_wait_file({go!r})
_rt = runtime.get_runtime()
_mesh = next(m for m in _rt.health.snapshot() if len(m.actors) == 4)
_rt.kill_proc(_mesh.actors[1].proc_id)
print("killed rank 1 of", _mesh.name)
_wait_file({done!r})  # the cell stays busy: the dashboard must update meanwhile"""


def notebook_cells(go: str, done: str) -> tuple[list[str], str]:
    """The quickstart's cells up to its dashboard cell, else our own; plus where from."""
    if QUICKSTART.exists():
        nb = json.loads(QUICKSTART.read_text())
        # cells meant to fail are left out: run-all would stop there (their tag is not kept)
        code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"
                and "raises-exception" not in c.get("metadata", {}).get("tags", [])]
        for i, src in enumerate(code):
            if "dashboard(" in src or src.strip() == "%mesh status":
                return code[:i + 1] + [KILL.format(go=go, done=done)], "quickstart"
    return [SETUP, DASHBOARD, KILL.format(go=go, done=done)], "built-in"


def _cells(page, mesh: str) -> list[str]:
    return page.eval_on_selector_all(f".mw-mesh[data-mesh='{mesh}'] .mw-cell",
                                     "els => els.map(e => e.dataset.state || '')")


@pytest.fixture
def lab(tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no system chromium at {CHROMIUM} (apt-get install chromium)")
    pytest.importorskip("playwright.sync_api", reason="python playwright is not installed")
    cells, origin = notebook_cells(str(tmp_path / "go"), str(tmp_path / "done"))
    kernel = "python3"
    if origin == "quickstart":  # the quickstart's %mesh magics need the Monarch kernel
        sys.path.insert(0, str(REPO / "tests" / "kernel"))
        from _kernel_helpers import install_kernelspec

        install_kernelspec()
        kernel = "monarch"
    write_notebook(tmp_path / "dashboard.ipynb", cells, kernel=kernel)
    server = JupyterLab(tmp_path)
    server.kernel_name = kernel
    server.origin = origin  # where the cells came from: the quickstart or our own
    try:
        server.start()
        yield server
    finally:
        server.stop()


def _check_timeline_and_stacks(page, mesh: str) -> None:
    """The quickstart's `%mesh timeline` cell drew a lane per rank with the failed
    divide(0) calls marked; after the kill cell, the dashboard's timeline tab draws the live
    meshes and an actor's detail shows its proc's threads taken by py-spy."""
    svg = page.locator(".jp-OutputArea-output .mt-timeline").first
    svg.wait_for(timeout=30_000)
    lanes = svg.locator(".mt-lane")
    assert lanes.count() == 4, lanes.count()
    assert svg.locator(".mt-call").count() >= 4
    assert svg.locator(".mt-failed").count() >= 1 and svg.locator(".mt-fail-mark").count() >= 1
    svg.screenshot(path=str(ARTIFACTS / "timeline.png"))
    page.wait_for_function(  # the kill cell ended: the kernel takes the widget's messages
        """() => { const p = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
                   return p.length && !p[p.length - 1].textContent.includes('*'); }""",
        timeout=60_000)
    page.click(".mw-timeline-tab > summary")
    page.wait_for_selector(".mw-timeline-body .mt-timeline .mt-lane", timeout=30_000)
    page.click(f".mw-cell[data-mesh='{mesh}'][data-rank='0']")
    page.click(".mw-detail .mw-stacks-btn")
    page.wait_for_selector(".mw-detail .mw-stacks", timeout=30_000)
    text = page.inner_text(".mw-detail .mw-stacks")
    if "py-spy not found" not in text:
        assert "Thread" in text and "actor-" in text, text


def test_dashboard_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright

    lab.start_session("dashboard.ipynb", kernel=getattr(lab, "kernel_name", "python3"))
    origin = lab.origin
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            lab.open_notebook(page, "dashboard.ipynb")
            page.evaluate("() => { window.jupyterapp.commands.execute("
                          "'notebook:run-all-cells'); }")
            try:
                # a mesh of four actors appears, all idle, before the kill
                mesh = page.wait_for_function(
                    """() => { for (const m of document.querySelectorAll('.mw-mesh')) {
                        const c = [...m.querySelectorAll('.mw-cell')];
                        if (c.length === 4 && c.every(e => e.dataset.state === 'idle'))
                          return m.dataset.mesh; } return null; }""",
                    timeout=90_000).json_value()
                # only the user's meshes: not the %%mesh cells' runner and completer
                # (internal meshes on the same procs), nor their actor classes
                shown = page.eval_on_selector_all(".mw-mesh", "els => els.map(e => e.dataset.mesh)")
                assert shown and not [m for m in shown if "." in m or "cell" in m], shown
                text = page.inner_text(".mw-root")
                assert "CellRunner" not in text and "CellCompleter" not in text, text
                (lab.root / "go").touch()  # seen idle: now the kill cell kills
                cell = f".mw-cell[data-mesh='{mesh}']"
                # the kill cell runs: rank 1 turns failed while that cell is still busy
                page.wait_for_selector(f"{cell}[data-rank='1'][data-state='failed']",
                                       timeout=30_000)
                prompts = page.eval_on_selector_all(
                    ".jp-CodeCell .jp-InputPrompt", "els => els.map(e => e.textContent)")
                assert prompts[-1].strip() == "[*]:", prompts
                states = _cells(page, mesh)
                assert states[1] == "failed" and states.count("failed") == 1, states
                failed_rows = page.eval_on_selector_all(
                    ".mw-proc-table tr[data-state='failed']", "els => els.map(e => e.dataset.proc)")
                assert len(failed_rows) == 1, failed_rows  # the proc table marks the killed proc
                page.hover(f"{cell}[data-rank='1']")
                detail = page.inner_text(".mw-detail")
                assert f"{mesh}[1]" in detail and "failed" in detail, detail
                time.sleep(0.3)
                page.screenshot(path=str(ARTIFACTS / "dashboard.png"))
                page.locator(".mw-root").screenshot(path=str(ARTIFACTS / "dashboard-widget.png"))
                if origin == "quickstart":
                    (lab.root / "done").touch()  # the kill cell ends: the kernel is free
                    _check_timeline_and_stacks(page, mesh)
            except Exception:
                page.screenshot(path=str(ARTIFACTS / "dashboard-failure.png"))
                raise
        finally:
            (lab.root / "done").touch()  # the kill cell may end
            browser.close()
    if os.environ.get("MONARCH_UPDATE_DOCS_SCREENSHOT") == "1":
        shutil.copy(ARTIFACTS / "dashboard.png", REPO / "docs" / "dashboard.png")
