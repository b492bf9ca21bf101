"""In a real browser: JupyterLab's Debugger panel on remote actors. Chromium (Playwright)
opens a notebook with the Monarch kernel, runs the cell that defines an actor and spawns
it on 2 ranks, turns the debugger on, clicks the gutter on a line of the endpoint, runs the
call: the panel shows the paused rank `trainers[0] @ host` in the call stack and its
variables (an array summarised); Continue lets each rank go and the call's result appears
in the cell. A screenshot of the paused panel is saved under test-artifacts/."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from labserver import CHROMIUM, CHROMIUM_ARGS, REPO, monarch_lab  # noqa: E402

pytestmark = pytest.mark.timeout(240)

ARTIFACTS = REPO / "test-artifacts"
ACTOR_CELL = '''\
import numpy as np
from runtime import Actor, endpoint, current_rank, this_host


class Trainer(Actor):
    @endpoint
    def step(self, x):
        w = np.arange(6, dtype=np.float32).reshape(2, 3) * x
        loss = float(w.sum()) + current_rank().rank
        return loss


trainers = this_host().spawn_procs(per_host={"procs": 2}).spawn("trainers", Trainer)'''
BP_LINE = 9  # loss = ...
CELLS = [ACTOR_CELL, "sorted(trainers.step.call(2).get().values())"]


@pytest.fixture
def lab(tmp_path):
    yield from monarch_lab(tmp_path, "panel.ipynb", CELLS)


def _run_cell(page, index: int) -> None:
    page.locator(".jp-CodeCell").nth(index).locator(".cm-content").click()
    page.keyboard.press("Shift+Enter")


def test_gutter_breakpoint_pauses_a_remote_rank(lab):
    from playwright.sync_api import sync_playwright

    lab.start_session("panel.ipynb", kernel="monarch")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            lab.open_notebook(page, "panel.ipynb")
            try:
                _run_cell(page, 0)
                page.wait_for_function(
                    "() => { const c = document.querySelectorAll('.jp-CodeCell')[0];"
                    " return c.querySelector('.jp-InputPrompt').innerText.includes('[1]'); }",
                    timeout=60_000)
                page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                                       timeout=60_000)
                bug = page.locator(".jp-DebuggerBugButton").first
                bug.wait_for(timeout=30_000)
                bug.click()
                page.wait_for_selector(".jp-DebuggerCallstack", timeout=60_000)
                cell = page.locator(".jp-CodeCell").nth(0)
                gutter = cell.locator(".cm-gutter.cm-breakpoint-gutter")
                gutter.wait_for(timeout=30_000)
                line = cell.locator(".cm-line").nth(BP_LINE - 1)
                lb, gb = line.bounding_box(), gutter.bounding_box()
                page.mouse.click(gb["x"] + gb["width"] / 2, lb["y"] + lb["height"] / 2)
                page.get_by_text("Cell [1]").first.wait_for(timeout=30_000)  # the list
                _run_cell(page, 1)
                frame = page.locator(".jp-DebuggerCallstackFrame").filter(
                    has_text="trainers[")
                frame.first.wait_for(timeout=60_000)
                assert "step · trainers[" in frame.first.inner_text()
                variables = page.locator(".jp-DebuggerVariables-body").first
                page.wait_for_function(
                    "() => { const v = document.querySelector('.jp-DebuggerVariables-body');"
                    " return v && v.innerText.includes('ndarray'); }", timeout=60_000)
                text = " ".join(variables.inner_text().split())
                assert "x 2" in text and "w ndarray" in text, text
                variables.get_by_text("ndarray", exact=True).first.click()  # expand the array: its summary
                page.wait_for_function(
                    "() => document.querySelector('.jp-DebuggerVariables-body')"
                    ".innerText.includes('float32')", timeout=30_000)
                text = " ".join(variables.inner_text().split())
                assert "shape (2, 3)" in text and "values [0, 2, 4, 6, 8, 10]" in text, text
                page.screenshot(path=str(ARTIFACTS / "visual_debugging.png"))
                out = page.locator(".jp-CodeCell").nth(1).locator(
                    ".jp-OutputArea-executeResult")
                cont = page.locator("[title^='Continue']").first
                for _ in range(2):  # each rank in turn
                    page.wait_for_function(
                        "() => [...document.querySelectorAll('.jp-DebuggerCallstackFrame')]"
                        ".some(f => f.innerText.includes('trainers['))", timeout=60_000)
                    cont.click()
                    page.wait_for_timeout(500)
                out.wait_for(timeout=60_000)
                assert out.inner_text().strip().endswith("[30.0, 31.0]"), out.inner_text()
                page.screenshot(path=str(ARTIFACTS / "visual_debugging-done.png"))
            except Exception:
                page.screenshot(path=str(ARTIFACTS / "visual_debugging-failure.png"))
                raise
        finally:
            browser.close()
