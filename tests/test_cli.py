"""`python -m runtime.cli` (monarch-nb) against a live kept job started by the test: a
terminal beside the controller that owns the job (asked through its admin endpoint, the
owner stays the owner; `shell` fed on stdin), the same terminal once the owner is gone (it attaches for each
command), clear errors for bad input and for a job whose lease ended, and `kill` leaving
no process and no file."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _procs import pid_alive
from tests._util import wait_until

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parent.parent

CONTROLLER = textwrap.dedent("""
    import json, sys, time
    from runtime import Actor, endpoint
    from runtime.job import ProcessJob

    class Counter(Actor):
        def __init__(self, start):
            self.value = start

        @endpoint
        def get(self):
            return self.value

    job = ProcessJob({"hosts": 1}, keep=float(sys.argv[2]))
    hosts = job.state(cached_path=sys.argv[1]).hosts
    procs = hosts.spawn_procs(per_host={"procs": 2}, name="trainers")
    counters = procs.spawn("counters", Counter, 10)
    counters.get.call().get(timeout=60)
    print(json.dumps({"agents": sorted(job.agent_pids.values()),
                      "procs": [p.pid for p in procs.procs],
                      "workdir": str(job.workdir)}), flush=True)
    time.sleep(600)
""")


def _env() -> dict:
    return {**os.environ, "MONARCH_HEARTBEAT_TIMEOUT": "2",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _start(cwd: Path, keep: float) -> tuple:
    p = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(cwd / "job.pkl"), str(keep)],
                         cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=_env())
    line = p.stdout.readline()
    if not line:
        p.kill()
        raise AssertionError(f"controller failed: {p.stderr.read()[-3000:]}")
    return p, json.loads(line)


def cli(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runtime.cli", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


def shell(cwd: Path, *args: str, lines: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`shell` with `lines` fed on its stdin (no terminal: no prompts), then EOF."""
    return subprocess.run([sys.executable, "-m", "runtime.cli", "shell", *args], cwd=cwd,
                          env=_env(), input=lines, capture_output=True, text=True,
                          timeout=timeout)


SHELL_LINES = """\
import os
x = 41
x + 1
def f(n):
    return n * 2

f(x)
os.getpid()
1/0
y = = 2
print('after', x)
"""


def _reap(ctl, info: dict) -> None:
    """Kill what a failed test left (by pid), and the job directory its agents kept."""
    if ctl is not None and ctl.poll() is None:
        ctl.kill()
        ctl.wait(10)
    for pid in info.get("agents", []) + info.get("procs", []):
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    if ctl is not None:  # after the pids: they may hold its pipes open
        ctl.stdout.close()
        ctl.stderr.close()
    if info.get("workdir"):
        shutil.rmtree(info["workdir"], ignore_errors=True)


def _all_gone(info: dict) -> bool:
    return not any(pid_alive(p) for p in info["agents"] + info["procs"]) \
        and not Path(info["workdir"]).exists()


def _pids(out: str, mesh: str = "trainers") -> dict[int, int]:
    """rank -> pid from lines `[mesh R] pid N`."""
    found = {}
    for line in out.splitlines():
        if line.startswith(f"[{mesh} ") and "] pid " in line:
            found[int(line.split()[1].rstrip("]"))] = int(line.rsplit(" ", 1)[1])
    return found


