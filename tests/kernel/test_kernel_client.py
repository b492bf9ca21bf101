"""Drive the installed `monarch` kernelspec with jupyter_client: magics, live prefixed
output, await, one-line errors, interrupt of remote work, and restart with no orphans."""

from __future__ import annotations

import contextlib
import shutil
import time
from typing import Any, Iterator

import pytest
from jupyter_client.manager import start_new_kernel

from _kernel_helpers import install_kernelspec, kill_all, snapshot, wait_gone

pytestmark = pytest.mark.timeout(150)


class Kernel:
    """A running Monarch kernel and a blocking client, with an `execute` that collects."""

    def __init__(self) -> None:
        install_kernelspec()
        self.km, self.kc = start_new_kernel(kernel_name="monarch", startup_timeout=60)
        self.pids: dict[int, float] = {}

    def execute(self, code: str, timeout: float = 60.0, on_stream: Any = None
                ) -> dict[str, Any]:
        """Run `code`; returns stdout, stderr, results, error and message timings.
        `on_stream(res)` is called after each piece of output, while the cell runs."""
        msg_id = self.kc.execute(code)
        res: dict[str, Any] = {"stdout": "", "stderr": "", "results": [], "error": None,
                               "stream_times": [], "displays": []}
        deadline = time.monotonic() + timeout
        while True:
            msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            t, c = msg["msg_type"], msg["content"]
            if t == "stream":
                res[c["name"]] += c["text"]
                res["stream_times"].append(time.monotonic())
                if on_stream is not None:
                    on_stream(res)
            elif t == "execute_result":
                res["results"].append(c["data"]["text/plain"])
            elif t in ("display_data", "update_display_data"):
                res["displays"].append(c["data"].get("text/plain", ""))
            elif t == "error":
                res["error"] = c
            elif t == "status" and c["execution_state"] == "idle":
                res["idle_time"] = time.monotonic()
                break
        while True:
            reply = self.kc.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                res["reply"] = reply["content"]
                return res

    def value(self, code: str) -> Any:
        import ast

        r = self.execute(code)
        assert r["error"] is None, r["error"]
        return ast.literal_eval(r["results"][-1])

    def track_processes(self) -> None:
        """Remember the kernel and all its descendants, so clean-up can kill them by pid."""
        pids = self.value("import os, psutil\n"
                          "[os.getpid()] + [c.pid for c in psutil.Process().children("
                          "recursive=True)]")
        self.pids.update(snapshot(pids))

    def close(self) -> None:
        try:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=True)
        finally:
            kill_all(self.pids)


@contextlib.contextmanager
def kernel_session() -> Iterator["Kernel"]:
    """A Monarch kernel for a test module; its runtime's directory is removed afterwards
    (the kernel is killed, so its runtime cannot remove it)."""
    k = Kernel()
    rundirs: list = []
    try:
        yield k
        rundirs.append(k.value("import runtime; runtime.get_runtime().rundir"))
    finally:
        k.close()
        for d in rundirs:
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def kernel():
    k = Kernel()
    try:
        yield k
    finally:
        k.close()


def test_alloc_and_cell_output_streams_live_with_prefixes(kernel, tmp_path):
    r = kernel.execute("%mesh alloc workers --per-host procs=2")
    assert r["error"] is None, r["error"]
    assert any("2/2 procs up" in d for d in r["displays"]), r["displays"]
    kernel.track_processes()
    go = tmp_path / "go"

    def early_seen(res: dict) -> None:  # the cell goes on only once its first lines are here
        if "[workers 0] early 0" in res["stdout"] and "[workers 1] early 1" in res["stdout"]:
            go.touch()

    r = kernel.execute(
        "%%mesh workers\n"
        "import os, time, sys\n"
        "print('early', current_rank().rank, flush=True)\n"
        "end = time.monotonic() + 30\n"
        f"while not os.path.exists({str(go)!r}) and time.monotonic() < end:\n"
        "    time.sleep(0.01)\n"
        f"print('late' if os.path.exists({str(go)!r}) else 'gave up', current_rank().rank,"
        " file=sys.stderr)\n"
        "current_rank().rank * 10\n", on_stream=early_seen)
    assert r["error"] is None, r["error"]
    lines = r["stdout"].splitlines()
    assert "[workers 0] early 0" in lines and "[workers 1] early 1" in lines
    assert "[workers 0] late 0" in r["stderr"].splitlines()
    assert "[workers 1] late 1" in r["stderr"].splitlines()
    # Live: the first lines arrived while the cell was still running ("late" is printed
    # only after the test saw them)
    assert r["results"] == ["ValueMesh({'procs': 2}, {{procs=0}: 0, {procs=1}: 10})"]


