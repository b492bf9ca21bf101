"""The debugger across real hosts: actors in two network-namespace hosts of the test
cluster (CurveZMQ over TCP) stop at breakpoint(); the controller drives their pdb, serves
them the source they lack, casts by host and continues them."""
from __future__ import annotations

import linecache
import os
import subprocess
import sys
import time

import pytest

import runtime
from multihost.agents import Agents
from multihost.mhcluster import Cluster, unavailable

pytestmark = pytest.mark.timeout(180)

CELL = "<remote-cell>"
SRC = '''\
import socket
from runtime import Actor, endpoint


class Remote(Actor):
    @endpoint
    def work(self, x):
        host = socket.gethostname()
        breakpoint()
        return (host, x * 2)
'''


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    reason = unavailable()
    if reason:
        if os.environ.get("MONARCH_REQUIRE_MULTIHOST") == "1":
            pytest.fail(f"multihost tests required but cannot run: {reason}")
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("dbg-mh")
    tmp.chmod(0o700)
    key, earlier_key = tmp / "cluster.key", tmp / "earlier.key"
    for k in (key, earlier_key):
        subprocess.run([sys.executable, "-m", "runtime.transport.auth", "keygen", str(k)],
                       check=True, capture_output=True)
    cluster = Cluster(n=2)
    cluster.up()
    agents, earlier = Agents(cluster, key, tmp), Agents(cluster, earlier_key, tmp)
    try:
        # The controller first joins another cluster (another key), as a notebook that
        # attached twice does: its procs must still be answered with their own cluster's key.
        runtime.attach_to_workers([earlier.start(cluster.nodes[0])], key_file=str(earlier_key))
        addrs = [agents.start(n) for n in cluster.nodes]
        hosts = runtime.attach_to_workers(addrs, key_file=str(key))
        yield cluster, hosts
        runtime.shutdown()
    finally:
        agents.stop()
        earlier.stop()
        left = cluster.down(check=False)
        assert not left, f"cluster teardown left: {left}"


def test_breakpoints_on_two_hosts(two_hosts):
    cluster, hosts = two_hosts
    linecache.cache[CELL] = (len(SRC), None, SRC.splitlines(True), CELL)
    ns = {"__name__": "not_importable_cell"}
    exec(compile(SRC, CELL, "exec"), ns)
    m = hosts.spawn_procs(per_host={"procs": 1}, name="mhdbg").spawn("remote", ns["Remote"])
    reg = runtime.debugging.get_registry()
    reg.notify = lambda text: None
    fut = m.work.call(21)
    deadline = time.monotonic() + 60
    while len(reg.paused()) < 2:
        assert time.monotonic() < deadline, reg.sessions()
        time.sleep(0.05)
    sessions = sorted(reg.paused(), key=lambda s: s.rank)
    assert [s.host for s in sessions] == cluster.nodes
    for s, node in zip(sessions, cluster.nodes):
        assert s.coords == {"hosts": s.rank, "procs": 0} and s.file == CELL
        assert f"on {node} pid {s.pid}, at {CELL}:10 in work()" in s.header_line()
        assert "-> return (host, x * 2)" in reg.wait(s, 10)[0]
        assert reg.run_command(s, "p host")[0] == f"'{node}'\n"
        assert "breakpoint()" in reg.run_command(s, "l")[0]  # source from the controller
    out = reg.cast("ranks(hosts=1)", "p (host, x)")
    assert [(s.host, text) for s, text, _ in out] == [(cluster.nodes[1],
                                                       f"('{cluster.nodes[1]}', 21)\n")]
    assert reg.continue_all() == 2
    got = fut.get(30)
    assert sorted(v for _, v in got.items()) == [(n, 42) for n in cluster.nodes]


LINES_CELL = "<remote-cell-lines>"
LINES_SRC = '''\
import socket
from runtime import Actor, endpoint


class Lined(Actor):
    @endpoint
    def work(self, x):
        host = socket.gethostname()
        y = x + 1
        return (host, y)
'''


def _wait_paused(reg, n, timeout=60.0):
    deadline = time.monotonic() + timeout
    while len(reg.paused()) < n:
        assert time.monotonic() < deadline, reg.sessions()
        time.sleep(0.05)
    return sorted(reg.paused(), key=lambda s: s.rank)


def test_line_breakpoints_on_two_hosts(two_hosts):
    """The Debugger panel's gutter breakpoints (line breakpoints from the controller) reach
    procs on both hosts started after they were set, move live, and answer structured
    requests across hosts."""
    cluster, hosts = two_hosts
    linecache.cache[LINES_CELL] = (len(LINES_SRC), None, LINES_SRC.splitlines(True), LINES_CELL)
    ns = {"__name__": "not_importable_cell_lines"}
    exec(compile(LINES_SRC, LINES_CELL, "exec"), ns)
    reg = runtime.debugging.get_registry()
    reg.notify = lambda text: None
    runtime.debugging.set_line_breakpoints(LINES_CELL, [9])  # before the procs start
    try:
        m = hosts.spawn_procs(per_host={"procs": 1}, name="mhlines").spawn("lined", ns["Lined"])
        dap = runtime.debugging.get_dap_client()
        fut = m.work.call(1)  # the first call stops: the table came with the spawn
        sessions = _wait_paused(reg, 2)
        assert [s.host for s in sessions] == cluster.nodes
        for s, node in zip(sessions, cluster.nodes):
            assert (s.file, s.line) == (LINES_CELL, 9)
            top = dap.request(s, "stackTrace")["frames"][0]
            assert (top["file"], top["line"], top["name"]) == (LINES_CELL, 9, "work")
            assert dap.request(s, "evaluate", {"expression": "host"})["result"] == repr(node)
        assert reg.continue_all() == 2
        assert sorted(fut.get(30).values()) == [(n, 2) for n in cluster.nodes]
        # moved, live; the table reaches each proc before this thread's next call does
        runtime.debugging.set_line_breakpoints(LINES_CELL, [10])
        fut = m.work.call(2)
        sessions = _wait_paused(reg, 2)
        assert [s.line for s in sessions] == [10, 10]
        assert dap.request(sessions[1], "evaluate", {"expression": "y"})["result"] == "3"
        runtime.debugging.set_line_breakpoints(LINES_CELL, [])
        assert reg.continue_all() == 2
        assert sorted(fut.get(30).values()) == [(n, 3) for n in cluster.nodes]
    finally:
        runtime.debugging.set_line_breakpoints(LINES_CELL, [])