def test_a_terminal_uses_a_job_its_notebook_owns(tmp_path):
    ctl, info = _start(tmp_path, keep=120)
    try:
        # which job: none yet, then the saved one
        r = cli(tmp_path, "status")
        assert r.returncode == 2 and "no current job" in r.stderr, r.stderr
        r = cli(tmp_path, "context", "set", "missing.pkl")
        assert r.returncode == 2 and "no saved job at 'missing.pkl'" in r.stderr, r.stderr
        r = cli(tmp_path, "context", "set", "job.pkl")
        assert r.returncode == 0, r.stderr
        assert cli(tmp_path, "context").stdout.strip() == f"current job: {tmp_path / 'job.pkl'}"
        assert f"* {tmp_path / 'job.pkl'}" in cli(tmp_path, "context", "ls").stdout

        # status through the owner: its pid, the mesh, its procs and actors
        r = cli(tmp_path, "status", "--json")
        assert r.returncode == 0, r.stderr
        st = json.loads(r.stdout)
        assert st["owner"] == {"pid": ctl.pid}
        [mesh] = st["proc_meshes"]
        assert mesh["name"] == "trainers" and mesh["actors"] == ["counters"]
        assert [p["pid"] for p in mesh["procs"]] == info["procs"]
        assert mesh["keep"] == 120

        # exec: each rank's output, tagged; one rank; a last expression's value
        r = cli(tmp_path, "exec", "--mesh", "trainers",
                "import os\nprint('pid', os.getpid())")
        assert r.returncode == 0, r.stderr
        assert _pids(r.stdout) == {0: info["procs"][0], 1: info["procs"][1]}
        r = cli(tmp_path, "exec", "--mesh", "trainers", "--rank", "1", "import os; os.getpid()")
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [f"[trainers 1] {info['procs'][1]}"]

        # errors: in the code (exit 1, its traceback per rank), and bad input (exit 2)
        r = cli(tmp_path, "exec", "--mesh", "trainers", "-r", "0", "1/0")
        assert r.returncode == 1
        assert "[trainers 0] ZeroDivisionError: division by zero" in r.stderr
        assert "clients.py" not in r.stderr  # the user's frames only
        r = cli(tmp_path, "exec", "--mesh", "nope", "pass")
        assert r.returncode == 2 and "unknown mesh 'nope'" in r.stderr, r.stderr
        assert "['trainers']" in r.stderr
        r = cli(tmp_path, "exec", "--mesh", "trainers", "--rank", "2", "pass")
        assert r.returncode == 2 and "rank 2 is out of range" in r.stderr, r.stderr

        # shell: one proc, one namespace across statements, values printed as at a prompt,
        # a block of several lines, errors (remote and syntax) on stderr and it goes on
        r = shell(tmp_path, "--mesh", "trainers", "--rank", "1", lines=SHELL_LINES)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == ["42", "82", str(info["procs"][1]), "after 41"], \
            (r.stdout, r.stderr)
        assert "shell on trainers rank 1 (host" in r.stderr and \
            f"pid {info['procs'][1]})" in r.stderr, r.stderr
        assert "ZeroDivisionError: division by zero" in r.stderr, r.stderr
        assert "SyntaxError" in r.stderr and "clients.py" not in r.stderr, r.stderr
        r = shell(tmp_path, "-m", "trainers", lines="x\n")  # rank 0, a fresh namespace
        assert r.returncode == 0 and r.stdout == "", r.stdout
        assert "NameError: name 'x' is not defined" in r.stderr, r.stderr
        r = shell(tmp_path, "-m", "nope", lines="")
        assert r.returncode == 2 and "unknown mesh 'nope'" in r.stderr, r.stderr
        r = shell(tmp_path, "-m", "trainers", "-r", "5", lines="")
        assert r.returncode == 2 and "rank 5 is out of range" in r.stderr, r.stderr
        # the shells' actors ended with them: only counters on the procs
        st = json.loads(cli(tmp_path, "status", "--json").stdout)
        assert st["proc_meshes"][0]["actors"] == ["counters"]

        # the notebook still owns the job
        assert ctl.poll() is None
        assert json.loads(cli(tmp_path, "status", "--json").stdout)["owner"] == {"pid": ctl.pid}

        # kill through the owner: nothing left, the saved file and the context gone
        r = cli(tmp_path, "kill")
        assert r.returncode == 0 and f"by its owner (pid {ctl.pid})" in r.stdout, r.stderr
        wait_until(lambda: _all_gone(info), timeout=30, every=0.1,
                   what="the job's agents, procs and directory are gone")
        assert not (tmp_path / "job.pkl").exists()
        assert not (tmp_path / ".monarch" / "current").exists()
        r = cli(tmp_path, "exec", "--mesh", "trainers", "pass")
        assert r.returncode == 2 and "no current job" in r.stderr
    finally:
        _reap(ctl, info)


