"""The no-stdin policy under nbclient (execute requests with allow_stdin=False), and the
debugging notebook executed headless with the 'continue' policy, as CI runs it."""

import os

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from kernel_debug.driver import KERNEL_NAME, ROOT, kernelspec_dir

pytestmark = pytest.mark.timeout(180)

NOTEBOOK = os.path.join(ROOT, "notebooks", "debugging.ipynb")


def _text(cell) -> str:
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append(o["text"])
        elif "data" in o:
            out.append(o["data"].get("text/plain", ""))
        elif o.get("output_type") == "error":
            out.append(f"{o['ename']}: {o['evalue']}")
    return "".join(out)


def _run(nb, policy: str) -> NotebookClient:
    kernelspec_dir()
    env = {**os.environ, "MONARCH_DEBUG_POLICY": policy,
           "PYTHONPATH": os.pathsep.join(p for p in [ROOT, os.environ.get("PYTHONPATH")] if p)}
    client = NotebookClient(nb, kernel_name=KERNEL_NAME, timeout=120,
                            resources={"metadata": {"path": ROOT}})
    client.execute(env=env)
    return client


def test_default_policy_fails_the_call_naming_the_breakpoint():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import runtime\n"
        "from runtime import Actor, endpoint, this_host\n"
        "class A(Actor):\n"
        "    @endpoint\n"
        "    def f(self, x):\n"
        "        breakpoint()\n"
        "        return x\n"
        "m = this_host().spawn_procs(per_host={'procs': 1}).spawn('headless', A)\n"),
        nbformat.v4.new_code_cell("try:\n    m.f.call_one(1).get()\nfinally:\n"
                                  "    runtime.shutdown()")]
    with pytest.raises(CellExecutionError) as e:
        _run(nb, "fail")
    msg = str(e.value)
    assert "BreakpointWithoutDebugger" in msg
    assert "breakpoint at" in msg and ".py:7 in mesh 'headless' rank 0" in msg
    assert "no stdin" in msg and "MONARCH_DEBUG_POLICY=continue" in msg


def test_debugging_notebook_runs_headless_with_continue_policy():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    _run(nb, "continue")
    code = [c for c in nb.cells if c.cell_type == "code"]
    texts = [_text(c) for c in code]
    assert "debug policy: continue" in texts[0]
    assert texts[2].strip().endswith("9.5")  # one.step: continued past the breakpoint
    assert "policy 'continue': the actor continues" in texts[2]
    assert "{procs=0}: 9.025, {procs=1}: 9.4" in texts[3]
    assert texts[3].index("rank 0 (procs=0)") < texts[3].index("rank 1 (procs=1)")
    assert "trainers rank 0 (procs=0) step() [breakpoint, paused]" in texts[4]
    assert "paused at" in texts[4] and "%mesh debug" in texts[4]  # the note
    assert texts[5].strip().endswith("8.574")
    assert "bad input 7" in texts[6]
    assert "--- post-mortem: mesh 'trainers' rank 0" in texts[7]
    assert "post-mortem of trainers rank 0 needs stdin" in texts[7]
