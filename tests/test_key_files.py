"""Every key file is checked the same way, at every entry point that takes one.

`--key-file`, `key_file=`, MONARCH_KEY_FILE and the per-user key of
`ca="trust_all_connections"` all refuse, with a PermissionError naming the file and the
reason, a key file that is not a regular file owned by this user (the effective uid) with
no group or other bits, in a directory with the same properties. Processes started here
have a timeout and are killed by pid.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from runtime import attach_to_workers, run_worker_loop_forever
from runtime.job import LocalJob
from runtime.transport import auth

ROOT = str(Path(__file__).resolve().parents[1])
OTHER_UID = 65534  # nobody
TRUST_ALL = "trust_all_connections"
NOWHERE = ["tcp://127.0.0.1:9"]  # never dialed: the key is refused first


@pytest.fixture
def own_root(monkeypatch):
    """A runtime root of this test's own (short enough for socket paths), removed after."""
    d = Path(tempfile.mkdtemp(prefix="mkf-"))
    monkeypatch.setenv("MONARCH_RUNTIME_DIR", str(d))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def theirs(tmp_path, monkeypatch):
    """A valid key file of mode 0600, in a private directory of ours, owned by another
    user (root can give it away; as root we could still read it, so only a check of its
    owner against os.geteuid() refuses it)."""
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    monkeypatch.delenv("MONARCH_KEY_FILE", raising=False)
    d = tmp_path / "keys"
    d.mkdir(mode=0o700)
    k = d / "cluster.key"
    auth.write_key_file(str(k))
    os.chown(k, OTHER_UID, OTHER_UID)
    assert (os.stat(k).st_mode & 0o777) == 0o600 and os.access(k, os.R_OK)
    return k


def _refusal(path: Path, what: str = "key file") -> str:
    return (rf"{re.escape(what)} {re.escape(str(path))} belongs to uid "
            rf"{OTHER_UID}, not to this user \(uid {os.geteuid()}\)")


def _run(argv: list[str], env: dict) -> subprocess.CompletedProcess:
    env = {**env, "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])}
    return subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True,
                          timeout=120)


def test_another_users_key_is_refused_in_process(theirs, own_root, monkeypatch):
    """key_file= of attach_to_workers, run_worker_loop_forever and jobs; MONARCH_KEY_FILE
    for both; the per-user key: all refused before anything is dialed or bound."""
    with pytest.raises(PermissionError, match=_refusal(theirs, "key file (key_file=)")):
        attach_to_workers(NOWHERE, key_file=str(theirs))
    with pytest.raises(PermissionError, match=_refusal(theirs, "key file (key_file=)")):
        run_worker_loop_forever("tcp://127.0.0.1:0", key_file=str(theirs))
    with pytest.raises(PermissionError, match=_refusal(theirs, "key file (key_file=)")):
        LocalJob(hosts=1, key_file=theirs)
    monkeypatch.setenv("MONARCH_KEY_FILE", str(theirs))
    with pytest.raises(PermissionError, match=_refusal(theirs, "key file (MONARCH_KEY_FILE)")):
        attach_to_workers(NOWHERE)
    with pytest.raises(PermissionError, match=_refusal(theirs)):
        run_worker_loop_forever("tcp://127.0.0.1:0")
    monkeypatch.delenv("MONARCH_KEY_FILE")
    monkeypatch.setenv("MONARCH_USER_KEY_FILE", str(theirs))
    with pytest.raises(PermissionError, match=_refusal(theirs, "the user key file")):
        attach_to_workers(ca=TRUST_ALL, workers=NOWHERE)
    with pytest.raises(PermissionError, match=_refusal(theirs, "the user key file")):
        run_worker_loop_forever("tcp://127.0.0.1:0", ca=TRUST_ALL)
    assert os.listdir(own_root) == []  # refused before anything was made


@pytest.mark.timeout(300)
def test_another_users_key_is_refused_by_processes(theirs, own_root):
    """`python -m runtime.host --key-file`, the same with MONARCH_KEY_FILE, and a
    controller started with MONARCH_KEY_FILE: each exits with the PermissionError."""
    env = {**os.environ, "MONARCH_RUNTIME_DIR": str(own_root)}
    env.pop("MONARCH_KEY_FILE", None)
    agent = ["-m", "runtime.host", "--listen", "tcp://127.0.0.1:0"]
    r = _run(agent + ["--key-file", str(theirs)], env)
    assert r.returncode != 0 and re.search(r"PermissionError: " + _refusal(theirs, "key file (--key-file)"),
                                           r.stderr), r.stderr[-3000:]
    env["MONARCH_KEY_FILE"] = str(theirs)
    r = _run(agent, env)
    assert r.returncode != 0 and re.search(
        r"PermissionError: " + _refusal(theirs, "key file (MONARCH_KEY_FILE)"), r.stderr), r.stderr[-3000:]
    assert os.listdir(own_root) == []  # the agents refused before making anything
    r = _run(["-c", "import runtime; runtime.get_runtime()"], env)
    assert r.returncode != 0 and re.search(
        r"PermissionError: " + _refusal(theirs, "key file (MONARCH_KEY_FILE)"), r.stderr), r.stderr[-3000:]


