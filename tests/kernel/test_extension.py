"""`%load_ext monarch_kernel` in a plain IPython shell (in this process): the magics work
with real procs, remote output is routed with prefixes, and bad input is a UsageError."""

from __future__ import annotations


import pytest
from IPython.core.error import UsageError
from _kernel_helpers import ipython_with_extension
from IPython.utils.capture import capture_output

import runtime
import torch
from _util import wait_until

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def ip():
    with ipython_with_extension() as shell:
        shell.run_line_magic("load_ext", "monarch_kernel")  # loading twice is harmless
        yield shell


def test_help_is_printed_not_raised(ip):
    with capture_output() as cap:
        assert ip.run_line_magic("mesh", "alloc --help") is None
    assert cap.stdout.startswith("usage: %mesh alloc")


def test_alloc_on_a_host_mesh_variable_and_run_cells(ip):
    ip.user_ns["h"] = runtime.this_host()
    with capture_output() as cap:
        ip.run_line_magic("mesh", "alloc ext --hosts h --per-host procs=2 --no-progress")
    assert cap.stdout == ""  # --no-progress
    assert isinstance(ip.user_ns["ext"], runtime.ProcMesh)
    assert ip.user_ns["ext"].sizes == {"procs": 2}
    with capture_output() as cap:
        vm = ip.run_cell_magic("mesh", "ext", "x = {'r': current_rank().rank}\n"
                                              "print('line one')\nprint('tail', end='')\nx")
    assert isinstance(vm, runtime.ValueMesh)
    assert list(vm.values()) == [{"r": 0}, {"r": 1}]
    lines = cap.stdout.splitlines()
    assert "[ext 0] line one" in lines and "[ext 1] line one" in lines
    assert "[ext 0] tail" in lines and "[ext 1] tail" in lines  # partial lines flushed
    assert "mk-end" not in cap.stdout and "mk-end" not in cap.stderr
    # `{x}` is the remote set display of the remote dict... not expanded by the controller.
    ip.user_ns["x"] = "controller"
    vm = ip.run_cell_magic("mesh", "ext --ranks procs=0", "len({x['r']})")
    assert vm.item() == 1


def test_line_magics_expand_variables_cell_magic_does_not(ip):
    ip.user_ns["which"] = "ext"
    table = ip.run_line_magic("mesh", "status {which}")  # expanded like any line magic
    assert "ext" in repr(table)
    with pytest.raises(UsageError, match="not a valid Python identifier"):
        ip.run_cell_magic("mesh", "{which}", "1")


def test_cell_timeout_interrupts_the_remote_cell(ip):
    from monarch_kernel.folding import MeshCellTimeout

    # a deadline, not bad usage: no UsageError
    with pytest.raises(MeshCellTimeout, match="did not finish within 0.5 s .the remote cell "
                                              "was interrupted"):
        ip.run_cell_magic("mesh", "ext --timeout 0.5",
                          "import time\nfor _ in range(200):\n    time.sleep(0.05)\n")
    # the remote loop was interrupted: the procs take the next cell (else ~9 s of loop are
    # left, past this cell's timeout)
    vm = ip.run_cell_magic("mesh", "ext --timeout 5", "'free'")
    assert list(vm.values()) == ["free", "free"]


def test_unpicklable_values_come_back_as_their_repr(ip):
    from monarch_kernel.remote.cell_exec import Unpicklable

    vm = ip.run_cell_magic("mesh", "ext", "import threading\nthreading.Lock()")
    values = list(vm.values())
    assert all(isinstance(v, Unpicklable) and "lock" in repr(v) for v in values), values


def test_actor_mesh_variable_runs_on_its_procs(ip):
    ip.run_cell("from runtime import Actor, endpoint\n"
                "class Noop(Actor):\n"
                "    def __init__(self, flag=True):\n"
                "        self.flag = flag\n"
                "    @endpoint\n"
                "    def ok(self):\n"
                "        return True\n")
    with capture_output():
        ip.run_line_magic("mesh", "spawn ext Noop --as noops")
    assert list(ip.user_ns["noops"].ok.call().get().values()) == [True, True]
    vm = ip.run_cell_magic("mesh", "noops -q -o where", "current_rank().rank")
    assert vm is None and list(ip.user_ns["where"].values()) == [0, 1]


