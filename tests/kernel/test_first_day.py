"""A new user's first day (issue 53), through the installed `monarch` kernel driven by
jupyter_client: what they meet with `%mesh sync`, a dead rank, `%mesh logs` and
`%mesh status`, in the mesh's words."""

from __future__ import annotations

import os

import pytest

from test_kernel_client import kernel_session
from tests._util import wait_until

pytestmark = pytest.mark.timeout(200)


@pytest.fixture(scope="module")
def kernel():
    with kernel_session() as k:
        yield k


def _ok(r: dict) -> dict:
    assert r["error"] is None, "\n".join(r["error"]["traceback"])
    return r


def _error_text(r: dict) -> str:
    assert r["error"] is not None, r
    return "\n".join(r["error"]["traceback"])


def _usage_error(r: dict) -> str:
    """A UsageError's one line (IPython prints it on stderr; the reply says error)."""
    assert r["reply"]["status"] == "error" and r["reply"]["ename"] == "UsageError", r
    return r["stderr"]


def test_sync_without_reload_makes_the_code_importable_and_keeps_earlier_dirs(
        kernel, tmp_path):
    a, b = tmp_path / "dir_a", tmp_path / "dir_b"
    a.mkdir()
    b.mkdir()
    (a / "remmod.py").write_text("X = 42\n")
    (a / "remlater.py").write_text("L = 'later'\n")
    (b / "bmod.py").write_text("Z = 7\n")
    _ok(kernel.execute("%mesh alloc p --per-host procs=2 --no-progress"))
    kernel.track_processes()
    _ok(kernel.execute("%%mesh p\n1\n"))  # the procs are live before the sync
    r = _ok(kernel.execute(f"%mesh sync p --dir {a}"))
    assert "2 live procs import from it now" in r["stdout"], r["stdout"]
    r = _ok(kernel.execute("%%mesh p\nimport remmod\nremmod.X\n"))
    assert r["results"] == ["ValueMesh({'procs': 2}, {{procs=0}: 42, {procs=1}: 42})"]
    # a second directory synced later: the first stays on the hosts
    r = _ok(kernel.execute(f"%mesh sync p --dir {b}"))
    assert "0 deleted" in r["stdout"], r["stdout"]
    r = _ok(kernel.execute("%%mesh p --ranks procs=0\n"
                           "import bmod, remlater\n(bmod.Z, remlater.L)\n"))
    assert r["results"] == ["ValueMesh({}, {{}: (7, 'later')})"]


def test_a_dead_rank_makes_later_cells_say_so_in_the_meshs_words(kernel):
    _ok(kernel.execute("%mesh alloc d --per-host procs=4 --no-progress"))
    kernel.track_processes()
    r = kernel.execute("%%mesh d\nimport os\nif current_rank().rank == 3:\n    os._exit(3)\n")
    assert "1 of 4 ranks failed on d: ProcDied" in _error_text(r)
    for line in ["%%mesh d\n1\n", "%%mesh d --noblock\n1\n", "%%mesh d --ranks procs=2:4\n1\n"]:
        r = kernel.execute(line)
        text = _error_text(r)
        assert r["error"]["ename"] == "MeshRanksDead", text
        assert text.startswith("MeshRanksDead: rank 3 of d (4 ranks) is dead; the cell did "
                               "not run"), text
        assert "rank 3: its proc exited with code 3" in text
        assert "`%%mesh d --ranks procs=0:3` runs it on live ranks" in text
        for internal in ("monarch_kernel", "runtime/", "CellRunner", "SupervisionError"):
            assert internal not in text, text
    r = _ok(kernel.execute("%%mesh d --ranks procs=0:3\ncurrent_rank().rank\n"))
    assert r["results"] == ["ValueMesh({'procs': 3}, {{procs=0}: 0, {procs=1}: 1, "
                            "{procs=2}: 2})"]


def _log_lines(text: str, rank: int) -> list[str]:
    """The lines `%mesh logs` printed for `rank` (after its `== MESH rank R` header)."""
    out, mine = [], False
    for ln in text.splitlines():
        if ln.startswith("== "):
            mine = f" rank {rank} " in ln
        elif mine and not ln.startswith("("):
            out.append(ln)
    return out


