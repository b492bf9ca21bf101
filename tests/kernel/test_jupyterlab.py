"""The quickstart in real JupyterLab (loopback, token) with a headless Chromium: the
notebook opens on the Monarch kernel and every cell runs with the expected outputs."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from _kernel_helpers import ROOT, install_kernelspec, kill_all, snapshot
from monarch_kernel.run_notebook import cell_text

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(CHROMIUM is None, reason="needs a system chromium (scripts/setup.sh "
                                                "installs it)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on 127.0.0.1 serving a copy of notebooks/; yields its base URL."""
    data = install_kernelspec()
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(os.path.join(ROOT, "notebooks", "quickstart.ipynb"), work)
    home = tmp_path / "jupyter"
    env = dict(os.environ, JUPYTER_PATH=data, JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"))
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyterlab", "--ip=127.0.0.1", f"--port={port}",
           "--no-browser", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={work}", "--LabApp.expose_app_in_browser=True"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    procs: dict[int, float] = snapshot([server.pid])
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=1)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start: "
                                       + (tmp_path / "server.log").read_text()[-2000:])
                time.sleep(0.3)
        yield base, token, procs
    finally:
        try:
            procs.update(snapshot(c.pid for c in psutil.Process(server.pid).children(
                recursive=True)))
        except psutil.Error:
            pass
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
        kill_all(procs)
        log.close()


def test_quickstart_runs_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright

    base, token, procs = lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(f"{base}/lab/tree/quickstart.ipynb?token={token}")
            page.wait_for_selector("text=Monarch (Python 3)", timeout=90000)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                                   timeout=90000)
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
            # Read the notebook model (not the DOM: Lab renders only cells in view).
            model = "() => window.jupyterapp.shell.currentWidget.context.model.toJSON()"
            # every cell ran, and the kernel is idle again: the last cell's outputs (which
            # precede its idle status on the same channel) are in
            page.wait_for_function(
                f"() => ({model})().cells.filter(c => c.cell_type === 'code')"
                ".every(c => c.execution_count !== null) && document.querySelector("
                "'.jp-Notebook-ExecutionIndicator')?.dataset.status === 'idle'", timeout=120000)
            nb = page.evaluate(model)
        finally:
            browser.close()
    cells = [("".join(c["source"]).strip(), cell_text(c)) for c in nb["cells"]
             if c["cell_type"] == "code"]
    by_source = dict(cells)

    def out(start: str) -> str:
        hits = [o for s, o in by_source.items() if s.startswith(start)]
        assert hits, f"no cell starting {start!r} in {list(by_source)}"
        return hits[0]

    assert len(cells) == 21
    assert "4/4 procs up" in out("%mesh alloc trainers")
    assert "[counters 0] value is now 15" in out("counters.incr.call(5)")
    assert "[counters 1] value is now 15" in out("counters.incr.call(5)")
    assert "[trainers 0] hello from pid" in out("%%mesh trainers\nimport os")
    assert "MeshCellError: 2 of 4 ranks failed on trainers" in out("%%mesh trainers\nif rank")
    assert "timeline of trainers: 4 lanes" in out("%mesh timeline trainers")  # and its SVG:
    drawn = [c for c in nb["cells"] if "".join(c["source"]).startswith("%mesh timeline")][0]
    assert any(o.get("data", {}).get("text/html", "").count('class="mt-lane"') == 4
               for o in drawn["outputs"]), drawn["outputs"]
    assert "failed: ['divide']" in out("import json, os")  # its trace file is JSON
    assert "stopped 1 mesh: trainers" in out("%mesh stop trainers")
    assert "(no meshes)" in cells[-1][1]
    status = [c for c in nb["cells"] if "".join(c["source"]).strip() == "%mesh status"][0]
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {})
               for o in status["outputs"]), status["outputs"]  # the live dashboard widget
    errors = [s for s, o in cells if "Traceback" in o and not s.startswith("%%mesh trainers\nif")]
    assert not errors, errors
