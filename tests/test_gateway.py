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

pytestmark = pytest.mark.timeout(90)


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