def test_mesh_logs_shows_the_last_200_lines_of_each_proc_by_default(kernel):
    _ok(kernel.execute("import runtime\nruntime.configure(file_capture=True)\n"))
    _ok(kernel.execute("%mesh alloc lg --per-host procs=2 --no-progress"))
    kernel.track_processes()
    _ok(kernel.execute("%%mesh lg -q\nfor i in range(1000):\n    print('line', i)\n"))
    wait_until(lambda: "line 999" in "\n".join(_log_lines(
        kernel.execute("%mesh logs lg --rank 1 --tail 1")["stdout"], 1)), 20,
        "the last line in rank 1's log file")
    out = _ok(kernel.execute("%mesh logs lg"))["stdout"]
    for rank in (0, 1):
        lines = _log_lines(out, rank)
        assert lines[-1] == "line 999" and lines[0] == "line 800", lines[:3]
        assert len(lines) == 200
    assert "earlier lines left out]" in out
    assert "(1600 earlier lines left out: the last 200 lines of each proc are shown; " \
           "--tail N for more, --all for every line)" in out, out[-300:]
    out = _ok(kernel.execute("%mesh logs lg --rank 0 --all"))["stdout"]
    assert _log_lines(out, 0)[:2] == ["line 0", "line 1"] and "left out" not in out
    out = _ok(kernel.execute("%mesh logs lg --rank 0 --tail 3"))["stdout"]
    assert _log_lines(out, 0) == ["line 997", "line 998", "line 999"]


def test_output_without_a_final_newline_leaks_no_control_sequence(kernel):
    _ok(kernel.execute("import runtime\nruntime.configure(file_capture=True)\n"))
    _ok(kernel.execute("%mesh alloc q --per-host procs=2 --no-progress"))
    kernel.track_processes()
    r = _ok(kernel.execute("%%mesh q\nimport os\nos.write(1, b'raw')\n"
                           "os.write(2, b'err-raw')\nNone\n"))
    for rank in (0, 1):
        assert f"[q {rank}] raw" in r["stdout"].splitlines(), r
        assert f"[q {rank}] err-raw" in r["stderr"].splitlines(), r
    r = _ok(kernel.execute("%%mesh q\nprint('next', current_rank().rank)\n"))
    assert "\x1b" not in r["stdout"] + r["stderr"], r
    assert "[q 1] next 1" in r["stdout"].splitlines()
    wait_until(lambda: "next 1" in kernel.execute("%mesh logs q --rank 1")["stdout"], 20,
               "rank 1's last line in its log file")
    out = _ok(kernel.execute("%mesh logs q --all"))["stdout"]
    assert "\x1b" not in out and "777;" not in out, repr(out)
    assert sorted(_log_lines(out, 1)) == ["err-raw", "next 1", "raw"], repr(out)


def test_status_shows_a_proc_mesh_used_only_by_mesh_cells(kernel):
    _ok(kernel.execute("%mesh alloc only_cells --per-host procs=2 --no-progress"))
    kernel.track_processes()
    _ok(kernel.execute("%%mesh only_cells\n1\n"))
    want = "proc mesh only_cells {procs: 2}: running, no actor meshes (%%mesh cells only)"
    r = _ok(kernel.execute("%mesh status --text"))
    assert want in r["results"][-1] and "no meshes" not in r["results"][-1], r
    r = _ok(kernel.execute("%mesh status"))
    assert want in r["stdout"], r


def test_mesh_logs_after_stop_of_a_local_job_says_where_the_logs_went(kernel):
    _ok(kernel.execute("%mesh alloc jl --job local --hosts 1 --per-host procs=1 --no-progress"))
    kernel.track_processes()
    _ok(kernel.execute("%%mesh jl\nprint('hello from the job')\n"))
    _ok(kernel.execute("%mesh stop jl"))
    r = _ok(kernel.execute("%mesh logs jl"))
    assert r["stdout"].startswith("jl was stopped with its local job (%mesh stop), and the "
                                  "job's host agents, which read the log files, ended with "
                                  "it: "), r
    assert "Run %mesh logs before %mesh stop" in r["stdout"]
    assert "Warning" not in r["stdout"] + r["stderr"] and "(no log files)" not in r["stdout"]


