"""Helpers for browser tests: a JupyterLab server on loopback and Debian's chromium.

JupyterLab runs with a random token on 127.0.0.1 in a private directory and is stopped by
pid (with its kernels); chromium is the system one (/usr/bin/chromium), never downloaded.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Optional

import psutil

CHROMIUM = os.environ.get("MONARCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
REPO = Path(__file__).resolve().parents[2]


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the test process dies (Linux), so no server outlives it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_notebook(path: Path, cells: list[str], kernel: str = "python3") -> None:
    """A minimal nbformat-4 notebook of code cells."""
    nb = {"nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": kernel, "display_name": kernel,
                                      "language": "python"}},
          "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "source": src,
                     "outputs": [], "execution_count": None} for i, src in enumerate(cells)]}
    path.write_text(json.dumps(nb))


class JupyterLab:
    """`python -m jupyterlab` on 127.0.0.1 with a token, rooted at `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen] = None
        self.log = root / "jupyterlab.log"

    def start(self, timeout: float = 60.0) -> None:
        home = self.root / ".jupyter-home"
        for sub in ("config", "data", "runtime", "settings", "workspaces"):
            (home / sub).mkdir(parents=True, exist_ok=True)
        news = home / "settings" / "@jupyterlab" / "apputils-extension"
        news.mkdir(parents=True, exist_ok=True)
        (news / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        env = dict(os.environ)
        env.update({
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "JUPYTER_CONFIG_DIR": str(home / "config"),
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
            "MONARCH_RUNTIME_DIR": str(home / "monarch"),
        })
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
               f"--ServerApp.root_dir={self.root}", "--LabApp.expose_app_in_browser=True",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
               "--LabApp.extension_manager=readonly"]
        if os.geteuid() == 0:  # CI containers run as root
            cmd.append("--allow-root")
        self._logf = open(self.log, "wb")
        self.proc = subprocess.Popen(cmd, env=env, cwd=self.root, stdout=self._logf,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_die_with_parent)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyterlab exited: {self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/status?token={self.token}",
                                            timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"jupyterlab did not start in {timeout}s: "
                           f"{self.log.read_text()[-3000:]}")

    def api(self, path: str, method: str = "GET", body: object = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}?token={self.token}", method=method,
                                     data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def start_session(self, notebook: str, kernel: str = "python3") -> str:
        """Start the notebook's kernel through the REST API (no kernel dialog); its id."""
        r = self.api("/api/sessions", "POST", {"path": notebook, "type": "notebook",
                                               "name": notebook, "kernel": {"name": kernel}})
        return r["kernel"]["id"]

    def open_notebook(self, page: object, notebook: str) -> None:
        """Load `notebook` in a Playwright `page` and wait until its kernel is idle (the
        kernel was started with start_session; a kernel dialog, if any, is accepted)."""
        page.goto(f"{self.url}/lab/tree/{notebook}?token={self.token}")
        page.wait_for_function(
            "() => window.jupyterapp && document.querySelector('.jp-Notebook')",
            timeout=60_000)
        try:  # JupyterLab may still ask which kernel to use
            page.click(".jp-Dialog .jp-mod-accept", timeout=3_000)
        except Exception:
            pass
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                               timeout=60_000)

    def stop(self) -> None:
        """Shut kernels down, then stop the server and anything it left, by pid."""
        if self.proc is None:
            return
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            kids = []
        try:
            for k in self.api("/api/kernels"):
                self.api(f"/api/kernels/{k['id']}", method="DELETE")
        except (OSError, ValueError, TypeError):
            pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        for k in kids:
            try:
                k.wait(timeout=3)
            except psutil.TimeoutExpired:
                k.kill()
            except psutil.Error:
                pass
        self._logf.close()
        self.proc = None


def monarch_lab(tmp_path: Path, name: str, cells: list[str]):
    """Generator for a pytest fixture: JupyterLab serving notebook `name` (`cells`, the
    Monarch kernel); skips without Debian's chromium or Python's playwright."""
    import pytest

    if not Path(CHROMIUM).exists():
        pytest.skip(f"no system chromium at {CHROMIUM} (apt-get install chromium)")
    pytest.importorskip("playwright.sync_api", reason="python playwright is not installed")
    sys.path.insert(0, str(REPO / "tests" / "kernel"))
    from _kernel_helpers import install_kernelspec

    install_kernelspec()
    write_notebook(tmp_path / name, cells, kernel="monarch")
    server = JupyterLab(tmp_path)
    try:
        server.start()
        yield server
    finally:
        server.stop()