@pytest.mark.parametrize("line,message", [
    ("alloc p2 --hosts nothere", "no variable 'nothere'"),
    ("alloc p2 --hosts ext", "is a ProcMesh, not a HostMesh"),
    ("spawn ext int", "'int' is not an Actor subclass"),
    ("spawn ext Noop --as n2 1 2", "Noop.__init__: too many positional arguments"),
    ("spawn ext Noop undefined_name", "NameError"),
    ("spawn nothere Noop", "no variable 'nothere'"),
])
def test_bad_input_is_a_one_line_usage_error(ip, line, message):
    with pytest.raises(UsageError) as e:
        ip.run_line_magic("mesh", line)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_stop_by_mesh_name_and_status_views(ip):
    with capture_output():
        ip.run_line_magic("mesh", "alloc v1 --mesh-name labelled --per-host procs=1 "
                                  "--no-progress")
    status = ip.run_line_magic("mesh", "status labelled")
    assert repr(status) == "proc mesh labelled {procs: 1}: running, no actors"
    with capture_output():
        ip.run_line_magic("mesh", "spawn v1 Noop --as lab_actors")
    status = ip.run_line_magic("mesh", "status --text labelled")
    assert repr(status).startswith("mesh lab_actors [procs=1] on labelled")
    assert status._repr_html_() is None  # --text: no HTML form
    status = ip.run_line_magic("mesh", "status lab_actors")
    assert "<" in status._repr_html_()
    with pytest.raises(UsageError, match="no mesh named 'nope'"):
        ip.run_line_magic("mesh", "status nope")
    with capture_output() as cap:
        ip.run_line_magic("mesh", "stop labelled")  # not a variable: a mesh name
    assert cap.stdout.strip() == "stopped 1 mesh: labelled"  # (its actors with it)
    assert ip.user_ns["v1"]._stopped_flag
    with pytest.raises(UsageError, match="neither a mesh variable nor a live mesh's name"):
        ip.run_line_magic("mesh", "stop labelled")


def test_stopped_mesh_is_refused(ip):
    ip.user_ns["h"] = runtime.this_host()
    with capture_output():
        ip.run_line_magic("mesh", "alloc short --per-host procs=1 --no-progress")
        ip.run_line_magic("mesh", "stop short")
    with pytest.raises(UsageError, match="proc mesh 'short' was stopped"):
        ip.run_cell_magic("mesh", "short", "1")
    table = ip.run_line_magic("mesh", "list")
    assert "short" not in repr(table) and "ext" in repr(table)


def test_alloc_on_a_new_local_job_and_stop_ends_it(ip):
    from _kernel_helpers import snapshot, wait_gone

    with capture_output() as cap:
        ip.run_line_magic("mesh", "alloc lj --job local --hosts 2 --per-host procs=1")
    shown = "\n".join(o.data.get("text/plain", "") for o in cap.outputs)
    assert "starting a local job for lj: 2 host(s)" in shown
    assert "local job for lj is up" in shown, shown
    # the procs' start-up bar is tqdm: on stderr in a shell without a kernel
    assert "2/2 procs up" in shown + cap.stderr, (shown, cap.stderr)
    procs, job = ip.user_ns["lj"], ip.user_ns["lj_job"]
    assert len(procs.procs) == 2 and procs.sizes["procs"] == 1, procs.sizes
    agents = snapshot(job.pids)
    assert len(agents) == 2
    vm = ip.run_cell_magic("mesh", "lj", "import os\nos.getpid()")
    assert len(set(vm.values())) == 2
    with capture_output() as cap:
        ip.run_line_magic("mesh", "stop lj")
    assert "stopped 1 mesh: lj (and its local job)" in cap.stdout

    assert not wait_gone(agents, timeout=10)  # the job's agents are gone