def test_cell_namespace_persists_and_braces_are_not_expanded(kernel):
    kernel.execute("x = 'controller'")
    r = kernel.execute("%%mesh workers\nx = {'rank': current_rank().rank}\n")
    assert r["error"] is None and r["results"] == []
    r = kernel.execute("%%mesh workers --ranks procs=1 -o got\nx")
    assert r["results"] == ["ValueMesh({}, {{}: {'rank': 1}})"]
    assert kernel.value("got.item()") == {"rank": 1}
    assert kernel.value("x") == "controller"


def test_errors_are_folded_and_bad_arguments_are_one_line(kernel):
    r = kernel.execute("%%mesh workers\nimport math\nmath.sqrt(-1)\n")
    err = r["error"]
    assert err["ename"] == "MeshCellError"
    text = "\n".join(err["traceback"])
    assert "2 of 2 ranks failed on workers: ValueError" in text
    assert text.count("ValueError: math domain error") == 1 and "--- ranks 0-1 ---" in text
    for bad in ["%mesh alloc 9lives", "%mesh frob", "%%mesh workers --ranks procs=x\n1",
                "%mesh spawn workers NoSuchClass", "%mesh stop nothing_here"]:
        r = kernel.execute(bad)
        # IPython shows a UsageError as one line on stderr and fails the cell, no traceback.
        assert r["reply"]["status"] == "error" and r["reply"]["ename"] == "UsageError", bad
        assert r["stderr"].startswith(("UsageError: %mesh", "UsageError: %%mesh")) and r["stderr"].count("\n") == 1, \
            r["stderr"]


def test_spawn_from_notebook_class_and_await(kernel):
    r = kernel.execute(
        "from runtime import Actor, endpoint, current_rank\n"
        "class Greeter(Actor):\n"
        "    def __init__(self, word):\n"
        "        self.word = word\n"
        "    @endpoint\n"
        "    async def greet(self, who):\n"
        "        print('greeting', who)\n"
        "        return f'{self.word} {who} from {current_rank().rank}'\n")
    assert r["error"] is None
    r = kernel.execute("%mesh spawn workers Greeter --as greeters \"'hi'\"")
    assert r["error"] is None, r["error"]
    r = kernel.execute("vm = await greeters.greet.call('ann')\nsorted(vm.values())")
    assert r["error"] is None, r["error"]
    assert r["results"] == ["['hi ann from 0', 'hi ann from 1']"]
    assert "[greeters 0] greeting ann" in r["stdout"]
    r = kernel.execute("greeters.greet.call('bo').get().item(procs=1)")
    assert r["results"] == ["'hi bo from 1'"]
    r = kernel.execute("%mesh list")
    table = r["results"][0]
    assert "workers" in table and "greeters" in table and "actors (Greeter)" in table


def test_remote_tracebacks_of_cell_code_show_the_cell_and_its_lines(kernel):
    """An actor defined in a cell: its remote traceback names the kernel's cell file and
    shows the cell's lines, through a nested call and a lambda (the procs cannot read the
    cell; the code objects keep its file name across the wire and the kernel fills in the
    lines)."""
    r = kernel.execute("from runtime import Actor, endpoint, this_host\n"
                       "def twice(v):\n"
                       "    return [v][2]\n"
                       "class Cellular(Actor):\n"
                       "    @endpoint\n"
                       "    def nested(self):\n"
                       "        return twice(1)\n"
                       "    @endpoint\n"
                       "    def by_lambda(self):\n"
                       "        pick = lambda d: d['nope']\n"
                       "        return pick({})\n")
    assert r["error"] is None, r["error"]
    cell_file = kernel.value("twice.__code__.co_filename")
    r = kernel.execute("origin_procs = this_host().spawn_procs(per_host={'procs': 1}, "
                       "name='cellorigin')\ncellular = origin_procs.spawn('cellular', Cellular)")
    assert r["error"] is None, r["error"]
    try:
        text = "\n".join(kernel.execute("cellular.nested.call_one().get()")["error"]["traceback"])
        assert f'  File "{cell_file}", line 7, in nested\n    return twice(1)\n' in text, text
        assert f'  File "{cell_file}", line 3, in twice\n    return [v][2]\n' in text, text
        text = "\n".join(kernel.execute("cellular.by_lambda.call_one().get()")["error"]["traceback"])
        assert f'  File "{cell_file}", line 10, in <lambda>\n    pick = lambda d: d[\'nope\']\n' \
            in text, text
        assert "<dynamic-code>" not in text
    finally:
        assert kernel.execute("origin_procs.stop().get(timeout=30)")["error"] is None


