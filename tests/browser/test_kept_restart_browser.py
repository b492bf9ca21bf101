"""The quickstart, kept, restarted in the middle, in a real browser (JupyterLab on loopback,
Debian's chromium driven by Playwright): the quickstart's cells with its alloc made kept
(`%mesh alloc trainers --job process ... --keep 10m`), its Counter actors spawned and their
state set; the kernel restarted through JupyterLab's own Kernel > Restart command and
dialog; then `%mesh attach-job` in the new kernel, and the same actors (same proc pids)
answer with the state the old kernel left, take a call, the new kernel's dashboard shows the
mesh kept with its lease and when it was reattached, and `%mesh stop` ends the job.

The job's agents run in their own session (a kept job outlives its kernel), so they are not
JupyterLab's children: the test records their pids and the procs' from the notebook's own
output and kills whatever is left of them, by pid, at the end."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from labserver import CHROMIUM, CHROMIUM_ARGS, REPO, monarch_lab  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "kernel"))
from _kernel_helpers import kill_all, snapshot, wait_gone  # noqa: E402

pytestmark = pytest.mark.timeout(300)

ARTIFACTS = REPO / "test-artifacts"
QUICKSTART = REPO / "notebooks" / "quickstart.ipynb"
KEPT_ALLOC = ("%mesh alloc trainers --job process --hosts 1 --per-host procs=2 --keep 10m "
              "--no-progress")
PIDS = ('import sys\npids = {"agents": sorted(trainers_job.agent_pids.values()), '
        '"procs": [p.pid for p in trainers.procs], "workdir": str(trainers_job.workdir)}\n'
        '_ = sys.stdout.write("PIDS " + json.dumps(pids) + "\\n")')  # one write (see AFTER)
ATTACH = "%mesh attach-job .monarch/jobs/trainers.pkl"
# one write, after the calls: a rank's forwarded output ("value is now 16") may otherwise
# land between the pieces print() writes, inside the line
AFTER = ('import json, sys\nafter = {"values": sorted(counters.get.call().get().values()), '
         '"procs": [p.pid for p in trainers.procs], '
         '"incr": counters.slice(procs=0).incr.call_one(1).get()}\n'
         '_ = sys.stdout.write("AFTER " + json.dumps(after) + "\\n")')
DASHBOARD = "import monarch_widgets\nmonarch_widgets.dashboard()"
STOP = "%mesh stop trainers"
MODEL = "() => window.jupyterapp.shell.currentWidget.context.model.toJSON()"


def quickstart_cells() -> list[str]:
    """The quickstart's cells up to its first state change (its Counter class, spawn and
    `incr` cells), the alloc made kept, a slice changed too, then a line printing the pids."""
    nb = json.loads(QUICKSTART.read_text())
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    actor = next(c for c in code if "class Counter(Actor)" in c)
    spawn = next(c for c in code if c.startswith("%mesh spawn trainers Counter"))
    incr = next(c for c in code if c.startswith("counters.incr.call("))
    return [KEPT_ALLOC, actor, spawn, incr,
            "import json\ncounters.slice(procs=1).incr.call_one(1000).get()\n" + PIDS]


@pytest.fixture
def lab(tmp_path, monkeypatch):
    # a restarted kernel whose runtime could not detach counts as gone after 2 x 2 s
    monkeypatch.setenv("MONARCH_HEARTBEAT_TIMEOUT", "2")
    cells = quickstart_cells() + [ATTACH, AFTER, DASHBOARD, STOP]
    yield from monarch_lab(tmp_path, "kept.ipynb", cells)


def _outputs(cell: dict) -> tuple[str, list[dict]]:
    """A cell's text (streams, results) and its error outputs."""
    text, errors = [], []
    for o in cell["outputs"]:
        if o.get("output_type") == "stream":
            t = o["text"]
            text.append("".join(t) if isinstance(t, list) else t)
        elif o.get("output_type") in ("execute_result", "display_data"):
            t = o.get("data", {}).get("text/plain", "")
            text.append("".join(t) if isinstance(t, list) else t)
        elif o.get("output_type") == "error":
            errors.append(o)
    return "".join(text), errors


def _run(page, first: int, last: int, *, command: str = "notebook:run-all-above",
         timeout: float = 120_000) -> list[dict]:
    """Run cells first..last (their execution counts cleared first) and wait for them."""
    page.evaluate(
        """([first, last, command]) => {
            const w = window.jupyterapp.shell.currentWidget, nb = w.content;
            for (let i = first; i <= last; i++) {
              const c = w.context.model.cells.get(i);
              c.executionCount = null; }
            nb.activeCellIndex = command === 'notebook:run-all-above' ? last + 1 : first;
            window.jupyterapp.commands.execute(command); }""",
        [first, last, command])
    page.wait_for_function(
        f"""() => {{ const c = ({MODEL})().cells.slice({first}, {last + 1});
            return c.every(x => x.execution_count !== null)
                   || c.some(x => x.outputs.some(o => o.output_type === 'error')); }}""",
        timeout=timeout)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                           timeout=60_000)
    return page.evaluate(MODEL)["cells"][first:last + 1]