def test_a_failed_reload_is_not_a_usage_error_and_is_reported_once(kernel, tmp_path):
    ws = tmp_path / "ws_fail"
    ws.mkdir()
    (ws / "failmod.py").write_text("V = 1\n")
    _ok(kernel.execute("%mesh alloc rl --per-host procs=3 --no-progress"))
    kernel.track_processes()
    _ok(kernel.execute(f"%mesh sync rl --dir {ws}"))
    _ok(kernel.execute("%%mesh rl\nimport failmod\n"))
    (ws / "failmod.py").write_text("V = 2\ndef broken(:\n")
    r = kernel.execute(f"%mesh sync rl --dir {ws} --reload")
    text = _error_text(r)
    assert r["error"]["ename"] == "MeshCommandFailed", text
    assert text.count("SyntaxError") == 1, text  # once, the procs named together
    assert "proc rl[0-2]: reloading failmod failed (old code kept)" in text, text
    assert "reloaded in" not in r["stdout"], r["stdout"]


def _ranks_in(text: str) -> set[int]:
    """`0-2, 5` -> {0, 1, 2, 5}."""
    out: set[int] = set()
    for part in text.split(","):
        a, _, b = part.strip().partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def _stderr_until(kernel, cond, timeout: float, what: str) -> str:
    """The stderr of every cell (any parent) from now on, read until `cond(text)`."""
    text: list = []

    def read() -> bool:
        try:
            msg = kernel.kc.get_iopub_msg(timeout=0.5)
        except Exception:  # queue.Empty: nothing yet
            return cond("".join(text))
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stderr":
            text.append(msg["content"]["text"])
        return cond("".join(text))

    if not cond(""):
        wait_until(read, timeout, f"{what} (the stderr read is in the kernel's IOPub)", every=0)
    return "".join(text)


def test_failures_on_n_ranks_are_reported_once(kernel):
    import re

    # a rank that dies in a %%mesh cell: the cell's error says so, once
    _ok(kernel.execute("%mesh alloc fo --per-host procs=2 --no-progress"))
    kernel.track_processes()
    r = kernel.execute("%%mesh fo\nimport os\nif current_rank().rank == 1:\n    os.abort()\n")
    text = r["stderr"] + _error_text(r)
    assert "1 of 2 ranks failed on fo: ProcDied" in text
    assert text.count("Fatal Python error: Aborted") == 1, text  # the dump, streamed live
    assert "its stderr is above ([fo 1] lines)" in text, text
    # a failing __init__ on every proc: one report naming the ranks (no report of fo's
    # rank, which the cell showed: a report of it would have come first)
    _ok(kernel.execute("%mesh alloc fi --per-host procs=4 --no-progress"))
    kernel.track_processes()
    _ok(kernel.execute("from runtime import Actor, endpoint\n"
                       "class Bad(Actor):\n    def __init__(self):\n"
                       "        raise ValueError('boom in init')\n"
                       "    @endpoint\n    def f(self) -> int:\n        return 1\n"))
    kernel.kc.execute("bad = fi.spawn('bad', Bad)")

    def named(err: str) -> set[int]:
        got: set[int] = set()
        for pat in (r"the same failure on ranks? ([\d, -]+) of 'bad'",
                    r"MeshFailure: mesh 'bad' rank\(s\) \[(\d+)\]",
                    r"mesh 'bad' ranks? ([\d, -]+) \([^)]*\) failed too"):
            for m in re.finditer(pat, err):
                got |= _ranks_in(m.group(1))
        return got

    err = _stderr_until(kernel, lambda t: named(t) == {0, 1, 2, 3}, 60,
                        "a report naming every rank of bad")
    assert err.count("[monarch] unhandled failure:\n") == 1, err
    assert err.count("Traceback (most recent call last)") == 1, err
    assert "mesh 'fo'" not in err, err
    # the call raises naming every rank whose __init__ failed, not only the first
    r = kernel.execute("bad.f.call().get(timeout=20)")
    assert "actor mesh 'bad' ranks 0-3 (4 of 4) failed in __init__:\n__init__ raised " \
           "ValueError: boom in init" in _error_text(r), _error_text(r)
    _ok(kernel.execute("%mesh stop fo fi"))