def _status_once_owner_gone(cwd: Path):
    r = cli(cwd, "status", "--json", "--job", "job.pkl")  # no current job: --job names it
    if r.returncode == 2 and "serve a controller this terminal cannot ask" in r.stderr:
        return None  # the agents have not counted the killed controller as gone yet
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_terminal_attaches_when_no_controller_owns_the_job(tmp_path):
    ctl, info = _start(tmp_path, keep=120)
    try:
        ctl.send_signal(signal.SIGKILL)
        ctl.wait(10)
        st = wait_until(lambda: _status_once_owner_gone(tmp_path), timeout=60, every=0.5,
                        what="the terminal attaches once the agents count the owner as gone")
        assert st["owner"] is None
        assert [p["pid"] for p in st["proc_meshes"][0]["procs"]] == info["procs"]
        assert st["proc_meshes"][0]["actors"] == ["counters"]
        # each command attaches and leaves the kept procs to their lease when it exits
        r = cli(tmp_path, "exec", "--job", "job.pkl", "-m", "trainers",
                "import os; print('pid', os.getpid())")
        assert r.returncode == 0, r.stderr
        assert _pids(r.stdout) == {0: info["procs"][0], 1: info["procs"][1]}
        assert "no live controller owns the job" in r.stderr
        assert all(pid_alive(p) for p in info["procs"])
        r = shell(tmp_path, "--job", "job.pkl", "-m", "trainers", "-r", "1",
                  lines="import os\nos.getpid()\n")
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [str(info["procs"][1])], (r.stdout, r.stderr)
        assert all(pid_alive(p) for p in info["procs"])
        r = cli(tmp_path, "kill", "--job", "job.pkl")
        assert r.returncode == 0 and "no live controller owned it" in r.stdout, r.stderr
        wait_until(lambda: _all_gone(info), timeout=30, every=0.1,
                   what="the job's agents, procs and directory are gone")
        assert not (tmp_path / "job.pkl").exists()
    finally:
        _reap(ctl, info)


def test_a_job_whose_lease_ended_is_named_as_such(tmp_path):
    ctl, info = _start(tmp_path, keep=1)
    try:
        assert cli(tmp_path, "context", "set", "job.pkl").returncode == 0
        ctl.send_signal(signal.SIGKILL)
        ctl.wait(10)
        wait_until(lambda: _all_gone(info), timeout=60, every=0.2,
                   what="the lease ends with nobody attached")
        for args in (("status",), ("exec", "-m", "trainers", "pass"), ("kill",)):
            r = cli(tmp_path, *args)
            assert r.returncode == 2, (args, r.stdout, r.stderr)
            assert "its lease ended with no controller attached" in r.stderr, r.stderr
    finally:
        _reap(ctl, info)


def test_usage_errors_name_the_problem(tmp_path):
    r = cli(tmp_path, "exec", "--mesh", "trainers", "--rank", "-1", "pass")
    assert r.returncode == 2 and "rank -1 is out of range" in r.stderr
    r = cli(tmp_path, "exec", "--job", "nothing.pkl", "--mesh", "trainers", "pass")
    assert r.returncode == 2 and "no saved job at 'nothing.pkl'" in r.stderr
    r = cli(tmp_path, "exec", "pass")  # argparse: --mesh is required
    assert r.returncode == 2 and "--mesh" in r.stderr
    r = cli(tmp_path, "context")
    assert r.returncode == 2 and "no current job" in r.stderr
