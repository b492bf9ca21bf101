"""In a real browser: JupyterLab on loopback, chromium driven by Playwright. A cell waits
on a call whose actor hits breakpoint(); the pdb prompt appears as the cell's stdin box;
we type `p y`, `n`, `l`, `c` there and read pdb's answers in the cell's output; then
the stop button (kernel interrupt) at a prompt detaches and the call completes."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "browser"))
from labserver import CHROMIUM, CHROMIUM_ARGS, REPO, JupyterLab, write_notebook  # noqa: E402

pytestmark = pytest.mark.timeout(180)

ARTIFACTS = REPO / "test-artifacts"

CELLS = ['''\
from runtime import Actor, endpoint, this_host

class Stepper(Actor):
    @endpoint
    def work(self, x):
        y = x * 2
        breakpoint()
        z = y + 1
        return z

one = this_host().spawn_procs(per_host={"procs": 1}).spawn("one", Stepper)''',
         "one.work.call_one(20).get()",
         "one.work.call_one(1).get()"]


@pytest.fixture
def lab(tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no system chromium at {CHROMIUM}")
    pytest.importorskip("playwright.sync_api", reason="python playwright is not installed")
    write_notebook(tmp_path / "debugging.ipynb", CELLS)
    server = JupyterLab(tmp_path)
    old = os.environ.get("MONARCH_DEBUG_POLICY")
    os.environ["MONARCH_DEBUG_POLICY"] = "fail"
    try:
        server.start()
        yield server
    finally:
        server.stop()
        if old is None:
            os.environ.pop("MONARCH_DEBUG_POLICY", None)
        else:
            os.environ["MONARCH_DEBUG_POLICY"] = old


def test_pdb_prompt_in_a_jupyterlab_cell(lab):
    from playwright.sync_api import sync_playwright

    lab.start_session("debugging.ipynb")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            lab.open_notebook(page, "debugging.ipynb")
            page.evaluate("() => { window.jupyterapp.commands.execute("
                          "'notebook:run-all-cells'); }")
            cell = page.locator(".jp-CodeCell").nth(1)
            try:
                for i, line in enumerate(["p y", "n", "l", "c"]):
                    # wait for the (i+1)-th prompt: a new, empty stdin box
                    page.wait_for_function(
                        """([i]) => { const c = document.querySelectorAll('.jp-CodeCell')[1];
                            const boxes = [...c.querySelectorAll('input.jp-Stdin-input')]
                                .filter(b => !b.disabled && b.value === '');
                            return boxes.length > 0 &&
                                c.innerText.split('(Pdb one:0)').length - 1 === i + 1; }""",
                        arg=[i], timeout=60_000)
                    box = cell.locator("input.jp-Stdin-input").last
                    if i == 2:
                        page.screenshot(path=str(ARTIFACTS / "debugger.png"))
                    box.fill(line)
                    box.press("Enter")
                page.wait_for_function(
                    "() => document.querySelectorAll('.jp-CodeCell')[1]"
                    ".querySelector('.jp-OutputArea-executeResult') !== null",
                    timeout=30_000)
                text = cell.locator(".jp-OutputArea").inner_text()
                assert "--- breakpoint: mesh 'one' rank 0" in text, text
                assert re.search(r"\(Pdb one:0\)\s+p y\s+40\s", text), text
                assert "-> return z" in text, text
                assert "breakpoint()" in text and "z = y + 1" in text, text  # `l`: cell source
                assert "--- one rank 0 continued ---" in text, text
                result = cell.locator(".jp-OutputArea-executeResult").inner_text()
                assert result.strip().endswith("41"), result
                # Ctrl-C (the stop button: interrupt the kernel) at the prompt detaches
                third = page.locator(".jp-CodeCell").nth(2)
                third.locator("input.jp-Stdin-input").first.wait_for(timeout=60_000)
                page.evaluate("() => window.jupyterapp.commands.execute('notebook:interrupt-kernel')")
                third.locator(".jp-OutputArea-executeResult").wait_for(timeout=30_000)
                text = third.locator(".jp-OutputArea").inner_text()
                assert "--- detached from one rank 0: it continues ---" in text, text
                assert third.locator(".jp-OutputArea-executeResult").inner_text() \
                    .strip().endswith("3")
                page.screenshot(path=str(ARTIFACTS / "debugger-done.png"))
            except Exception:
                page.screenshot(path=str(ARTIFACTS / "debugger-failure.png"))
                raise
        finally:
            browser.close()
