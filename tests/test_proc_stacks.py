"""Stacks taken from outside a proc with py-spy, run by its host agent (runtime/stacks.py,
`runtime.proc_stacks`): a proc stuck in C with the GIL held, which the in-process dump
cannot answer, shows the GIL holder with its native frames and continues afterwards; a
Python deadlock shows both waiting threads; a missing py-spy lists where it was looked for;
a refused ptrace names the setting to change; a py-spy that hangs is killed at the bound."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import runtime
from runtime import stacks
from tests._observe_actors import Worker

pytestmark = pytest.mark.timeout(150)
ROOT = Path(__file__).resolve().parent.parent
HAVE_PY_SPY = stacks.find_py_spy()[0] is not None
needs_py_spy = pytest.mark.skipif(not HAVE_PY_SPY, reason="py-spy is not installed "
                                  "(pip install 'monarch-notebook[stacks]')")


def _until(fn, what: str, timeout: float = 30.0):
    """Call fn() until it returns something true (bounded); returns that."""
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}; last: {got!r}")
        time.sleep(0.2)


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o700)
    return str(path)


@pytest.fixture
def one_proc():
    # a proc holding its GIL sends no heartbeat, but its agent says it runs: not failed
    pm = runtime.this_host().spawn_procs(per_host={"procs": 1}, name="stk")
    try:
        yield pm, pm.spawn("w", Worker)
    finally:
        pm.stop().get(timeout=30)


@needs_py_spy
def test_a_proc_stuck_in_c_with_the_gil_held(one_proc, tmp_path):
    pm, w = one_proc
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    stuck = w.hold_gil_reading.call_one(str(gate))

    def holder_in_read():
        s = runtime.proc_stacks(pm, native=True)[0]
        h = s.gil_holder
        return (s, h) if h and any(f["name"] in ("read", "__libc_read", "__read")
                                   for f in h.frames) else None

    got, holder = _until(holder_in_read, "the actor thread holds the GIL inside read()")
    assert holder.name == "actor-w-0" and not got.error
    names = [f["name"] for f in holder.frames]
    assert "Worker.hold_gil_reading" in names  # its Python frames too
    native = [f for f in holder.frames if f.get("module")]
    assert native and native[0]["name"] in ("read", "__libc_read", "__read"), names[:5]
    assert "holds the GIL" in str(got) and "[native, " in str(got)
    assert {"MainThread", "actor-w-0"} <= {t.name for t in got.threads}
    with pytest.raises(TimeoutError):  # the in-process dump needs the GIL: no answer
        runtime.get_runtime().dump_stack(pm.procs[0].proc_id).get(timeout=2)
    fd = os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
    os.write(fd, b"x")
    os.close(fd)
    assert stuck.get(timeout=30) == 1  # the proc continues after py-spy read it
    assert w.step.call_one(7).get(timeout=30) == 7
    python_only = runtime.proc_stacks(w, rank=0)[0]
    assert not any(f.get("module") for t in python_only.threads for f in t.frames)
    assert python_only.gil_holder is None or python_only.gil_holder.name != "actor-w-0"


@needs_py_spy
def test_monarch_admin_takes_py_spy_stacks_through_the_admin_endpoint(one_proc):
    from runtime.admin import AdminClient, serve

    pm, w = one_proc
    w.step.call_one(1).get(timeout=30)
    server = serve(runtime.get_runtime())
    with AdminClient(server.address, server.token, timeout=30) as c:
        text = c.py_spy_stack(pm.procs[0].proc_id, native=True)
        assert "== stk rank 0" in text and "'actor-w-0'" in text and "[native, " in text
        assert "unknown proc nope" in str(pytest.raises(Exception, c.py_spy_stack, "nope").value)


@needs_py_spy
def test_a_python_deadlock_shows_both_waiting_threads_and_two_dumps_at_once(one_proc):
    pm, w = one_proc
    assert w.deadlock.call_one().get(timeout=30) == ["deadlock-a", "deadlock-b"]

    def both_waiting():
        s = runtime.proc_stacks(pm, rank=0)[0]
        tops = {t.name: t.frames[0]["name"] for t in s.threads if t.frames}
        return s if all(tops.get(n, "").endswith(".grab") for n in ("deadlock-a", "deadlock-b"))\
            else None

    s = _until(both_waiting, "both deadlocked threads wait in grab()")
    text = str(s)
    assert "'deadlock-a'" in text and "'deadlock-b'" in text
    assert text.count("Worker.deadlock.<locals>.grab (_observe_actors.py:") == 2, text
    got: list = []
    ts = [threading.Thread(target=lambda: got.append(runtime.proc_stacks(pm)[0]))
          for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert len(got) == 2 and all(g.threads and not g.error for g in got), got


def test_without_py_spy_the_error_lists_where_it_looked(one_proc, tmp_path, monkeypatch):
    pm, w = one_proc
    missing = str(tmp_path / "no-such" / "py-spy")
    with runtime.configured(py_spy=missing):
        s = runtime.proc_stacks(w)[0]
    assert s.threads == [] and "py-spy not found; looked at " + missing in s.error
    assert "!! py-spy not found" in str(s)
    # the agent's own search: PYSPY_BIN, this Python's bin/, PATH (here, without the agent)
    monkeypatch.setenv("PYSPY_BIN", str(tmp_path / "x" / "py-spy"))
    monkeypatch.setenv("PATH", f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    expected = [str(tmp_path / d / "py-spy") for d in ("x", "venv/bin", "a", "b")]
    with pytest.raises(stacks.StacksError) as e:
        stacks.run_py_spy(os.getpid())
    assert e.value.searched == expected
    assert all(p in str(e.value) for p in expected)


@needs_py_spy
def test_a_refused_ptrace_names_the_setting(one_proc, tmp_path):
    pm, w = one_proc
    if os.getuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run py-spy as another user")
    real = stacks.find_py_spy()[0]
    nobody = _script(tmp_path / "py-spy-as-nobody", "exec setpriv --reuid=65534 "
                     "--regid=65534 --clear-groups --inh-caps=-all --bounding-set=-all "
                     f"{real} \"$@\"")
    os.chmod(tmp_path, 0o755)
    with runtime.configured(py_spy=nobody):
        s = runtime.proc_stacks(w)[0]
    assert "may not trace pid" in s.error and "Permission" in s.error, s.error
    assert w.step.call_one(1).get(timeout=30) == 1  # the proc was not left stopped
    # what the diagnosis says for each Yama scope, and without CAP_SYS_PTRACE
    no_cap = tmp_path / "status"
    no_cap.write_text("Name:\tx\nCapEff:\t0000000000000000\n")
    for scope, words in (("1", "kernel.yama.ptrace_scope=0"), ("2", "CAP_SYS_PTRACE"),
                         ("3", "fixed until reboot")):
        f = tmp_path / f"scope{scope}"
        f.write_text(scope + "\n")
        text = stacks.ptrace_diagnosis(os.getpid(), str(f), str(no_cap))
        assert f"{f} is {scope}" in text and words in text, text
        assert "--cap-add SYS_PTRACE" in text  # the container's setting
    assert "ptrace_scope" not in stacks.ptrace_diagnosis(os.getpid(), str(tmp_path / "none"),
                                                         str(no_cap))


def test_a_py_spy_that_hangs_is_killed_at_the_bound(one_proc, tmp_path):
    pm, w = one_proc
    hang = _script(tmp_path / "py-spy-hangs", "exec sleep 60")
    with runtime.configured(py_spy=hang):
        s = runtime.proc_stacks(w, timeout=1)[0]
    assert "gave no stacks" in s.error and "within 1 s" in s.error, s.error
    assert w.step.call_one(2).get(timeout=30) == 2
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        runtime.proc_stacks(w, timeout=0)
    with pytest.raises(ValueError, match="rank must be an int in 0..0"):
        runtime.proc_stacks(w, rank=1)


YAMA = Path(stacks.YAMA_SCOPE)


@pytest.mark.skipif(not YAMA.exists() or YAMA.read_text().strip() != "1",
                    reason="needs Yama with ptrace_scope=1 (this machine has "
                           + (f"ptrace_scope={YAMA.read_text().strip()})" if YAMA.exists()
                              else "no Yama)"))
@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv to run the runtime as an unprivileged user")
@needs_py_spy
def test_pr_set_ptracer_admits_the_agents_py_spy_under_ptrace_scope_1(tmp_path):
    """Unprivileged, under ptrace_scope=1, py-spy (the agent's child) is no ancestor of the
    proc (the zygote's child): only the proc's PR_SET_PTRACER to its agent lets it in."""
    os.chmod(tmp_path, 0o777)
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import runtime
        from tests._observe_actors import Worker
        pm = runtime.this_host().spawn_procs(per_host={{"procs": 1}})
        w = pm.spawn("w", Worker)
        w.step.call_one(1).get(timeout=60)
        s = runtime.proc_stacks(w)[0]
        print("ERROR" if s.error else "OK", s.error)
        pm.stop().get(timeout=30)
    """)
    env = {**os.environ, "MONARCH_RUNTIME_DIR": str(tmp_path / "rt"), "HOME": str(tmp_path),
           "MONARCH_PY_SPY": stacks.find_py_spy()[0]}
    p = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                          "--inh-caps=-all", "--bounding-set=-all", sys.executable, "-c", code],
                         cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()
    assert "OK" in out, out[-3000:]


def test_the_runtimes_own_threads_come_after_the_programs():
    """A helper thread (`monarch-*`: the jedi warm-up of %%mesh completion, the I/O thread)
    does not top the stacks, even when py-spy lists it first and it holds the GIL."""
    data = {"threads": [
        {"thread_name": "monarch-jedi-warmup", "thread_id": 3, "owns_gil": True,
         "active": True},
        {"thread_name": "actor-trainers-0", "thread_id": 2, "active": True},
        {"thread_name": "monarch-io-p-0", "thread_id": 4},
        {"thread_name": "MainThread", "thread_id": 1}]}
    got = stacks.threads_from(data)
    assert [t.name for t in got] == ["actor-trainers-0", "MainThread", "monarch-jedi-warmup",
                                     "monarch-io-p-0"]
    text = str(stacks.ProcStacks("trainers", 0, "h", 42, threads=got))
    assert text.index("'actor-trainers-0'") < text.index("Thread 3 'monarch-jedi-warmup'")