def test_mesh_logs_reads_the_job_hosts_files(ip):
    ip.run_line_magic("mesh", "alloc lgs --job local --hosts 1 --per-host procs=2 --no-progress")
    try:
        ip.run_cell_magic("mesh", "lgs", "import os\nfor i in range(3): print('step', i)\n"
                                         "os.write(2, b'from C\\n')\nNone")
        with capture_output() as cap:
            ip.run_line_magic("mesh", "logs lgs --rank 1 --grep step --tail 2")
        lines = cap.stdout.splitlines()
        assert lines[0].startswith("== lgs rank 1 (pid ") and lines[1:] == ["step 1", "step 2"]
        with capture_output() as cap:  # a name, on the hosts of a Job variable
            ip.run_line_magic("mesh", "logs lgs --job lgs_job --grep 'from C'")
        assert [ln for ln in cap.stdout.splitlines() if not ln.startswith("==")] == \
            ["from C", "from C"]
        with capture_output() as cap:
            ip.run_line_magic("mesh", "logs nobody --job lgs_job")
        assert "no log files of 'nobody'" in cap.stdout
        with pytest.raises(UsageError, match="%mesh logs: read_logs: "):
            ip.run_line_magic("mesh", "logs lgs --grep '('")
    finally:
        ip.run_line_magic("mesh", "stop lgs")


@pytest.mark.parametrize("line,message", [
    ("alloc j --job local", "--hosts N is required"),
    ("alloc j --job local --hosts 1 --partition gpu", "--partition does not apply"),
    ("alloc j --job moon --hosts 1", "invalid choice"),
])
def test_job_alloc_errors_are_one_line(ip, line, message):
    with pytest.raises(UsageError) as e:
        ip.run_line_magic("mesh", line)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_mesh_activate_runs_later_cells_on_the_mesh(ip):
    with capture_output() as cap:
        ip.run_line_magic("mesh", "alloc act --per-host procs=2 --no-progress")
        ip.run_line_magic("mesh", "activate act")
    assert "mesh 'act' {procs: 2} is active: torch in the cells that follow" in cap.stdout
    assert runtime.get_active_mesh() is ip.user_ns["act"]
    assert "running (active)" in repr(ip.run_line_magic("mesh", "list"))
    ip.run_cell("import torch\nx = torch.ones(3) * 2")
    assert isinstance(ip.user_ns["x"], runtime.Tensor)
    assert runtime.inspect(ip.user_ns["x"], procs=1).tolist() == [2.0, 2.0, 2.0]
    with capture_output() as cap:
        ip.run_line_magic("mesh", "deactivate")
        ip.run_line_magic("mesh", "deactivate")
    assert cap.stdout.splitlines() == ["mesh 'act' is no longer active", "no mesh is active"]
    assert runtime.get_active_mesh() is None
    ip.run_cell("y = torch.ones(3)")
    assert type(ip.user_ns["y"]) is torch.Tensor
    with pytest.raises(UsageError, match="no variable 'nope'"):
        ip.run_line_magic("mesh", "activate nope")
    ip.run_line_magic("mesh", "stop act")


