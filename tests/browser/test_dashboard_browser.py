"""End to end in a real browser: JupyterLab on loopback, Debian's chromium driven by
Playwright, the dashboard cell run against a real 4-proc mesh, one proc killed while a cell
is busy, the grid checked in the page's DOM, and a screenshot kept as a test artifact."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from labserver import CHROMIUM, CHROMIUM_ARGS, REPO, JupyterLab, write_notebook

pytestmark = pytest.mark.timeout(150)

ARTIFACTS = REPO / "test-artifacts"

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

KILL = """\
time.sleep(3)
napping = trainers.slice(procs=2).step.call_one(20)
runtime.get_runtime().kill_proc(procs.procs[1].proc_id)
time.sleep(10)  # the cell stays busy: the dashboard must update meanwhile"""


def _cells(page, state: str | None = None) -> list[str]:
    sel = ".mw-mesh[data-mesh='trainers'] .mw-cell"
    return page.eval_on_selector_all(sel, "els => els.map(e => e.dataset.state || '')")


@pytest.fixture
def lab(tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no system chromium at {CHROMIUM} (apt-get install chromium)")
    pytest.importorskip("playwright.sync_api", reason="python playwright is not installed")
    write_notebook(tmp_path / "dashboard.ipynb", [SETUP, DASHBOARD, KILL])
    server = JupyterLab(tmp_path)
    try:
        server.start()
        yield server
    finally:
        server.stop()


def test_dashboard_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright

    lab.start_session("dashboard.ipynb")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            page.goto(f"{lab.url}/lab/tree/dashboard.ipynb?token={lab.token}")
            page.wait_for_function(
                "() => window.jupyterapp && document.querySelector('.jp-Notebook')",
                timeout=60_000)
            try:  # JupyterLab may still ask which kernel to use
                page.click(".jp-Dialog .jp-mod-accept", timeout=3_000)
            except Exception:
                pass
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                                   timeout=60_000)
            page.evaluate("() => { window.jupyterapp.commands.execute("
                          "'notebook:run-all-cells'); }")
            try:
                page.wait_for_function(
                    "() => document.querySelectorAll(\".mw-mesh[data-mesh='trainers'] "
                    ".mw-cell\").length === 4", timeout=60_000)
                # four live actors, none failed, before the kill
                page.wait_for_function(
                    "() => [...document.querySelectorAll(\".mw-mesh[data-mesh='trainers'] "
                    ".mw-cell\")].every(e => e.dataset.state === 'idle')", timeout=30_000)
                # the kill cell runs: rank 1 turns failed while that cell is still busy
                page.wait_for_selector(".mw-cell[data-mesh='trainers'][data-rank='1']"
                                       "[data-state='failed']", timeout=30_000)
                prompts = page.eval_on_selector_all(
                    ".jp-CodeCell .jp-InputPrompt", "els => els.map(e => e.textContent)")
                assert prompts[-1].strip() == "[*]:", prompts
                states = _cells(page)
                assert states[1] == "failed" and states.count("failed") == 1, states
                failed_rows = page.eval_on_selector_all(
                    ".mw-proc-table tr[data-state='failed']", "els => els.map(e => e.dataset.proc)")
                # the proc table marks the killed proc (ids are "<mesh>-<rank>-<hex>")
                assert len(failed_rows) == 1 and failed_rows[0].startswith("trainers-1-"), \
                    failed_rows
                page.wait_for_selector(".mw-cell[data-mesh='trainers'][data-rank='2']"
                                       "[data-state='busy']", timeout=10_000)
                page.hover(".mw-cell[data-mesh='trainers'][data-rank='1']")
                detail = page.inner_text(".mw-detail")
                assert "trainers[1]" in detail and "failed" in detail, detail
                time.sleep(0.3)
                page.screenshot(path=str(ARTIFACTS / "dashboard.png"))
                page.locator(".mw-root").screenshot(path=str(ARTIFACTS / "dashboard-widget.png"))
            except Exception:
                page.screenshot(path=str(ARTIFACTS / "dashboard-failure.png"))
                raise
        finally:
            browser.close()
    if os.environ.get("MONARCH_UPDATE_DOCS_SCREENSHOT") == "1":
        shutil.copy(ARTIFACTS / "dashboard.png", REPO / "docs" / "dashboard.png")