def test_current_rank_env_and_sync_dirs_as_a_user_expects(kernel, tmp_path):
    _ok(kernel.execute("%mesh alloc sm --per-host procs=2 --no-progress --env A=1 B=2"))
    kernel.track_processes()
    r = _ok(kernel.execute("%%mesh sm\nimport os\n"
                           "print(f'rank {current_rank}', current_rank, os.environ['B'])\n"
                           "(int(current_rank), current_rank().rank)\n"))
    assert "[sm 1] rank 1 1 2" in r["stdout"].splitlines(), r["stdout"]
    assert r["results"] == ["ValueMesh({'procs': 2}, {{procs=0}: (0, 0), {procs=1}: (1, 1)})"]
    # a file given to --dir: said so, not "does not exist"
    f = tmp_path / "single.py"
    f.write_text("S = 1\n")
    text = _usage_error(kernel.execute(f"%mesh sync sm --dir {f}"))
    assert f"workspace directory {f} is a file, not a directory: sync the directory that " \
           f"holds it ({tmp_path})" in text, text
    # two directories with one name: the magic says how to name one, and naming works
    for d, mod in (("x", "xmod"), ("y", "ymod")):
        (tmp_path / d / "src").mkdir(parents=True)
        (tmp_path / d / "src" / f"{mod}.py").write_text(f"V = {mod!r}\n")
    x, y = tmp_path / "x" / "src", tmp_path / "y" / "src"
    text = _usage_error(kernel.execute(f"%mesh sync sm --dir {x} --dir {y}"))
    assert f"would both land on 'src' on the hosts; name one: --dir OTHER_NAME={y}" in text
    _ok(kernel.execute(f"%mesh sync sm --dir {x} --dir ysrc={y}"))
    r = _ok(kernel.execute("%%mesh sm --ranks procs=0\nimport xmod, ymod\n(xmod.V, ymod.V)\n"))
    assert r["results"] == ["ValueMesh({}, {{}: ('xmod', 'ymod')})"], r
    _ok(kernel.execute("%mesh stop sm"))


def test_a_call_in_flight_when_its_mesh_is_stopped_says_the_mesh_was_stopped(kernel):
    _ok(kernel.execute("%mesh alloc sf --per-host procs=2 --no-progress"))
    kernel.track_processes()
    _ok(kernel.execute("import time\nfrom runtime import Actor, endpoint\n"
                       "class Slow(Actor):\n    @endpoint\n    def slow(self) -> int:\n"
                       "        time.sleep(60)\n        return 1\n"
                       "slow = sf.spawn('slow', Slow)\nslow.initialized.get(timeout=30)\n"
                       "inflight = slow.slow.call()\n"))
    _ok(kernel.execute("%mesh stop sf"))
    r = kernel.execute("inflight.get(timeout=30)")
    text = _error_text(r)
    assert r["error"]["ename"] == "MeshStoppedError", text
    assert "proc mesh 'sf' was stopped while the call was in flight (rank " in text, text
    assert "is dead" not in text, text


def test_the_cell_after_an_interrupt_says_it_waits_for_a_rank_stuck_in_a_c_call(kernel,
                                                                                 tmp_path):
    from test_kernel_client import interrupt_cell_error

    _ok(kernel.execute("%mesh alloc ic --per-host procs=1 --no-progress"))
    kernel.track_processes()
    # the C call: a select on a FIFO, which returns when the test writes to it (or after
    # 60 s), not at a fixed time that the interrupt and the next cell must fit in
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    err = interrupt_cell_error(kernel, f"%%mesh ic\nimport os, select\n"
                                       f"fd = os.open({str(fifo)!r}, os.O_RDWR)\n"
                                       "print('stuck', flush=True)\n"
                                       "select.select([fd], [], [], 60)\n", "stuck")
    text = "\n".join(err["traceback"])
    assert err["ename"] == "MeshCellInterrupted", err
    assert "a C call sees Ctrl-C only when it returns: the next cell there waits" in text, text

    def release(res: dict) -> None:  # once the next cell has said that it waits
        if "still runs the interrupted cell" in res["stdout"] and not released:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"x")
            os.close(fd)
            released.append(True)

    released: list = []
    # the next cell waits for the C call to end: it says so first, then runs
    r = _ok(kernel.execute("%%mesh ic\n'next'\n", timeout=60, on_stream=release))
    assert "%%mesh ic: rank 0 still runs the interrupted cell " in r["stdout"], r["stdout"]
    assert "this cell starts there when it ends" in r["stdout"], r["stdout"]
    assert r["results"] == ["ValueMesh({'procs': 1}, {{procs=0}: 'next'})"], r
    # once it has ended, no such line
    r = _ok(kernel.execute("%%mesh ic\n'again'\n"))
    assert "still runs" not in r["stdout"], r["stdout"]
    _ok(kernel.execute("%mesh stop ic"))