def test_views_show_only_the_users_meshes(ip):
    """After a %%mesh cell, an activated torch op and an SPMD set-up, every view lists the
    user's meshes only; the user's actor mesh named like its proc mesh keeps its name."""
    import monarch_widgets
    from runtime.spmd import setup_torch_elastic_env

    ip.run_cell("from runtime import Actor, endpoint\n"
                "class Mine(Actor):\n"
                "    @endpoint\n"
                "    def ok(self):\n"
                "        return True\n")
    with capture_output():
        ip.run_line_magic("mesh", "alloc trainers --per-host procs=2 --no-progress")
    assert list(ip.run_cell_magic("mesh", "trainers", "current_rank().rank").values()) == [0, 1]
    procs = ip.user_ns["trainers"]
    ip.run_cell("mine = trainers.spawn('trainers', Mine)\nmine.initialized.get()")
    with capture_output():
        ip.run_line_magic("mesh", "activate trainers")
    ip.run_cell("import torch\nz = torch.ones(2) + 1")
    assert runtime.inspect(ip.user_ns["z"], procs=1).tolist() == [2.0, 2.0]
    with capture_output():
        ip.run_line_magic("mesh", "deactivate")
    setup_torch_elastic_env(procs)
    rt = runtime.get_runtime()
    internal = [m for m in rt.health.snapshot(internal=True)
                if m.internal and m.proc_mesh == "trainers"]
    assert len(internal) == 4, internal  # cell runner and completer, tensor engine, spmd
    assert ip.user_ns["mine"].health_name == "trainers"
    names = {m.name for m in rt.health.snapshot() if m.proc_mesh == "trainers"}
    assert names == {"trainers"}
    listed = repr(ip.run_line_magic("mesh", "list"))
    rows = [ln for ln in listed.splitlines() if ln.lstrip().startswith("trainers")]
    assert len(rows) == 2 and "actors (Mine)" in listed, listed  # the procs, the actors
    for hidden in ("CellRunner", "CellCompleter", "Worker", "SPMDActor", "tensor_engine",
                   "spmd", "completer", "~2"):
        assert hidden not in listed
        text = repr(ip.run_line_magic("mesh", "status --text"))
        assert hidden not in text
        assert hidden not in repr(ip.run_line_magic("mesh", "status --text trainers"))
        assert hidden not in monarch_widgets.mesh_html(procs, "proc_mesh")
        assert hidden not in repr(monarch_widgets.dashboard(rt))
    assert "mesh trainers [procs=2] on trainers" in text
    from monarch_widgets import controls

    with pytest.raises(KeyError, match="no live mesh named 'trainers.trainers'"):
        controls.stop_mesh("trainers.trainers", rt)  # the cell runner's health name
    with capture_output():
        ip.run_line_magic("mesh", "stop trainers")


