"""A controller reaching host agents only through a gateway (runtime/transport/gateway.py),
on loopback: the agents and the gateway are real processes; the namespaced cluster's test
(tests/multihost/test_gateway_multihost.py) also cuts every other route with nftables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import runtime
from runtime import Actor, attach_to_workers, endpoint, get_runtime, this_proc
from runtime.errors import ActorError
from runtime.transport import auth
from _actors import Echo

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("runtime_ends_with_the_module")]


class Counter(Actor):
    """Lives in the controller (this_proc()); procs call it back through the gateway."""

    def __init__(self) -> None:
        self.n = 0

    @endpoint
    def bump(self) -> int:
        self.n += 1
        return self.n


class Caller(Actor):
    @endpoint
    def call_home(self, counter) -> int:
        return counter.bump.call_one().get(timeout=20)

    @endpoint
    def call_singleton(self) -> int:
        from runtime import get_or_spawn_controller

        return get_or_spawn_controller("gw_counter", Counter).get(timeout=20).bump.call_one(
        ).get(timeout=20)

    @endpoint
    def fail(self) -> None:
        raise ValueError("bad step")


def _start(tmp_path, i: int, key_file: str, gateway: bool) -> tuple[subprocess.Popen, dict]:
    addr_file = tmp_path / f"agent{i}.json"
    argv = [sys.executable, "-m", "runtime.host", "--listen", "tcp://127.0.0.1:0",
            "--key-file", key_file, "--address-file", str(addr_file),
            "--parent-pid", str(os.getpid())]
    if gateway:
        argv += ["--gateway", "tcp://127.0.0.1:0"]
    log = open(tmp_path / f"agent{i}.log", "wb")
    p = subprocess.Popen(argv, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
                         stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 30
    while not addr_file.exists():
        assert p.poll() is None, "agent exited"
        assert time.monotonic() < deadline, "agent did not write its address"
        time.sleep(0.02)
    return p, json.loads(addr_file.read_text())


@pytest.fixture
def job(tmp_path):
    key_file = str(tmp_path / "cluster.key")
    auth.write_key_file(key_file)
    started = [_start(tmp_path, i, key_file, gateway=(i == 0)) for i in range(2)]
    yield key_file, started, tmp_path
    for p, _ in started:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def test_calls_streams_errors_and_controller_actors_through_the_gateway(job):
    key_file, started, _ = job
    gw = started[0][1]["gateway"]
    assert gw.startswith("tcp://127.0.0.1:")
    hosts = attach_to_workers([info["address"] for _, info in started], key_file=key_file,
                              gateway=gw)
    rt = get_runtime()
    keys = auth.read_key_file(key_file)
    # the job answers this controller at the gateway's inner address, not at a port of ours
    inner = rt.messenger.tcp_addresses()[keys.public]
    assert inner != gw and inner.startswith("tcp://")
    assert rt.loop.gateways[keys.public].inner_address == inner
    from runtime.transport.gateway import GatewayPeer

    assert all(isinstance(rt.loop.peers.out[info["address"]], GatewayPeer)
               for _, info in started)  # every agent is dialed through the gateway only
    pm = hosts.spawn_procs(per_host={"procs": 2})
    echo = pm.spawn("echo", Echo)
    got = echo.whoami.call().get(timeout=60)
    assert [v["rank"] for v in got.values()] == [0, 1, 2, 3]
    callers = pm.spawn("callers", Caller)
    assert sorted(f.get(timeout=30)["rank"] for f in echo.whoami.stream()) == [0, 1, 2, 3]
    # a this_proc() actor of the controller, called by every proc
    counter = this_proc().spawn("counter", Counter)
    got = callers.call_home.call(counter).get(timeout=60)
    assert sorted(got.values()) == [1, 2, 3, 4]
    # a get_or_spawn_controller() singleton, asked for and called by every proc
    got = callers.call_singleton.call().get(timeout=60)
    assert sorted(got.values()) == [1, 2, 3, 4]
    with pytest.raises(ActorError, match="bad step"):
        callers.slice(hosts=1, procs=1).fail.call_one().get(timeout=30)
    hosts.shutdown()


def test_a_client_without_the_key_is_refused_and_logged(job, tmp_path):
    key_file, started, d = job
    gw = started[0][1]["gateway"]
    other = str(tmp_path / "other.key")
    auth.write_key_file(other)
    with pytest.raises(TimeoutError, match="gateway"):
        attach_to_workers([started[0][1]["address"]], key_file=other, gateway=gw, timeout=3)
    deadline = time.monotonic() + 10
    while "refused a client" not in (d / "agent0.log").read_text():
        assert time.monotonic() < deadline, (d / "agent0.log").read_text()
        time.sleep(0.05)


def test_bad_gateway_addresses(job):
    key_file, started, _ = job
    for bad in ["127.0.0.1:5", "ipc:///x", "tcp://h"]:
        with pytest.raises(ValueError, match="gateway="):
            attach_to_workers([started[0][1]["address"]], key_file=key_file, gateway=bad)


class Tunnel:
    """A TCP forwarder standing in for `ssh -L` to the gateway: `cut()` drops its connections
    and refuses new ones (closing each at once) until `mend()`."""

    def __init__(self, target: str) -> None:
        import socket
        import threading

        host, port = target.removeprefix("tcp://").rsplit(":", 1)
        self.target = (host, int(port))
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self.lsock.getsockname()[1]}"
        self.up = True
        self.conns: list = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                a, _ = self.lsock.accept()
            except OSError:
                return
            if not self.up:
                a.close()
                continue
            b = socket.create_connection(self.target)
            with self.lock:
                self.conns += [a, b]
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src, dst) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def cut(self) -> None:
        import socket

        self.up = False
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def mend(self) -> None:
        self.up = True

    def close(self) -> None:
        self.cut()
        self.lsock.close()


def test_a_short_cut_of_the_gateway_connection_loses_nothing(job):
    """The tunnel to the gateway is down for 2 s (less than heartbeat_timeout: no outage is
    declared) while an answer is relayed and a call is sent: once it is back, the answer
    arrives and the call is made (each end sends again what the other lacks)."""
    key_file, started, _ = job
    tunnel = Tunnel(started[0][1]["gateway"])
    hosts = attach_to_workers([info["address"] for _, info in started], key_file=key_file,
                              gateway=tunnel.address)
    try:
        echo = hosts.spawn_procs(per_host={"procs": 1}).spawn("echo", Echo)
        assert list(echo.ping.call(1).get(timeout=60).values()) == [1, 1]
        slow = echo.sleep.call(1.0)  # answers while the tunnel is down
        time.sleep(0.3)
        tunnel.cut()
        time.sleep(0.3)
        during = echo.ping.call(2)  # sent while the tunnel is down
        time.sleep(1.7)
        tunnel.mend()
        assert list(slow.get(timeout=30).values()) == [1.0, 1.0]
        assert list(during.get(timeout=30).values()) == [2, 2]
        assert list(echo.ping.call(3).get(timeout=30).values()) == [3, 3]
    finally:
        hosts.shutdown()
        tunnel.close()