def test_a_spawn_with_the_class_from_before_a_reload_says_what_to_do(kernel, tmp_path):
    ws = tmp_path / "ws_stale"
    ws.mkdir()
    src = ("from runtime import Actor, endpoint\n"
           "class Tr(Actor):\n    @endpoint\n    def a(self) -> int:\n        return 1\n")
    (ws / "stalemod.py").write_text(src)
    _ok(kernel.execute("%mesh alloc sr --per-host procs=1 --no-progress"))
    kernel.track_processes()
    _ok(kernel.execute(f"import sys\nsys.path.insert(0, {str(ws)!r})\nimport stalemod\n"))
    _ok(kernel.execute(f"%mesh sync sr --dir {ws}"))
    _ok(kernel.execute("tr = sr.spawn('tr', stalemod.Tr)\ntr.a.call().get(timeout=30)"))
    (ws / "stalemod.py").write_text(src + "    @endpoint\n    def b(self) -> int:\n"
                                          "        return 2\n")
    _ok(kernel.execute(f"%mesh sync sr --dir {ws} --reload"))
    r = _ok(kernel.execute("tr.b.call_one().get(timeout=30)"))  # the live actors have it
    assert r["results"] == ["2"], r
    # a fresh spawn with the notebook's copy (not reloaded): the refusal says what to do
    r = kernel.execute("tr2 = sr.spawn('tr2', stalemod.Tr)\ntr2.b.call_one().get(timeout=30)")
    text = _error_text(r)
    assert "Tr has no endpoint 'b' (its endpoints: a). Live actors of 'tr' run Tr as " \
           "reloaded, which has it; 'tr2' was spawned with the controller's copy of Tr " \
           "from before the reload" in text, text
    assert "importlib.reload(stalemod) and `from stalemod import Tr` again, then spawn " \
           "again" in text, text
    # doing so works
    r = _ok(kernel.execute("import importlib\nimportlib.reload(stalemod)\n"
                           "tr3 = sr.spawn('tr3', stalemod.Tr)\n"
                           "tr3.b.call_one().get(timeout=30)"))
    assert r["results"] == ["2"], r
    _ok(kernel.execute(f"sys.path.remove({str(ws)!r})\n%mesh stop sr"))


def test_two_agents_on_one_machine_have_distinct_names_in_reports(kernel):
    import re
    import socket

    host = re.escape(socket.gethostname())
    r = _ok(kernel.execute("%mesh alloc tw --job local --hosts 2 --per-host procs=1 "
                           "--no-progress", timeout=90))
    assert not any("local agents" in d for d in r["displays"]), r  # --no-progress: no bar
    kernel.track_processes()
    r = _ok(kernel.execute("%mesh logs tw --tail 1"))
    named = dict(re.findall(rf"== tw rank (\d) \(pid \d+, ({host}:\d+), started", r["stdout"]))
    assert set(named) == {"0", "1"} and named["0"] != named["1"], r["stdout"]
    r = kernel.execute("%%mesh tw\nimport os\nif current_rank().rank == 1:\n    os._exit(3)\n")
    assert f"exited with code 3 (host {named['1']}, pid " in _error_text(r), _error_text(r)
    _ok(kernel.execute("%mesh stop tw"))


def test_errors_raised_at_the_call_site_show_the_users_line_not_runtime_frames(kernel):
    _ok(kernel.execute("%mesh alloc cs --per-host procs=1 --no-progress"))
    kernel.track_processes()
    _ok(kernel.execute("from runtime import Actor, endpoint\n"
                       "class Fails(Actor):\n    @endpoint\n    def f(self) -> int:\n"
                       "        raise ValueError('bad input')\n"
                       "fails = cs.spawn('fails', Fails)\n"))
    r = kernel.execute("fails.f.call_one().get(timeout=30)")  # an ActorError from .get()
    text = _error_text(r)
    assert r["error"]["ename"] == "ActorError" and "bad input" in text, text
    assert "future.py" not in text, text
    _ok(kernel.execute("%mesh stop cs"))
    r = kernel.execute("fails.f.call()")  # a stopped mesh, raised by the call itself
    text = _error_text(r)
    assert r["error"]["ename"] == "MeshStoppedError", text
    assert "fails.f.call()" in text and "adverbs.py" not in text, text