def test_a_rank_that_dies_in_a_cell_is_reported_in_the_users_words(ip):
    from monarch_kernel.folding import MeshCellError

    with capture_output():
        ip.run_line_magic("mesh", "alloc dying --per-host procs=3 --no-progress")
    pids = [p.pid for p in ip.user_ns["dying"].procs]
    code = ("import os, signal, sys\n"
            "if current_rank().rank == 1:\n"
            "    print('going down', file=sys.stderr, flush=True)\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "current_rank().rank * 10")
    with pytest.raises(MeshCellError) as e, capture_output() as shown:
        ip.run_cell_magic("mesh", "dying -o out", code)
    report = str(e.value)
    assert report.startswith("1 of 3 ranks failed on dying: ProcDied"), report
    assert f"the proc of dying rank 1 was killed by SIGKILL (host " in report
    assert f"pid {pids[1]}); the cell did not finish there" in report
    # its last lines of stderr: in the report, or once above it (streamed into the cell)
    streamed = "going down" in shown.stdout + shown.stderr
    assert ("going down" in report) != streamed, (report, shown.stdout, shown.stderr)
    assert "going down" in report or "its stderr is above ([dying 1] lines)" in report
    for internal in ("CellRunner", "cell_runner", "<root>", "Endpoint call", "SupervisionError"):
        assert internal not in report
    results = e.value.results  # the ranks that finished keep their results
    assert [r.value if r is not None else None for r in results.values()] == [0, None, 20]
    assert ip.user_ns["out"] is e.value
    with capture_output():
        ip.run_line_magic("mesh", "stop dying")
        ip.run_line_magic("mesh", "alloc dying2 --per-host procs=2 --no-progress")
    fut = ip.run_cell_magic("mesh", "dying2 --noblock", code)
    with pytest.raises(MeshCellError) as e:
        fut.get(timeout=60)
    assert "the proc of dying2 rank 1 was killed by SIGKILL" in str(e.value)
    assert "CellRunner" not in str(e.value)
    with capture_output():
        ip.run_line_magic("mesh", "stop dying2")


def test_a_rank_whose_proc_hangs_in_a_cell_is_reported_in_the_users_words(ip):
    """A proc that stops answering (SIGSTOP: no heartbeats) past heartbeat_timeout: the
    cell reports which rank of which mesh hung, where, and keeps the other ranks' results."""
    import os
    import signal

    from monarch_kernel.folding import MeshCellError

    pids: list[int] = []
    try:
        with runtime.configured(heartbeat_timeout=2.0), capture_output():
            ip.run_line_magic("mesh", "alloc hangs --per-host procs=2 --no-progress")
            pids = [p.pid for p in ip.user_ns["hangs"].procs]
            code = ("import os, signal, time\n"
                    "if current_rank().rank == 1:\n"
                    "    os.kill(os.getpid(), signal.SIGSTOP)\n"
                    "    time.sleep(60)  # the stop may land a moment after kill() returns\n"
                    "current_rank().rank + 5")
            with pytest.raises(MeshCellError) as e:
                ip.run_cell_magic("mesh", "hangs", code)
        report = str(e.value)
        assert report.startswith("1 of 2 ranks failed on hangs: ProcDied"), report
        assert "the proc of hangs rank 1 failed: proc unresponsive (no heartbeat for 2 s)" \
            in report, report
        assert f"pid {pids[1]}); the cell did not finish there" in report
        for internal in ("CellRunner", "cell_runner", "<root>", "Endpoint call",
                         "SupervisionError"):
            assert internal not in report
        results = e.value.results
        assert [r.value if r is not None else None for r in results.values()] == [5, None]
    finally:
        with capture_output():
            if "hangs" in ip.user_ns:
                ip.run_line_magic("mesh", "stop hangs")
        for pid in pids:  # the hung proc is killed when declared dead; make sure
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_magic_lines_complete_in_a_plain_ipython(ip):
    """The mesh-aware matcher is part of the extension, not only of the kernel."""
    from IPython.core.completer import provisionalcompleter

    def texts(code: str) -> list[str]:
        with provisionalcompleter():
            return [c.text for c in ip.Completer.completions(code, len(code))]

    assert texts("%mesh sp") == ["spawn"]
    assert texts("%mesh interrupt re") == ["remote"]
    assert texts("%%mesh anything --ra") == ["--ranks"]


def test_mesh_timeline_and_stacks(ip, tmp_path):
    """%mesh timeline draws a lane per rank (text with --text) and saves a Chrome trace;
    %mesh stacks prints every thread taken by py-spy, or why it could not."""
    import json

    from runtime import stacks

    ip.run_line_magic("mesh", "alloc obs --per-host procs=2 --no-progress")
    try:
        ip.run_cell_magic("mesh", "obs", "x = 1\nx")
        with capture_output() as cap:
            ip.run_line_magic("mesh", f"timeline obs --text --save {tmp_path / 't.json'}")
        assert "timeline of obs: 2 lanes" in cap.stdout and "rank 1: 1 calls" in cap.stdout
        with open(tmp_path / "t.json") as f:
            assert [e["ph"] for e in json.load(f)["traceEvents"]].count("X") == 2
        with pytest.raises(UsageError, match="no live proc mesh 'nobody'"):
            ip.run_line_magic("mesh", "timeline nobody")
        with runtime.configured(py_spy=str(tmp_path / "none" / "py-spy")):
            with capture_output() as cap:
                ip.run_line_magic("mesh", "stacks obs --rank 1")
        assert "== obs rank 1" in cap.stdout and "py-spy not found; looked at" in cap.stdout
        with pytest.raises(UsageError, match="rank must be an int in 0..1"):
            ip.run_line_magic("mesh", "stacks obs --rank 5")
        if stacks.find_py_spy()[0] is not None:
            with capture_output() as cap:
                ip.run_line_magic("mesh", "stacks obs")
            assert cap.stdout.count("Thread ") >= 4 and "== obs rank 0" in cap.stdout
    finally:
        ip.run_line_magic("mesh", "stop obs")


def test_mesh_cancel_stops_a_cell_running_on_the_mesh_and_the_mesh_runs_the_next(ip):
    """`%mesh cancel NAME` cancels what this notebook has in flight to the mesh: a
    `--noblock` cell spinning on every rank fails with CancelledError, and the next cell
    runs on the same procs."""
    from runtime import CancelledError

    with capture_output():
        ip.run_line_magic("mesh", "alloc cancelme --per-host procs=2 --no-progress")
    code = ("import time\n"
            "end = time.monotonic() + 60\n"
            "while time.monotonic() < end:\n"
            "    time.sleep(0.01)\n")
    fut = ip.run_cell_magic("mesh", "cancelme --noblock", code)
    # started on the ranks or still queued there: cancelled either way
    with capture_output() as shown:
        ip.run_line_magic("mesh", "cancel cancelme")
    assert "call(s) in flight to 'cancelme' cancelled" in shown.stdout, shown.stdout
    with pytest.raises(Exception) as e:
        fut.get(timeout=30)
    assert isinstance(e.value, CancelledError), repr(e.value)
    with capture_output():
        ip.run_cell_magic("mesh", "cancelme -o again", "current_rank().rank + 1")
    assert sorted(ip.user_ns["again"].values()) == [1, 2]
    with pytest.raises(Exception, match="cancel: 'nosuch' is neither"):
        ip.run_line_magic("mesh", "cancel nosuch")
    with capture_output():
        ip.run_line_magic("mesh", "stop cancelme")


def test_mesh_why_names_a_cell_that_calls_its_own_mesh(ip):
    """`%mesh why NAME`: a %%mesh cell whose code waits on a value nothing sends is shown
    running, in the mesh's words, with what it waits on; once `%mesh cancel` stopped it
    there, nothing is stuck."""
    with capture_output():
        ip.run_line_magic("mesh", "alloc whyme --per-host procs=1 --no-progress")
    code = ("from runtime import Channel\n"
            "_, recv = Channel.open()\n"
            "recv.recv().get(timeout=60)\n")
    fut = ip.run_cell_magic("mesh", "whyme --noblock", code)
    try:
        def shown() -> str:
            with capture_output() as out:
                ip.run_line_magic("mesh", "why whyme")
            return out.stdout if "Channel port" in out.stdout else ""

        text = wait_until(shown, 20, "the wait was not diagnosed")
        assert "whyme (a %%mesh cell) rank 0: running" in text, repr(text)
    finally:
        with capture_output():
            ip.run_line_magic("mesh", "cancel whyme")
    with pytest.raises(Exception):
        fut.get(timeout=30)

    def calm() -> bool:  # from the next heartbeat on (every heartbeat_interval)
        with capture_output() as out:
            ip.run_line_magic("mesh", "why whyme")
        return "nothing is stuck" in out.stdout

    wait_until(calm, 20, "still shown stuck after the cancel")
    with capture_output():
        ip.run_line_magic("mesh", "stop whyme")


def test_mesh_kill_ends_a_cell_stuck_in_c_that_why_names(ip):
    """A %%mesh cell blocked in one C call (time.sleep): `%mesh why` says it is blocked in
    a C call and not cancellable; `%mesh kill NAME` ends its proc and the cell fails in the
    mesh's words, naming the user's kill."""
    with capture_output():
        ip.run_line_magic("mesh", "alloc killme --per-host procs=1 --no-progress")
    fut = ip.run_cell_magic("mesh", "killme --noblock", "import time\ntime.sleep(120)\n")

    def shown() -> str:
        with capture_output() as out:
            ip.run_line_magic("mesh", "why killme")
        return out.stdout if "blocked inside a C call" in out.stdout else ""

    text = wait_until(shown, 20, "the C call was not diagnosed")
    assert "killme (a %%mesh cell) rank 0: running" in text, text
    assert "(a sleep)" in text and "time.sleep(120)" in text and "%mesh kill" in text, text
    with capture_output() as out:
        ip.run_line_magic("mesh", "kill killme")
    assert "%mesh kill: killed the 1 proc(s) hosting 'killme' (SIGKILL)" in out.stdout, \
        out.stdout
    with pytest.raises(Exception) as e:
        fut.get(timeout=30)
    assert "killed by the user (kill() of proc mesh 'killme')" in str(e.value), str(e.value)
    with pytest.raises(UsageError, match="kill: 'nosuch' is neither"):
        ip.run_line_magic("mesh", "kill nosuch")
    with capture_output():
        ip.run_line_magic("mesh", "stop killme")
