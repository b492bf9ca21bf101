"""The example notebooks execute headless with the Monarch kernel (nbclient), and their
outputs say what the notebooks claim; the headless runner reports failures by exit code."""

from __future__ import annotations

import io
import os
import re

import nbformat
import pytest

from _kernel_helpers import ROOT, install_kernelspec
from monarch_kernel.run_notebook import cell_text, run_notebook

NOTEBOOKS = os.path.join(ROOT, "notebooks")


def execute(name: str, tmp_path, timeout: float = 120, edit=None) -> tuple[int, str, list]:
    """Run a notebook (after `edit(nb)` if given, from a copy next to the original);
    returns (status, printed text, executed code cells)."""
    install_kernelspec()
    out = io.StringIO()
    saved = str(tmp_path / name)
    path = os.path.join(NOTEBOOKS, name)
    if edit is not None:
        nb = nbformat.read(path, as_version=4)
        edit(nb)
        path = str(tmp_path / f"edited-{name}")
        nbformat.write(nb, path)
    status = run_notebook(path, timeout=timeout, save=saved, out=out, cwd=NOTEBOOKS)
    nb = nbformat.read(saved, as_version=4)
    return status, out.getvalue(), [c for c in nb.cells if c.cell_type == "code"]


def output_of(cells: list, source_start: str) -> str:
    matches = [c for c in cells if "".join(c.source).startswith(source_start)]
    assert matches, f"no cell starts with {source_start!r}"
    return cell_text(matches[0])


@pytest.mark.timeout(180)
def test_quickstart(tmp_path):
    status, printed, cells = execute("quickstart.ipynb", tmp_path)
    assert status == 0, printed
    assert "all cells ran" in printed
    assert "4/4 procs up" in output_of(cells, "%mesh alloc trainers")
    text = output_of(cells, "counters.incr.call(5)")
    assert "[counters 0] value is now 15" in text and "[counters 1] value is now 15" in text
    assert "{procs=0}: 15, {procs=1}: 15" in text
    text = output_of(cells, "%%mesh trainers\nimport os")
    assert "[trainers 0] hello from pid" in text and "[trainers 1] hello from pid" in text
    assert "{procs=1}: {'rank': 1, 'square': 1}" in text
    assert output_of(cells, "answer.item()").strip() == "100"
    # The first rank to fail answers the call (either may be first).
    assert re.search(r"caught: ZeroDivisionError from rank [0-3]\n", output_of(cells, "try:"))
    err = output_of(cells, "%%mesh trainers\nif rank == 0")
    assert "2 of 4 ranks failed on trainers" in err
    assert "ValueError: rank 0 does not like this input" in err
    assert "ZeroDivisionError: division by zero" in err
    drawn = [c for c in cells if "".join(c.source).startswith("%mesh timeline trainers")][0]
    html = "".join(o.get("data", {}).get("text/html", "") for o in drawn.outputs)
    assert html.count('class="mt-lane"') == 4, html[:500]  # a lane per rank
    assert 'class="mt-call mt-failed"' in html and "mt-fail-mark" in html  # divide(0)
    text = cell_text(drawn)
    assert "timeline of trainers: 4 lanes" in text and "Chrome trace written to" in text
    assert re.search(r"rank 3: \d+ calls .*[1-9]\d* failed", text), text
    traced = output_of(cells, "import json, os")  # the trace file loads as JSON
    assert re.search(r"[1-9]\d* calls and spans, [1-9]\d* failed: \[.*'divide'", traced), traced
    listed = output_of(cells, "%mesh list")
    assert "counters  counters  actors (Counter)" in listed
    status = output_of(cells, "%mesh status --text")
    assert "mesh counters [procs=4] on trainers: idle" in status
    # the %%mesh cells' runner and completer are internal: neither view shows them
    assert [ln for ln in status.splitlines() if ln.startswith("mesh ")] == [
        "mesh counters [procs=4] on trainers: idle (4 idle)"], status
    assert "CellRunner" not in listed and "CellCompleter" not in listed, listed
    assert output_of(cells, "%mesh stop trainers").strip() == "stopped 1 mesh: trainers"
    assert cells[-1].outputs and "(no meshes)" in cell_text(cells[-1])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 4])
