"""Tab in a %%mesh cell in real JupyterLab (loopback, token, Debian's chromium driven by
Playwright): the completer lists names that exist only on the procs, not the notebook's,
and Shift-Tab shows the remote object's tooltip."""

from __future__ import annotations

import pytest

from labserver import CHROMIUM, CHROMIUM_ARGS, monarch_lab

pytestmark = pytest.mark.timeout(180)

CELLS = [
    "%mesh alloc procs --per-host procs=2 --no-progress",
    "%%mesh procs\nremote_only = 1\nremote_other = 'two'",
    "remote_local = 3",
    "%%mesh procs\ns = '😀é'; remote_o",  # not run: the browser completes in it
]
SOURCE_MODEL = "() => window.jupyterapp.shell.currentWidget.context.model.toJSON()"


@pytest.fixture
def lab(tmp_path):
    yield from monarch_lab(tmp_path, "complete.ipynb", CELLS)


def test_tab_in_a_mesh_cell_lists_the_procs_names(lab):
    from playwright.sync_api import sync_playwright

    lab.start_session("complete.ipynb", kernel="monarch")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            lab.open_notebook(page, "complete.ipynb")
            page.evaluate("() => { const nb = window.jupyterapp.shell.currentWidget.content;"
                          " nb.activeCellIndex = 3;"
                          " window.jupyterapp.commands.execute('notebook:run-all-above'); }")
            page.wait_for_function(
                f"() => ({SOURCE_MODEL})().cells.slice(0, 3)"
                ".every(c => c.execution_count !== null)", timeout=90_000)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                                   timeout=60_000)
            nb = page.evaluate(SOURCE_MODEL)
            errors = [o for c in nb["cells"][:3] for o in c["outputs"]
                      if o.get("output_type") == "error"]
            assert not errors, errors
            editor = page.locator(".jp-CodeCell").nth(3).locator(".cm-content")
            editor.click()
            page.keyboard.press("Control+End")
            page.keyboard.press("Tab")
            page.wait_for_selector(".jp-Completer-item", timeout=15_000)
            items = page.eval_on_selector_all(
                ".jp-Completer-item .jp-Completer-match", "els => els.map(e => e.textContent)")
            assert sorted(items) == ["remote_only", "remote_other"], items
            # Enter inserts the selected item in place: the cursor mapping survives the
            # emoji (2 UTF-16 units in the editor, one code point in the protocol).
            page.keyboard.press("Enter")
            page.wait_for_function(
                f"() => ({SOURCE_MODEL})().cells[3].source.includes('remote_o')"
                f" && !({SOURCE_MODEL})().cells[3].source.endsWith('remote_o')",
                timeout=10_000)
            source = page.evaluate(SOURCE_MODEL)["cells"][3]["source"]
            source = "".join(source) if isinstance(source, list) else source
            assert source in ("%%mesh procs\ns = '😀é'; remote_only",
                              "%%mesh procs\ns = '😀é'; remote_other"), source
            # Shift-Tab: the tooltip is the remote object's, from rank 0.
            page.keyboard.press("Shift+Tab")
            tip = page.wait_for_selector(".jp-Tooltip", timeout=15_000)
            page.wait_for_function("() => (document.querySelector('.jp-Tooltip')?.innerText"
                                   " || '').includes('[mesh procs rank 0]')", timeout=15_000)
            text = tip.inner_text()
            assert "[mesh procs rank 0]" in text, text
            assert ("int" if source.endswith("only") else "str") in text, text
        finally:
            browser.close()
