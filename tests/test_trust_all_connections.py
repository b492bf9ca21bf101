"""Monarch's `ca="trust_all_connections"`: workers and attaches that use this user's key file.

Every test points the user key (MONARCH_USER_KEY_FILE) at its own temporary directory,
starts its workers as subprocesses on loopback and kills them by pid.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
import time

import pytest

from runtime import Future, attach_to_workers, run_worker_loop_forever
from _actors import Echo

pytestmark = pytest.mark.timeout(90)

TRUST_ALL = "trust_all_connections"


@pytest.fixture
def user_key(tmp_path, monkeypatch):
    """This test's user key file (made on first use), in a directory of the test's own."""
    path = tmp_path / "user-key" / "user.key"
    monkeypatch.setenv("MONARCH_USER_KEY_FILE", str(path))
    monkeypatch.delenv("MONARCH_KEY_FILE", raising=False)
    return path


@pytest.fixture
def workers():
    """Start `run_worker_loop_forever(address, ca=...)` subprocesses; killed by pid after."""
    started: list[subprocess.Popen] = []

    def start(address: str, key_file: object = None, pass_fds: tuple = ()) -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        if key_file is not None:
            env["MONARCH_USER_KEY_FILE"] = str(key_file)
        code = ("from runtime import run_worker_loop_forever; "
                f"run_worker_loop_forever({address!r}, ca={TRUST_ALL!r})")
        p = subprocess.Popen([sys.executable, "-c", code], env=env, pass_fds=pass_fds)
        started.append(p)
        return p

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_trust_all_workers_attached_run_actors(user_key, workers, tmp_path):
    """Workers on ipc, on an inherited bound socket (`fdN`) and on an alias
    (`dial_to@bind_to`, a Future of it here) share this user's key, made on first use with
    mode 0600 in a 0700 directory; the host mesh's shutdown ends them."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    fd_port = held.getsockname()[1]
    port = free_port()
    procs = [workers(f"ipc://{tmp_path}/w0"),
             workers(f"tcp://127.0.0.1:fd{held.fileno()}", pass_fds=(held.fileno(),)),
             workers(f"tcp://127.0.0.1:{port}@tcp://0.0.0.0:{port}")]
    held.close()

    async def alias() -> str:
        return f"tcp://127.0.0.1:{port}@tcp://0.0.0.0:{port}"

    hosts = attach_to_workers(ca=TRUST_ALL, timeout=30, workers=[
        f"ipc://{tmp_path}/w0", f"tcp://127.0.0.1:{fd_port}", Future._from_coro(alias())])
    assert stat.S_IMODE(user_key.stat().st_mode) == 0o600
    assert stat.S_IMODE(user_key.parent.stat().st_mode) == 0o700
    pm = hosts.spawn_procs(per_host={"procs": 2})
    vm = pm.spawn("trusted", Echo).whoami.call().get(timeout=60)
    assert sorted(v["rank"] for v in vm.values()) == list(range(6))
    assert len({v["pid"] for v in vm.values()}) == 6
    hosts.shutdown().get()
    for p in procs:  # run_worker_loop_forever returns when its host mesh is shut down
        assert p.wait(20) == 0


def test_worker_with_another_key_is_refused(user_key, workers, tmp_path):
    """A worker holding another user key refuses the CurveZMQ handshake: the attach fails
    within its timeout, naming the worker and the key, and nothing hangs."""
    other = tmp_path / "other-user" / "user.key"
    port = free_port()
    p = workers(f"tcp://127.0.0.1:{port}", key_file=other)
    deadline = time.monotonic() + 30
    while not other.exists():  # the worker made its (different) key: it is up
        assert p.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    with pytest.raises(TimeoutError, match=rf"(?s)no answer within 3 s.*{port}.*"
                                           rf"{re.escape(str(user_key))}.*another key"):
        attach_to_workers(ca=TRUST_ALL, workers=[f"tcp://127.0.0.1:{port}"], timeout=3)
    assert p.poll() is None  # the worker is unharmed: its owner may still attach


def test_key_not_private_to_this_user_is_refused(user_key):
    """A user key (or its directory) others can reach, or a link, is refused by name
    before anything listens or is dialed."""
    addr = ["tcp://127.0.0.1:9"]
    key, key_dir = re.escape(str(user_key)), re.escape(str(user_key.parent))
    user_key.parent.mkdir()
    user_key.parent.chmod(0o755)
    with pytest.raises(PermissionError, match=rf"{key_dir} has mode 0o755.*chmod 700"):
        attach_to_workers(ca=TRUST_ALL, workers=addr)
    user_key.parent.chmod(0o700)
    user_key.write_text("{}")
    user_key.chmod(0o644)
    with pytest.raises(PermissionError, match=rf"{key} has mode 0o644.*chmod 600"):
        run_worker_loop_forever("tcp://127.0.0.1:0", ca=TRUST_ALL)
    user_key.unlink()
    target = user_key.with_name("elsewhere.key")
    target.write_text("{}")
    user_key.symlink_to(target)
    with pytest.raises(PermissionError, match=rf"{key} is not a regular file"):
        attach_to_workers(ca=TRUST_ALL, workers=addr)
    if os.getuid() == 0:  # root can give the file away: another owner is refused too
        user_key.unlink()
        user_key.write_text("{}")
        user_key.chmod(0o600)
        os.chown(user_key, 65534, 65534)
        with pytest.raises(PermissionError, match=rf"{key} belongs to uid 65534"):
            attach_to_workers(ca=TRUST_ALL, workers=addr)