def test_links_open_modes_and_open_directories_are_refused(tmp_path, monkeypatch):
    """The other properties, through key_file=: a link, group or other bits on the file,
    and a directory that is open to others, a link, or another user's."""
    monkeypatch.delenv("MONARCH_KEY_FILE", raising=False)
    d = tmp_path / "keys"
    d.mkdir(mode=0o700)
    k = d / "cluster.key"
    auth.write_key_file(str(k))
    assert auth.read_key_file(str(k)).public  # the private one is accepted
    q = re.escape(str(k))
    k.chmod(0o640)
    with pytest.raises(PermissionError, match=rf"{q} has mode 0o640.*chmod 600"):
        attach_to_workers(NOWHERE, key_file=str(k))
    k.chmod(0o600)
    link = d / "link.key"
    link.symlink_to(k)
    with pytest.raises(PermissionError, match=rf"{re.escape(str(link))} is not a regular file"):
        attach_to_workers(NOWHERE, key_file=str(link))
    d.chmod(0o750)
    with pytest.raises(PermissionError, match=rf"directory of key file \(key_file=\) {q}, "
                                              rf"{re.escape(str(d))} has mode 0o750.*chmod 700"):
        attach_to_workers(NOWHERE, key_file=str(k))
    d.chmod(0o700)
    linked_dir = tmp_path / "linked"
    linked_dir.symlink_to(d)
    with pytest.raises(PermissionError, match=r"is not a directory \(a link"):
        attach_to_workers(NOWHERE, key_file=str(linked_dir / "cluster.key"))
    if os.geteuid() == 0:
        os.chown(d, OTHER_UID, OTHER_UID)
        with pytest.raises(PermissionError, match=rf"{re.escape(str(d))} belongs to uid "
                                                  rf"{OTHER_UID}"):
            attach_to_workers(NOWHERE, key_file=str(k))
        os.chown(d, 0, 0)


def test_keygen_makes_a_private_directory_and_refuses_an_open_one(tmp_path):
    """`keygen` writes a key file every entry point accepts, or says why it would not."""
    k = tmp_path / "new" / "cluster.key"
    assert auth.main(["keygen", str(k)]) == 0
    assert (os.stat(k.parent).st_mode & 0o777) == 0o700 and auth.read_key_file(str(k))
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o755)
    assert auth.main(["keygen", str(open_dir / "cluster.key")]) == 1
    assert not (open_dir / "cluster.key").exists()


@pytest.mark.timeout(120)
def test_the_command_lines_say_what_they_do(tmp_path, own_root):
    """`keygen` from the command line prints no runpy warning; `runtime.host --help` says
    --listen needs a key on loopback too, as the agent does; a listening agent prints one
    line saying where it listens."""
    from tests._util import wait_until

    env = {**os.environ, "MONARCH_RUNTIME_DIR": str(own_root)}
    env.pop("MONARCH_KEY_FILE", None)
    d = tmp_path / "keys"
    r = _run(["-m", "runtime.transport.auth", "keygen", str(d / "cluster.key")], env)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout == f"wrote {d / 'cluster.key'} (mode 600)\n"
    r = _run(["-m", "runtime.host", "--help"], env)
    helptext = " ".join(r.stdout.split())
    assert "unless loopback" not in helptext
    assert "loopback too, with CurveZMQ: needs --key-file or MONARCH_KEY_FILE" in helptext
    r = _run(["-m", "runtime.host", "--listen", "tcp://127.0.0.1:0"], env)
    assert r.returncode != 0 and "--listen needs a CurveZMQ key file" in r.stderr, r.stderr
    out = tmp_path / "agent.out"
    with open(out, "w") as f:
        p = subprocess.Popen([sys.executable, "-m", "runtime.host", "--listen",
                              "tcp://127.0.0.1:0", "--key-file", str(d / "cluster.key")],
                             env={**env, "PYTHONPATH": ROOT}, stdout=f,
                             stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        def whole_line() -> str:  # the line may reach the file in more than one write
            text = out.read_text()
            return text if text.endswith("\n") else ""

        line = wait_until(whole_line, 60, "the agent's first line")
        assert re.fullmatch(
            rf"monarch host agent on \S+ \(pid {p.pid}\) listening on "
            rf"tcp://127\.0\.0\.1:(\d+) with the key {re.escape(str(d / 'cluster.key'))}; "
            rf"attach_to_workers\(\['tcp://127\.0\.0\.1:\1'\], key_file=\.\.\.\) reaches it; "
            rf"stop it with kill {p.pid}\n", line), line
    finally:
        p.kill()
        p.wait(timeout=30)


@pytest.mark.timeout(120)
def test_the_agent_refuses_a_key_in_an_open_directory_in_one_line(tmp_path):
    """`python -m runtime.host --key-file` with a key in a directory others can read: one
    line naming the file and the fix, exit status 2, no traceback."""
    d = tmp_path / "open"
    d.mkdir(mode=0o700)
    k = d / "cluster.key"
    auth.write_key_file(str(k))
    d.chmod(0o755)
    env = {k_: v for k_, v in os.environ.items() if k_ != "MONARCH_KEY_FILE"}
    r = _run(["-m", "runtime.host", "--listen", "tcp://127.0.0.1:0", "--key-file", str(k)],
             env)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.strip().splitlines() == [
        f"runtime.host: PermissionError: the directory of key file (--key-file) {k}, {d} has "
        "mode 0o755, so it is readable by others; chmod 700 it"], r.stderr