def _marked(cells: list[dict], mark: str) -> dict:
    for c in cells:
        m = re.search(rf"^{mark} (.*)$", _outputs(c)[0], re.M)
        if m:
            return json.loads(m.group(1))
    raise AssertionError(f"no {mark} line in {[_outputs(c) for c in cells]}")


def test_the_quickstart_restarted_in_the_middle_ends_with_the_same_actors(lab, tmp_path):
    from playwright.sync_api import sync_playwright

    lab.start_session("kept.ipynb", kernel="monarch")
    ARTIFACTS.mkdir(exist_ok=True)
    left: dict[int, float] = {}
    workdir = None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            lab.open_notebook(page, "kept.ipynb")
            try:
                # the quickstart, kept: alloc, Counter, spawn, incr(5), slice incr(1000)
                before = _run(page, 0, 4)
                errors = [e for c in before for e in _outputs(c)[1]]
                assert not errors, errors
                assert "%mesh attach-job" in _outputs(before[0])[0], _outputs(before[0])
                seen = _marked(before, "PIDS")
                left.update(snapshot(seen["agents"] + seen["procs"]))
                workdir = Path(seen["workdir"])
                assert len(seen["procs"]) == 2 and len(left) == len(seen["agents"]) + 2

                # restart the kernel as a user does: Kernel > Restart Kernel..., Restart
                kernel_pid = _kernel_pid(lab)
                page.evaluate("() => { window.jupyterapp.commands.execute('kernelmenu:restart'); }")
                page.click(".jp-Dialog .jp-mod-accept", timeout=15_000)
                page.wait_for_function(
                    "() => !document.querySelector('.jp-Dialog')", timeout=15_000)
                assert wait_gone({kernel_pid: snapshot([kernel_pid]).get(kernel_pid, 0)},
                                 timeout=60) == [], "the old kernel ends"
                page.wait_for_selector(
                    ".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
                assert wait_gone(left, timeout=1) == sorted(left), "kept: all still alive"

                # a new kernel: attach-job (retried while the old one still counts as alive)
                for _ in range(30):
                    attach = _run(page, 5, 5, command="notebook:run-cell")[0]
                    text, errors = _outputs(attach)
                    if not errors:
                        break
                    assert "takeover" in json.dumps(errors), errors
                    page.wait_for_timeout(500)
                assert not errors, errors
                assert attach["execution_count"] == 1, "a fresh kernel ran it"
                assert "counters" in text and "trainers" in text, text

                after = _run(page, 6, 6, command="notebook:run-cell")
                assert not _outputs(after[0])[1], _outputs(after[0])
                got = _marked(after, "AFTER")
                assert got["procs"] == seen["procs"], (got, seen)  # the same processes
                assert got["values"] == [15, 1015], got  # the state the old kernel left
                assert got["incr"] == 16, got
                # the dashboard of the new kernel: the mesh is kept, with its lease, and
                # says when this kernel reattached it
                _run(page, 7, 7, command="notebook:run-cell")
                lease = page.wait_for_selector(
                    ".mw-mesh[data-mesh='counters'][data-keep='600'] .mw-lease",
                    timeout=30_000).inner_text()
                assert "kept: lease ends 10m00s after its controller goes away" in lease, lease
                assert "reattached at" in lease, lease
                page.screenshot(path=str(ARTIFACTS / "kept-restart.png"))

                stop = _run(page, 8, 8, command="notebook:run-cell")
                assert not _outputs(stop[0])[1], _outputs(stop[0])
                assert wait_gone(left, timeout=30) == [], "the stop ends agents and procs"
                assert not workdir.exists()
            except Exception:
                page.screenshot(path=str(ARTIFACTS / "kept-restart-failure.png"))
                raise
        finally:
            browser.close()
            kill_all(left)
            saved = tmp_path / ".monarch" / "jobs" / "trainers.pkl"
            if workdir is None and saved.exists():  # failed before the PIDS line was read
                from runtime.job import Job

                workdir = Path(Job.load(saved).workdir)
                kill_all(_agents_of(workdir))
            if workdir is not None and workdir.exists():
                import shutil

                shutil.rmtree(workdir, ignore_errors=True)


def _kernel_pid(lab) -> int:
    """The pid of the notebook's kernel: the server's one kernel child process."""
    import psutil

    kids = [k for k in psutil.Process(lab.proc.pid).children()
            if "ipykernel" in " ".join(k.cmdline()) or "monarch_kernel" in " ".join(k.cmdline())]
    assert len(kids) == 1, [k.cmdline() for k in psutil.Process(lab.proc.pid).children()]
    return kids[0].pid


def _agents_of(workdir: Path) -> dict[int, float]:
    """The host agents of the kept job in `workdir` still running (a failed run's leftovers),
    by pid with their start times, for kill_all."""
    import psutil

    pids = [p.pid for p in psutil.process_iter(["cmdline"])
            if "runtime.host" in " ".join(p.info["cmdline"] or [])
            and str(workdir) in " ".join(p.info["cmdline"] or [])]
    return snapshot(pids)

