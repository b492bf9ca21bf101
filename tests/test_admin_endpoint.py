"""The admin endpoint: loopback only, token required, connection file 0600, JSON requests."""

from __future__ import annotations

import json
import os
import stat
import threading
import time

import pytest
import zmq

from runtime.admin import (AdminClient, AdminError, AdminServer, ConnectionFileError,
                           newest_connection_file, read_connection_file)
from runtime.future import Future
from runtime.supervision.health import ActorHealth, ActorState, HealthModel, ProcStats

pytestmark = pytest.mark.timeout(30)


class FakeMesh:
    def __init__(self, name: str) -> None:
        self.name = name
        self.stopped = 0

    def stop(self) -> Future:
        self.stopped += 1
        f: Future = Future()
        f.set_result(None)
        return f


class FakeRuntime:
    """The runtime surface the admin server uses, backed by a real HealthModel."""

    def __init__(self) -> None:
        self.health = HealthModel()
        self.health.add_mesh("trainers", "procs", {"gpus": 2}, [
            ActorHealth("trainers", r, {"gpus": r}, ActorState.IDLE, proc_id=f"p{r}",
                        host="localhost", pid=1000 + r) for r in range(2)])
        self.health.update_proc(ProcStats("p0", "localhost", 1000, 12.5, 1 << 20))
        self.killed: list[str] = []
        self.reasons: list[str] = []
        self.mesh = FakeMesh("trainers")

    def meshes(self) -> list[FakeMesh]:
        return [self.mesh]

    def output_tail(self, proc_id: str) -> list[str]:
        return [f"{proc_id} line {i}" for i in range(5)]

    def dump_stack(self, proc_id: str) -> Future:
        f: Future = Future()
        threading.Timer(0.05, f.set_result, args=(f"Thread 0x1 (most recent call first):\n"
                                                  f"  File \"{proc_id}.py\", line 1",)).start()
        return f

    def kill_proc(self, proc_id: str, sig: int = 9, reason: str = "",
                  injected: bool = False) -> None:
        self.killed.append(proc_id)
        self.reasons.append(reason)


@pytest.fixture
def server(tmp_path):
    rt = FakeRuntime()
    srv = AdminServer(rt, directory=tmp_path / "run")
    yield srv
    srv.close()


def test_connection_file_is_user_only_and_removed_at_close(tmp_path):
    srv = AdminServer(FakeRuntime(), directory=tmp_path / "run")
    path = srv.connection_file
    assert path is not None and path.exists()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    info = json.loads(path.read_text())
    assert info["pid"] == os.getpid() and info["token"] == srv.token
    assert info["address"].startswith("tcp://127.0.0.1:")
    srv.close()
    assert not path.exists()


def test_listens_on_loopback_only(server):
    import psutil

    port = int(server.address.rsplit(":", 1)[1])
    mine = [c for c in psutil.Process().net_connections(kind="tcp")
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN]
    assert [c.laddr.ip for c in mine] == ["127.0.0.1"]


def test_requests_with_token(server):
    with AdminClient.from_connection_file(server.connection_file, timeout=5) as c:
        assert c.ping()["pid"] == os.getpid()
        snap = c.snapshot()
        assert [m.name for m in snap] == ["trainers"]
        assert [a.state for a in snap[0].actors] == [ActorState.IDLE, ActorState.IDLE]
        assert snap[0].procs[0].cpu_percent == 12.5
        assert c.output_tail("p1", n=2) == ["p1 line 3", "p1 line 4"]
        assert "p0.py" in c.dump_stack("p0")
        assert c.kill_proc("p1") is True
        assert server.rt.killed == ["p1"]
        assert server.rt.reasons == ["killed by the user (monarch-admin)"]
        assert c.stop_mesh("trainers") == 1
        assert server.rt.mesh.stopped == 1
        with pytest.raises(AdminError, match="no live mesh named 'nope'"):
            c.stop_mesh("nope")
        with pytest.raises(AdminError, match="unknown request 'frobnicate'"):
            c.call("frobnicate")


def test_registered_handler(server):
    server.register("debug_list", lambda: [{"mesh": "trainers", "rank": 1}])
    with pytest.raises(ValueError):
        server.register("", lambda: None)
    with AdminClient(server.address, server.token, timeout=5) as c:
        assert c.call("debug_list") == [{"mesh": "trainers", "rank": 1}]
        assert "debug_list" in c.call("requests")


def test_without_token_gets_nothing(server, caplog):
    with AdminClient(server.address, "0" * 64, timeout=0.5) as c:
        with pytest.raises(AdminError, match="no reply"):
            c.snapshot()
    # a raw peer sending garbage or a token-less request also gets no reply at all
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.address)
    try:
        sock.send_multipart([b"", b"\x80\x04not json"])
        sock.send_multipart([b"", json.dumps({"op": "snapshot", "id": 1}).encode()])
        sock.send_multipart([b"", json.dumps({"op": "snapshot", "token": None}).encode()])
        assert sock.poll(500) == 0
    finally:
        sock.close(0)
    deadline = time.time() + 2
    while server.rejected < 4 and time.time() < deadline:
        time.sleep(0.02)
    assert server.rejected == 4
    assert "bad token" in caplog.text
    # and the server still serves the rightful client afterwards
    with AdminClient(server.address, server.token, timeout=5) as c:
        assert c.ping()["pid"] == os.getpid()


def test_connection_file_checks(tmp_path):
    srv = AdminServer(FakeRuntime(), directory=tmp_path)
    try:
        assert newest_connection_file(tmp_path) == srv.connection_file
        os.chmod(srv.connection_file, 0o644)
        with pytest.raises(ConnectionFileError, match="expected 0600"):
            read_connection_file(srv.connection_file)
    finally:
        srv.close()
    stale = tmp_path / "admin-999999999-1.json"
    stale.write_text("{}")
    with pytest.raises(ConnectionFileError, match="no connection file"):
        newest_connection_file(tmp_path)
    with pytest.raises(ConnectionFileError, match="does not exist"):
        read_connection_file(tmp_path / "missing.json")


def test_client_refuses_non_loopback():
    with pytest.raises(ValueError, match="127.0.0.1 only"):
        AdminClient("tcp://10.0.0.1:5555", "x")


def test_snapshot_leaves_internal_meshes_out_unless_asked(server):
    server.rt.health.add_mesh("trainers.cells", "procs", {"gpus": 2}, [
        ActorHealth("trainers.cells", r, {"gpus": r}, ActorState.IDLE) for r in range(2)],
        internal=True)
    with AdminClient.from_connection_file(server.connection_file, timeout=5) as c:
        assert [m.name for m in c.snapshot()] == ["trainers"]
        both = {m.name: m.internal for m in c.snapshot(internal=True)}
        assert both == {"trainers": False, "trainers.cells": True}