def test_ddp(tmp_path, world):
    def set_world(nb):
        nb.cells[1].source = nb.cells[1].source.replace("WORLD_SIZE = 2",
                                                        f"WORLD_SIZE = {world}")

    status, printed, cells = execute("ddp.ipynb", tmp_path, timeout=180,
                                     edit=set_world if world != 2 else None)
    assert status == 0, printed
    setup = output_of(cells, "%mesh spawn ddp_procs DDPActor")
    for r in range(world):
        assert f"[ddp {r}] joined the process group as rank {r} of {world}" in setup
    losses = output_of(cells, "losses = ")
    steps = re.findall(r"step (\d+): " + "  ".join([r"rank \d: ([\d.]+)"] * world), losses)
    assert len(steps) == 10, losses
    assert "weights in sync across ranks: True" in output_of(cells, "checksums = ")
    assert f"({world - 1}, {world}, 'gloo')" in output_of(cells, "%%mesh ddp_procs")
    m = re.search(r"first step ([\d.]+), last step ([\d.]+)", output_of(cells, "first = "))
    assert m and float(m.group(2)) < float(m.group(1))  # it learned


@pytest.mark.timeout(180)
def test_fault_handling(tmp_path):
    status, printed, cells = execute("fault_handling.ipynb", tmp_path)
    assert status == 0, printed
    assert re.search(r"ValueError on rank [01]", output_of(cells, "try:\n    w.parse"))
    folded = output_of(cells, "%%mesh workers\nsettings = ")
    assert "2 of 2 ranks failed on workers: KeyError" in folded
    assert folded.count("KeyError: 'batch_size'") == 1 and "--- ranks 0-1 ---" in folded
    kept = [cell_text(c) for c in cells if "".join(c.source) == "%%mesh workers\nsettings"]
    assert kept and "{procs=0}: {'lr': 0.1}, {procs=1}: {'lr': 0.1}" in kept[0]
    assert "not yet: Worker.slow.call not resolved within 0.1 s" in output_of(cells, "fut = ")
    crash = output_of(cells, "try:\n    w.slice(procs=1).crash")
    assert "SupervisionError: MeshFailure: mesh 'w' rank(s) [1] failed: process exited " \
           "with code 3" in crash
    status_table = output_of(cells, "%mesh status w")  # monarch_widgets' text rendering
    assert "mesh w [procs=2] on workers: failed" in status_table, status_table
    assert re.search(r"rank 1 failed for [\d.]+s: process exited with code 3", status_table)
    after = output_of(cells, "print(w.slice(procs=0)")
    assert "9" in after.splitlines() and "the whole mesh: SupervisionError" in after
    assert "{procs=0}: 16, {procs=1}: 16" in output_of(cells, "w.square.call(4)")
    recovered = output_of(cells, "victim = trainer")
    assert "restarts: 1" in recovered and "new workers: True" in recovered, recovered
    assert "supervisor: mesh 'steps' rank(s) [1] failed: process killed by SIGKILL" in \
        "".join(cell_text(c) for c in cells), "the supervisor's output reaches the notebook"


@pytest.mark.timeout(120)
def test_runner_exits_non_zero_on_error_and_timeout(tmp_path):
    install_kernelspec()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('first')"),
                                         nbformat.v4.new_code_cell("1 / 0"),
                                         nbformat.v4.new_code_cell("print('never')")])
    path = str(tmp_path / "bad.ipynb")
    nbformat.write(nb, path)
    out = io.StringIO()
    assert run_notebook(path, out=out) == 1
    text = out.getvalue()
    assert "first" in text and "ZeroDivisionError" in text and "never" not in text
    assert "a cell failed (ZeroDivisionError)" in text
    nb.cells = [nbformat.v4.new_code_cell("import time; time.sleep(30)")]
    nbformat.write(nb, path)
    out = io.StringIO()
    assert run_notebook(path, timeout=2, out=out) == 1
    assert "timed out after 2 s" in out.getvalue()


@pytest.mark.timeout(240)
def test_distributed_tensors(tmp_path):
    status, printed, cells = execute("distributed_tensors.ipynb", tmp_path, timeout=180)
    assert status == 0, printed
    assert "is active" in output_of(cells, "%mesh activate procs")
    assert "runtime.Tensor(shape=(4,), dtype=torch.float32" in output_of(cells, "w = torch.rand")
    assert "shape error:" in output_of(cells, "try:\n    w @")
    text = output_of(cells, "print(runtime.inspect(y))")
    assert "procs [procs=2] (4,) torch.float32" in text and "tensor([" in text
    text = output_of(cells, "bad = w[")
    assert "caught: aten::index.Tensor failed on rank 0: IndexError" in text
    assert "still fine: torch.Size([4])" in text
    text = output_of(cells, "x = torch.randn")
    assert "every rank learned: True" in text, text
    assert output_of(cells, "%mesh deactivate").strip().endswith("Tensor")