def test_interrupt_stops_the_wait_and_the_remote_work(kernel):
    ename = interrupt_cell(kernel, "%%mesh workers\nimport time\nprint('looping', flush=True)\n"
                                   "for i in range(600):\n    time.sleep(0.05)\n'finished'\n",
                           "looping", count=2)
    # not the cell's end (its loop runs 30 s): a KeyboardInterrupt that says which ranks
    assert ename == "MeshCellInterrupted"
    # The remote loop was interrupted too: the actors take the next cell (an actor runs
    # one message at a time; otherwise this cell would wait for the loop's ~28 s left and
    # time out)
    r = kernel.execute("%%mesh workers --timeout 15\n'again'", timeout=20)
    assert r["error"] is None, r["error"]
    assert r["results"] == ["ValueMesh({'procs': 2}, {{procs=0}: 'again', {procs=1}: 'again'})"]


def interrupt_cell(kernel, code: str, marker: str, count: int = 1) -> str:
    """Run `code`; once its output has shown `marker` `count` times (the remote work is
    running), interrupt the kernel; the error name the cell ends with."""
    return interrupt_cell_error(kernel, code, marker, count)["ename"]


def interrupt_cell_error(kernel, code: str, marker: str, count: int = 1) -> dict:
    """`interrupt_cell`, returning the error the cell ends with (ename, traceback), or {}."""
    msg_id = kernel.kc.execute(code)
    seen = 0
    while seen < count:
        msg = kernel.kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            seen += msg["content"]["text"].count(marker)
        assert not (msg["msg_type"] == "status" and
                    msg["content"]["execution_state"] == "idle"), "ended before the interrupt"
    kernel.km.interrupt_kernel()
    error: dict = {"ename": None}
    stderr = ""
    while True:
        msg = kernel.kc.get_iopub_msg(timeout=20)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "error":
            error = msg["content"]
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stderr":
            stderr += msg["content"]["text"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return {**error, "stderr": stderr}


def test_an_interrupted_cell_is_reported_per_rank_in_the_users_words(kernel):
    """Ctrl-C during a %%mesh cell: which rank of which mesh was interrupted, at which line
    of the cell; the rank that had finished keeps its result."""
    err = interrupt_cell_error(kernel, "%%mesh workers -o out\nimport time\n"
                                       "if current_rank().rank == 1:\n"
                                       "    print('looping', flush=True)\n"
                                       "    for i in range(600):\n"
                                       "        time.sleep(0.05)\n"
                                       "current_rank().rank + 7\n", "looping")
    assert err["ename"] == "MeshCellInterrupted", err
    text = "\n".join(err["traceback"])
    assert "interrupted: 1 of 2 ranks failed on workers: KeyboardInterrupt" in text, text
    assert "--- rank 1 (procs=1) ---" in text and "time.sleep(0.05)" in text, text
    for internal in ("CellRunner", "cell_runner", "<root>", "Endpoint call", "magic_cells",
                     "SupervisionError"):
        assert internal not in text, text
    r = kernel.execute("[c.value if c is not None and c.ok else None "
                       "for c in out.results.values()]")
    assert r["error"] is None and r["results"] == ["[7, None]"], r


def test_interrupt_an_awaited_call_interrupts_the_actor(kernel):
    r = kernel.execute(
        "import time\n"
        "class Sleeper(Actor):\n"
        "    @endpoint\n"
        "    async def nap(self, seconds):\n"
        "        print('napping', flush=True)\n"
        "        end = time.monotonic() + seconds\n"
        "        while time.monotonic() < end:\n"
        "            time.sleep(0.05)\n"
        "        self.naps = getattr(self, 'naps', 0) + 1\n"
        "        return 'rested'\n"
        "    @endpoint\n"
        "    def ping(self):\n"
        "        return getattr(self, 'naps', 0)\n")
    assert r["error"] is None, r["error"]
    kernel.execute("%mesh spawn workers Sleeper --as sleepers")
    ename = interrupt_cell(kernel, "await sleepers.nap.call(30)", "napping", count=2)
    assert ename in ("KeyboardInterrupt", "CancelledError"), ename  # not the 30 s nap's end
    # the nap was interrupted on both actors: they answer (else ~28 s of nap are left), and
    # no nap ran to its end
    r = kernel.execute("sleepers.ping.call().get(timeout=15)", timeout=20)
    assert r["error"] is None, r["error"]
    assert r["results"] == ["ValueMesh({'procs': 2}, {{procs=0}: 0, {procs=1}: 0})"], r


def test_interrupting_an_awaiting_cell_cancels_its_other_calls_not_earlier_ones(kernel, tmp_path):
    """The stop button on a cell awaiting a call: the awaited call's actors are interrupted,
    the cell's other call is cancelled, a call an earlier cell started goes on."""
    release = str(tmp_path / "release")
    r = kernel.execute("import os\n"
                       "class Early(Actor):\n"
                       "    @endpoint\n"
                       "    def doze(self, release):\n"
                       "        end = time.monotonic() + 60\n"
                       "        while not os.path.exists(release) and time.monotonic() < end:\n"
                       "            time.sleep(0.01)\n"
                       "        return 'rested'\n")
    assert r["error"] is None, r["error"]
    r = kernel.execute("%mesh spawn workers Sleeper --name side --as side\n"
                       "%mesh spawn workers Early --name early --as early\n"
                       f"before = early.slice(procs=0).doze.call_one({release!r})")
    assert r["error"] is None, r["error"]  # `before`: an earlier cell's call, still running
    err = interrupt_cell_error(kernel, "other = side.nap.call(30)\n"
                                       "await sleepers.nap.call(30)", "napping", count=4)
    assert err["ename"] in ("KeyboardInterrupt", "CancelledError"), err
    assert "interrupted: cancelled 1 call this cell started (Sleeper.nap.call)" in \
        err["stderr"], err
    open(release, "w").close()
    r = kernel.execute("try:\n    other.get(timeout=10)\nexcept Exception as e:\n"
                       "    print(type(e).__name__)\n"
                       "print(before.get(timeout=20))", timeout=30)
    assert r["error"] is None, r["error"]
    # the cell's other call was cancelled; the earlier cell's call ran to its end
    assert r["stdout"].split() == ["CancelledError", "rested"], r


def test_local_interrupt_mode_leaves_remote_work_running(kernel):
    r = kernel.execute("%mesh interrupt local")
    assert "interrupt mode: local" in r["stdout"]
    try:
        ename = interrupt_cell(kernel, "sleepers.nap.call(3.0).get()", "napping", count=2)
        assert ename == "KeyboardInterrupt"  # the wait, not the nap's end
        # The actors keep napping: the next call waits for the nap to end, which it reaches
        r = kernel.execute("sleepers.ping.call().get(timeout=20)", timeout=25)
        assert r["error"] is None, r["error"]
        assert r["results"] == ["ValueMesh({'procs': 2}, {{procs=0}: 1, {procs=1}: 1})"], r
    finally:
        r = kernel.execute("%mesh interrupt remote")
        assert "interrupt mode: remote" in r["stdout"]


def test_noblock_returns_a_future(kernel):
    r = kernel.execute("%%mesh workers --noblock -o pending\nimport time\ntime.sleep(0.5)\n"
                       "current_rank().rank + 100")
    assert r["error"] is None, r["error"]
    assert r["results"] and r["results"][0].startswith("<Future")
    r = kernel.execute("pending.get(timeout=20)")
    assert r["results"] == ["ValueMesh({'procs': 2}, {{procs=0}: 100, {procs=1}: 101})"]
    r = kernel.execute("%%mesh workers --noblock -o bad\nraise RuntimeError('nope')")
    r = kernel.execute("bad.get(timeout=20)")
    assert r["error"]["ename"] == "MeshCellError"
    assert "RuntimeError: nope" in "\n".join(r["error"]["traceback"])


def test_stop_mesh(kernel):
    r = kernel.execute("%mesh stop --all")
    assert r["error"] is None and "stopped" in r["stdout"]
    r = kernel.execute("%%mesh workers\n1")
    assert r["reply"]["ename"] == "UsageError" and "was stopped" in r["stderr"]


@pytest.mark.timeout(120)
def test_restart_and_kill_leave_no_orphans():
    k = Kernel()
    try:
        r = k.execute("%mesh alloc procs --per-host procs=2")
        assert r["error"] is None, r["error"]
        k.track_processes()
        before = dict(k.pids)
        assert len(before) >= 4  # kernel, host agent (+ zygote), 2 procs
        k.km.restart_kernel(now=False)
        k.kc.wait_for_ready(timeout=60)
        left = wait_gone(before, timeout=15)
        assert not left, f"processes survived the restart: {left}"
        # The new kernel works, and a hard kill (no clean shutdown) leaves nothing either.
        r = k.execute("%mesh alloc procs2 --per-host procs=2")
        assert r["error"] is None, r["error"]
        k.track_processes()
        after = {p: c for p, c in k.pids.items() if p not in before}
        assert len(after) >= 4
        k.km.shutdown_kernel(now=True)
        left = wait_gone(after, timeout=15)
        assert not left, f"processes survived killing the kernel: {left}"
    finally:
        k.close()
