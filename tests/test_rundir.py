"""The per-user runtime root (runtime/rundir.py): names, the sweep's rules, the checks.

Entries of this layout live as long as their creator holds their lock, whatever the pid
namespace; entries of the older layout (`<kind>-<pid>-<start>-...`) keep the pid rule.
Every test that starts processes has a timeout and kills them by pid.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from runtime import rundir
from _procs import end_popen, stop_all_threads
from _util import wait_until

ROOT = str(Path(__file__).resolve().parents[1])


def test_sweep_removes_only_entries_of_gone_processes(tmp_path):
    """Entries of the older layout: removed when their creator's pid is gone or reused."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_pid = p.pid
    start = rundir.process_start_time(dead_pid) or 1
    p.wait(10)
    me = rundir.tag()
    mine_pid, mine_start = (int(x) for x in me.split("-"))
    names = {
        f"run-{dead_pid}-{start}-abcd1234": "dir",  # creator gone: removed
        f"admin-{dead_pid}-{start}-4242.json": "file",  # likewise
        f".admin-{dead_pid}-{start}-xyz": "file",  # a half-written connection file
        f"rdma-{mine_pid}-{mine_start + 1}-reused": "dir",  # our pid, another start: reused pid
        f"run-{me}-live": "dir",  # a live process's: kept
        "notes.txt": "file",  # not the runtime's: kept
        "run-notanumber-x": "dir",  # not the runtime's name: kept
    }
    for name, kind in names.items():
        if kind == "dir":
            (tmp_path / name).mkdir()
            (tmp_path / name / "sock").write_text("")
        else:
            (tmp_path / name).write_text("{}")
    removed = rundir.sweep(tmp_path)
    assert sorted(removed) == sorted([f"run-{dead_pid}-{start}-abcd1234",
                                      f"admin-{dead_pid}-{start}-4242.json",
                                      f".admin-{dead_pid}-{start}-xyz",
                                      f"rdma-{mine_pid}-{mine_start + 1}-reused"])
    assert sorted(os.listdir(tmp_path)) == sorted(["notes.txt", f"run-{me}-live",
                                                  "run-notanumber-x"])