@pytest.mark.timeout(300)
def test_tensor_parallel(tmp_path):
    """Reductions per dimension shown per rank, hand-written DDP with grad_generator that
    trains below 5% of its start loss, a two-stage pipeline with to_mesh, remote functions."""
    status, printed, cells = execute("tensor_parallel.ipynb", tmp_path, timeout=240)
    assert status == 0, printed
    text = output_of(cells, "def per_rank")
    assert "sum over dp           dp=0: [4.0, 6.0]   dp=1: [4.0, 6.0]" in text
    assert "sum over pp           dp=0: [3.0, 3.0]   dp=1: [7.0, 7.0]" in text
    assert "stack over pp         dp=0: [[1.0, 2.0], [1.0, 2.0]]" in text
    assert "no dimension 'tp'; its dimensions are {'dp': 2, 'pp': 2}" in output_of(cells, "try:")
    text = output_of(cells, "dp = procs.slice(pp=0)")
    assert "loss fell to" in text and "AssertionError" not in text
    assert "replicas in sync: True" in output_of(cells, "w0 = runtime.inspect")
    assert "pipeline loss: first" in output_of(cells, "stage0, stage1")
    text = output_of(cells, "@runtime.remote(propagate")
    assert "runtime.Tensor(shape=(3,)" in text and "ValueMesh({'dp': 2, 'pp': 2}" in text


@pytest.mark.timeout(240)
def test_visual_debugging(tmp_path):
    status, printed, cells = execute("visual_debugging.ipynb", tmp_path, timeout=180)
    assert status == 0, printed
    text = output_of(cells, "def inspect(rank):")
    for rank, grad, loss in ((0, 5, "9.5"), (1, 6, "9.4")):
        assert (f"trainers[{rank}] @ " in text and f"stopped at line 12, grad = ndarray(shape="
                f"(2, 2), dtype=float64) [{grad}, {grad}, {grad}, {grad}], lr = 0.1; after next: "
                f"line 13, self.loss = {loss}") in text, text
    assert "results: ValueMesh({'procs': 2}, {{procs=0}: 9.5, {procs=1}: 9.4})" in text
    assert "{procs=0}: 9.025, {procs=1}: 8.83" in output_of(cells, "panel.close()")


@pytest.mark.timeout(180)
def test_workspace_reload(tmp_path):
    status, printed, cells = execute("workspace_reload.ipynb", tmp_path)
    assert status == 0, printed
    assert "all cells ran" in printed
    synced = [cell_text(c) for c in cells if "".join(c.source).startswith("%mesh sync")]
    assert "sent 1 (" in synced[0] and "reloaded in 2 procs: trainer" in synced[1], synced
    # without --reload, the live procs import what the sync put on their host at once
    imported = output_of(cells, "%%mesh procs\n# the live procs import")
    assert len(re.findall(r"\(0\.1, 'workspace-agent-\w+/current/mylib/trainer\.py'\)",
                          imported)) == 2, imported
    assert "2 live procs import from it now" in synced[0], synced
    before = output_of(cells, 't = procs.spawn("t", trainer.Trainer)')
    assert "'lr': 0.1, 'steps': 1, 'weight': 0.9" in before, before
    after = output_of(cells, "# the same actors")
    assert "'lr': 0.5, 'steps': 2, 'weight': 0.4" in after, after
    assert "hello #1" in output_of(cells, "class Greeter(Actor):")
    assert "2 live actors now run Greeter" in output_of(cells, "%mesh reload g")
    assert "bonjour #2" in output_of(cells, "g.hello.call().get()")


@pytest.mark.timeout(180)
def test_why_stuck(tmp_path):
    status, printed, cells = execute("why_stuck.ipynb", tmp_path)
    assert status == 0, printed
    why = output_of(cells, "import time\ntime.sleep(1.5)\n%mesh why stuck")
    assert "greeter rank 0: running hello()" in why and "calls its own actor" in why, why
    assert "@concurrent_endpoint" in why
    assert "CancelledError" in output_of(cells, "%mesh cancel stuck")
    assert "hello world" in output_of(cells, "class Greeter2")
