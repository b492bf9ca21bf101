"""Drive a real IPython kernel with jupyter_client, answering its stdin input requests
from a script: what a person at a notebook's pdb prompt would type."""

from __future__ import annotations

import atexit
import json
import os
import queue
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Union

import psutil
from jupyter_client import KernelManager

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERNEL_NAME = "monarch-debug-test"
INTERRUPT = "^C"  # in a script: press Ctrl-C (interrupt the kernel) at this prompt

SETUP = """\
import runtime
from monarch_kernel import debugger
debugger.install(get_ipython())
"""


def kernel_module() -> str:
    """The Monarch kernel when this checkout has it, else plain ipykernel (the debugger
    needs neither: the runtime installs it; MONARCH_TEST_KERNEL=ipykernel|monarch forces)."""
    want = os.environ.get("MONARCH_TEST_KERNEL", "auto")
    has_monarch = os.path.exists(os.path.join(ROOT, "monarch_kernel", "__main__.py"))
    if want == "monarch" or (want == "auto" and has_monarch):
        return "monarch_kernel"
    return "ipykernel_launcher"


def kernelspec_dir() -> str:
    """A kernelspec (ipykernel with this checkout on PYTHONPATH) in a temp JUPYTER_PATH."""
    base = tempfile.mkdtemp(prefix="monarch-dbg-kspec-")
    atexit.register(shutil.rmtree, base, True)  # nothing of the tests stays in /tmp
    kdir = os.path.join(base, "kernels", KERNEL_NAME)
    os.makedirs(kdir)
    pypath = os.pathsep.join(p for p in [ROOT, os.environ.get("PYTHONPATH", "")] if p)
    spec = {"argv": [sys.executable, "-m", kernel_module(), "-f", "{connection_file}"],
            "display_name": "monarch debugger tests", "language": "python",
            "interrupt_mode": "signal", "env": {"PYTHONPATH": pypath}}
    with open(os.path.join(kdir, "kernel.json"), "w") as f:
        json.dump(spec, f)
    paths = [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
    os.environ["JUPYTER_PATH"] = os.pathsep.join([base] + paths)
    return base


@dataclass
class CellResult:
    stdout: str = ""
    stderr: str = ""
    prompts: list = field(default_factory=list)
    results: list = field(default_factory=list)  # text/plain of execute_result
    error: Optional[dict] = None  # ename, evalue, traceback
    status: str = ""
    transcript: str = ""  # stdout, stderr and the lines typed, in order

    @property
    def ok(self) -> bool:
        return self.status == "ok"


Answer = Union[str, Callable[[str], Optional[str]]]


class KernelSession:
    """One kernel; `run(code, inputs)` executes a cell, typing `inputs` at its prompts."""

    def __init__(self, env: Optional[dict] = None) -> None:
        kernelspec_dir()
        self.km = KernelManager(kernel_name=KERNEL_NAME)
        base = {**os.environ, "MONARCH_DEBUG_POLICY": "fail", "MONARCH_DEBUG_TIMEOUT": "600"}
        self.km.start_kernel(env={**base, **(env or {})}, cwd=ROOT)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.pid = self.km.provisioner.process.pid
        r = self.run(SETUP)
        assert r.ok, r

    def run(self, code: str, inputs: Iterable[Answer] = (), timeout: float = 90.0,
            allow_stdin: bool = True) -> CellResult:
        answers = list(inputs)
        kc = self.kc
        msg_id = kc.execute(code, allow_stdin=allow_stdin)
        res = CellResult()
        parts: list[str] = []
        deadline = time.monotonic() + timeout
        reply = None
        idle = False
        while not (reply is not None and idle):
            if time.monotonic() > deadline:
                raise TimeoutError(f"cell did not finish in {timeout} s; so far:\n"
                                   + "".join(parts))
            try:
                msg = kc.stdin_channel.get_msg(timeout=0.01)
            except queue.Empty:
                msg = None
            if msg is not None and msg["msg_type"] == "input_request":
                # the kernel flushed its output before asking: show it first
                while True:
                    try:
                        m = kc.get_iopub_msg(timeout=0.05)
                    except queue.Empty:
                        break
                    idle = self._on_iopub(m, msg_id, res, parts) or idle
                prompt = msg["content"]["prompt"]
                res.prompts.append(prompt)
                if not answers:
                    raise AssertionError(f"unexpected prompt {prompt!r}; output so far:\n"
                                         + "".join(parts))
                ans = answers.pop(0)
                if callable(ans):
                    ans = ans(prompt)
                if ans == INTERRUPT:
                    parts.append(f"{prompt}^C\n")
                    self.km.interrupt_kernel()
                else:
                    parts.append(f"{prompt}{ans}\n")
                    kc.input(ans)
            try:
                m = kc.get_iopub_msg(timeout=0.01)
            except queue.Empty:
                m = None
            if m is not None:
                idle = self._on_iopub(m, msg_id, res, parts) or idle
            if reply is None:
                try:
                    r = kc.get_shell_msg(timeout=0.01)
                except queue.Empty:
                    r = None
                if r is not None and r["parent_header"].get("msg_id") == msg_id:
                    reply = r
        res.status = reply["content"]["status"]
        res.transcript = "".join(parts)
        if answers:
            raise AssertionError(f"{len(answers)} scripted inputs unused: {answers}; "
                                 f"transcript:\n{res.transcript}")
        return res

    @staticmethod
    def _on_iopub(m: dict, msg_id: str, res: CellResult, parts: list) -> bool:
        """Record one iopub message; True when it says the cell went idle."""
        t, c = m["msg_type"], m["content"]
        mine = m["parent_header"].get("msg_id") == msg_id
        if t == "stream":
            parts.append(c["text"])
            if c["name"] == "stdout":
                res.stdout += c["text"]
            else:
                res.stderr += c["text"]
        elif t == "execute_result" and mine:
            res.results.append(c["data"].get("text/plain", ""))
            parts.append(c["data"].get("text/plain", "") + "\n")
        elif t == "error" and mine:
            res.error = c
            parts.append(f"{c['ename']}: {c['evalue']}\n")
        elif t == "status" and mine:
            return c["execution_state"] == "idle"
        return False

    def close(self) -> None:
        """Stop the meshes, then the kernel; kill by pid whatever it left."""
        try:
            kids = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            kids = []
        try:
            self.run("runtime.shutdown()", timeout=30)
        except Exception:
            pass
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)
        gone, alive = psutil.wait_procs(kids, timeout=5)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