@pytest.mark.skipif(os.getuid() != 0, reason="making another user's file needs root")
def test_sweep_never_touches_another_users_entry(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(10)
    theirs = tmp_path / f"run-{p.pid}-1-theirs"
    theirs.mkdir()
    os.chown(theirs, 12345, 12345)
    assert rundir.sweep(tmp_path) == []
    assert theirs.exists()


def test_root_is_private_and_checked(tmp_path, monkeypatch):
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "r"
    link.symlink_to(target)
    monkeypatch.setenv("MONARCH_RUNTIME_DIR", str(link))
    with pytest.raises(rundir.RuntimeRootError, match="not a directory"):
        rundir.root()
    monkeypatch.setenv("MONARCH_RUNTIME_DIR", str(tmp_path / "ok"))
    d = rundir.root()
    assert (os.stat(d).st_mode & 0o777) == 0o700


def test_socket_directories_leave_a_long_root_for_a_short_one(tmp_path, monkeypatch):
    long_root = tmp_path / ("x" * 60)
    monkeypatch.setenv("MONARCH_RUNTIME_DIR", str(long_root))
    assert rundir.root() == long_root
    short = rundir.socket_root(create=False)
    existed = short.exists()
    d = rundir.make_dir("run")
    try:
        assert len(d) + 1 + 33 <= 107
        assert os.path.dirname(d) == str(short) != str(long_root)
        assert os.path.basename(d).startswith(f"run-{rundir.tag()}_")
        assert rundir.roots() == [long_root, short]
    finally:
        rundir.remove_dir(d)
        if not existed:
            try:
                short.rmdir()
            except OSError:
                pass


# -- this layout: liveness by lock --------------------------------------------------------
@pytest.fixture
def own_root(monkeypatch):
    """A runtime root of this test's own (short enough for socket paths), removed after."""
    d = Path(tempfile.mkdtemp(prefix="mrd-"))
    monkeypatch.setenv("MONARCH_RUNTIME_DIR", str(d))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def started():
    """Processes a test starts (and pids it learns of): killed by pid and reaped after."""
    procs: list[subprocess.Popen] = []
    pids: list[int] = []
    yield procs, pids
    for p in procs:
        if p.poll() is None:
            p.kill()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            pass
    for pid in pids:
        try:
            q = psutil.Process(pid)
            q.kill()
            q.wait(10)
        except psutil.Error:
            pass
    for p in procs:  # after the pids: a reader thread waits on a pipe that they held open
        if p.stdout is not None:
            p.stdout.close()


def _env(root: Path) -> dict:
    return {**os.environ, "MONARCH_RUNTIME_DIR": str(root),
            "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])}


def _lines(p: subprocess.Popen) -> "queue.Queue[str | None]":
    """The lines `p` prints, read by a thread (None at the end)."""
    q: "queue.Queue[str | None]" = queue.Queue()

    def pump() -> None:
        for line in p.stdout:
            q.put(line)
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


def _expect(q: "queue.Queue[str | None]", word: str, err: Path, timeout: float = 90) -> list:
    try:
        line = q.get(timeout=timeout)
    except queue.Empty:
        line = None
    assert line is not None and line.startswith(word), (line, err.read_text()[-3000:])
    return line.split()[1:]


def _tree(d: Path) -> set[str]:
    out = set()
    for top, dirs, files in os.walk(d):
        out.update(os.path.join(top, n) for n in dirs + files)
    return out


def _held_in(root) -> list[str]:
    """The entries under `root` this process holds (the test session's own runtime holds
    others, in the session's root)."""
    return sorted(p for p in rundir.held() if p.startswith(str(root) + os.sep))


def test_locked_entries_are_kept_while_held_and_swept_once_free(own_root):
    """An entry of this layout stays while its lock is held, by any process (this one
    too), and goes once nobody holds it, whatever pid its name carries."""
    mine = rundir.make_dir("run")
    conn = rundir.write_file(own_root, f"admin-{rundir.tag()}_1234.json", b"{}")
    assert stat.S_IMODE(os.stat(mine).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(conn).st_mode) == 0o600 and conn.read_bytes() == b"{}"
    me = rundir.tag()  # named after this live process, but held by nobody:
    free = own_root / f"rdma-{me}_free"  # a dead creator's, or one of a reused pid
    free.mkdir()
    (free / rundir.LOCK).write_text("")
    (free / "data.sock").write_text("")
    unlocked = own_root / f"job-{me}_nolock"  # a creator that died before locking it
    unlocked.mkdir()
    stale = own_root / f"admin-{me}_9.json"
    stale.write_text("{}")
    assert rundir.alive(mine) and rundir.alive(conn) and not rundir.alive(stale)
    removed = rundir.sweep(own_root)
    assert sorted(removed) == sorted([free.name, unlocked.name, stale.name])
    assert sorted(os.listdir(own_root)) == sorted([os.path.basename(mine), conn.name])
    assert _held_in(own_root) == sorted([mine, str(conn)])
    rundir.remove_dir(mine)
    rundir.remove_file(conn)
    assert os.listdir(own_root) == [] and _held_in(own_root) == []


def test_entries_dropped_without_remove_dir_leave_no_descriptors(own_root):
    """A directory removed by a plain rmtree (as an owner's shutdown may) gives its lock
    back at the next make_dir: making and dropping entries all day keeps no fds."""
    first = rundir.make_dir("run")
    shutil.rmtree(first)
    kept = rundir.make_dir("run")  # closes the lock of the one removed
    assert _held_in(own_root) == [kept]
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        shutil.rmtree(rundir.make_dir("run"))
    assert _held_in(own_root) == [kept]
    assert len(os.listdir("/proc/self/fd")) <= before
    rundir.remove_dir(kept)


_FORKER = textwrap.dedent("""
    import os, subprocess, sys, time
    from runtime import rundir
    d = rundir.make_dir("run")
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # forked without exec: it must not keep its parent's directory alive
        os.write(w, b"x")  # fork() has returned here: the after-fork hooks have run
        time.sleep(120)
        os._exit(0)
    os.read(r, 1)  # (a creator that dies first leaves the lock to a child not yet run)
    spawned = subprocess.Popen(["sleep", "120"], close_fds=False)  # exec'd, fds kept
    print("FORKED", d, child, spawned.pid, flush=True)
    os._exit(0)  # a crash: nothing removed
""")


@pytest.mark.timeout(120)
def test_children_do_not_keep_a_dead_creators_entry(own_root, started, tmp_path):
    """Locks are the creator's alone: a child forked without exec closes its copy, an
    exec'd one never had it; once the creator is dead its directory is swept while they
    live on."""
    procs, pids = started
    err = tmp_path / "err"
    with open(err, "w") as ef:
        p = subprocess.Popen([sys.executable, "-c", _FORKER], env=_env(own_root),
                             stdout=subprocess.PIPE, stderr=ef, text=True)
    procs.append(p)
    d, child, spawned = _expect(_lines(p), "FORKED", err)
    pids += [int(child), int(spawned)]
    assert p.wait(60) == 0
    assert all(psutil.pid_exists(int(x)) for x in (child, spawned))
    assert os.path.isdir(d)
    assert rundir.sweep(own_root) == [os.path.basename(d)]
    assert not os.path.exists(d)


# -- across pid namespaces, and zombies ---------------------------------------------------
_UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]


@pytest.fixture(scope="module")
def unshare() -> list[str]:
    """The command prefix that runs a process in a new pid namespace, or a skip."""
    try:
        r = subprocess.run(_UNSHARE + ["true"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("unshare (util-linux) is not installed")
    if r.returncode != 0:
        pytest.skip(f"unshare --pid is not permitted here: {r.stderr.strip()[-300:]}")
    return _UNSHARE


_LIVE = textwrap.dedent("""
    import sys
    import runtime
    from runtime import this_host
    from _actors import Echo

    rt = runtime.get_runtime()
    pm = this_host().spawn_procs(per_host={"procs": 2})
    echo = pm.spawn("echo", Echo)

    def pids():
        return sorted(v["pid"] for v in echo.whoami.call().get(60).values())

    print("READY", rt.rundir, *pids(), flush=True)
    for line in sys.stdin:
        print("CALLED", *pids(), flush=True)
    runtime.shutdown()
""")
_SWEEPER = ("import runtime; from runtime import rundir; runtime.get_runtime(); "
            "print('SWEPT', *rundir.sweep(), flush=True); runtime.shutdown()")
_CRASH = "import os, runtime; print('DIR', runtime.get_runtime().rundir, flush=True); os._exit(0)"


@pytest.mark.timeout(240)
def test_controller_in_another_pid_namespace_keeps_a_live_ones_files(own_root, started,
                                                                   unshare, tmp_path):
    """A controller started in its own pid namespace sees none of the live controller's
    pids: its sweep still removes nothing of the live one, whose calls keep working."""
    procs, pids = started
    err = tmp_path / "live.err"
    with open(err, "w") as ef:
        live = subprocess.Popen([sys.executable, "-c", _LIVE], env=_env(own_root),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=ef,
                                text=True)
    procs.append(live)
    out = _lines(live)
    rd, *proc_pids = _expect(out, "READY", err, timeout=180)
    pids += [int(x) for x in proc_pids]
    before = _tree(own_root)
    assert rd in before and len(before) > 3  # its run directory, sockets, procs' entries
    sweep_err = tmp_path / "sweep.err"
    with open(sweep_err, "w") as ef:
        r = subprocess.run(unshare + [sys.executable, "-c", _SWEEPER], env=_env(own_root),
                           stdout=subprocess.PIPE, stderr=ef, text=True, timeout=120)
    assert r.returncode == 0, sweep_err.read_text()[-3000:]
    assert r.stdout.split() == ["SWEPT"], r.stdout  # nothing was theirs to sweep
    assert before <= _tree(own_root), before - _tree(own_root)
    live.stdin.write("call\n")
    live.stdin.flush()
    assert _expect(out, "CALLED", err) == proc_pids  # the same procs answer
    live.stdin.close()
    assert live.wait(60) == 0, err.read_text()[-3000:]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("dead_in", ["namespace", "here"])
def test_dead_controllers_directory_is_swept_from_either_namespace(own_root, started,
                                                                  unshare, tmp_path, dead_in):
    """A controller that crashed (here or in a pid namespace of its own) leaves its run
    directory; a sweep in the other namespace removes it."""
    procs, _ = started
    here, there = [sys.executable, "-c"], unshare + [sys.executable, "-c"]
    err = tmp_path / "err"
    with open(err, "w") as ef:
        r = subprocess.run((there if dead_in == "namespace" else here) + [_CRASH],
                           env=_env(own_root), stdout=subprocess.PIPE, stderr=ef, text=True,
                           timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("DIR"), err.read_text()[-3000:]
    d = r.stdout.split()[1]
    assert os.path.isdir(d)
    with open(err, "w") as ef:
        s = subprocess.run((here if dead_in == "namespace" else there)
                           + ["from runtime import rundir; print('SWEPT', *rundir.sweep())"],
                           env=_env(own_root), stdout=subprocess.PIPE, stderr=ef, text=True,
                           timeout=120)
    assert s.returncode == 0, err.read_text()[-3000:]
    assert os.path.basename(d) in s.stdout.split()[1:]
    assert not os.path.exists(d)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.timeout(120)
def test_a_zombies_directory_is_swept(own_root, started, tmp_path):
    """A controller that exited but is not reaped yet (a zombie: its pid and start time
    are still there) has dropped its lock: its directory is swept."""
    procs, _ = started
    err = tmp_path / "err"
    with open(err, "w") as ef:
        p = subprocess.Popen([sys.executable, "-c", _CRASH], env=_env(own_root),
                             stdout=subprocess.PIPE, stderr=ef, text=True)
    procs.append(p)
    (d,) = _expect(_lines(p), "DIR", err)
    # not reaped (no wait() or poll() until swept); a zombie once its other threads,
    # which share its descriptors, have exited too (they leave /proc/PID/task)
    deadline = time.monotonic() + 60
    while _state(p.pid) != "Z" or os.listdir(f"/proc/{p.pid}/task") != [str(p.pid)]:
        assert time.monotonic() < deadline, "the controller did not exit"
        time.sleep(0.02)
    assert rundir.process_start_time(p.pid) is not None and os.path.isdir(d)
    assert rundir.sweep(own_root) == [os.path.basename(d)]
    assert not os.path.exists(d)
    assert p.wait(10) == 0


def test_a_process_runs_unless_stopped_or_gone() -> None:
    """`runs`, what an agent says of its procs and its controller: a stopped process
    (SIGSTOP) does not run, nor a zombie, nor one whose pid names another start."""
    from runtime._base.process import runs, start_time

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = start_time(p.pid)
        assert runs(p.pid) and runs(p.pid, start)
        assert not runs(p.pid, (start or 0) + 1)
        stop_all_threads(p.pid)
        assert not runs(p.pid)
        os.kill(p.pid, signal.SIGCONT)
        wait_until(lambda: runs(p.pid), 10, what="the process running again")
        p.kill()
        wait_until(lambda: not runs(p.pid), 10, what="the killed process not running")
        assert Path(f"/proc/{p.pid}").exists()  # a zombie until reaped: not running
        p.wait(10)
        assert not runs(p.pid)
    finally:
        end_popen(p)
