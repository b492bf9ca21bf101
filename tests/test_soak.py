"""A kernel that lives for weeks: churn leaves nothing behind, crash leftovers are swept,
the RDMA data server survives a descriptor flood.

- churn: a few hundred cycles of each pattern of benchmarks/bench_soak.py (mesh, actor
  mesh, RDMABuffer) in this controller; runtime tables, files under the runtime root, fds
  and threads must not grow beyond a small constant, nor any type of object in the
  controller or a proc (counted by the garbage collector);
- a SIGKILLed controller's run directory, RDMA directories and admin connection file are
  removed by the next controller of the user (and nothing of a live process, or not named
  by the runtime, is);
- a data server whose file limit a flood exhausts accepts again: a fresh authenticated read
  succeeds once the flood ends (the time it took goes to the detection report), and while
  a flood of idle connections holds.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import resource
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from runtime.transport.peers import GONE_KEPT
from _procs import end_popen

ROOT = Path(__file__).resolve().parents[1]


def _bench_soak():
    spec = importlib.util.spec_from_file_location("bench_soak",
                                                  ROOT / "benchmarks" / "bench_soak.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_soak"] = mod
    spec.loader.exec_module(mod)
    import cloudpickle

    cloudpickle.register_pickle_by_value(mod)  # procs cannot import it: send the classes
    return mod


def _kill(pids: list[int]) -> None:
    """SIGKILL those of `pids` that still run (a test's clean-up after a failure)."""
    for pid in pids:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


def _grown(a: dict, b: dict, c: dict, limit: int, keys=None) -> dict:
    """What rose by more than `limit` from `a` to `c` (with `b` in between not below
    `a`): counts sampled at three points of a churn."""
    keys = c.keys() if keys is None else keys
    return {k: (a.get(k, 0), b.get(k, 0), c.get(k, 0)) for k in keys
            if c.get(k, 0) - a.get(k, 0) > limit and b.get(k, 0) >= a.get(k, 0)}


# bounded by design: the last 1,024 stopped actor ids; the last registered (stopped) mesh;
# the addresses of the last GONE_KEPT dead peers (a late send to one fails at once)
_BOUNDED = {"table.stopped_actor_ids", "table.mesh_objects", "table.forgotten_peers"}
# the runtime's own objects and what they own, counted exactly (+2 for one in flight)
_OWN = ("runtime.", "socket.socket", "zmq.sugar.socket.Socket", "threading.Thread",
        "inspect.Signature", "weakref.finalize", "fds", "threads", "table.")


def _flat(pattern: str, first, last) -> None:
    """Runtime tables, files under the runtime root, fds and threads of the controller and
    of the other process (the host agent for meshes, the persistent proc otherwise) did not
    grow from sample `first` to sample `last`."""
    # the bounded memories: ids of stopped actors (a late call is answered at once) and
    # addresses of dead peers (a late send fails at once, nothing is dialed)
    bounded = {"proc.stopped_actor_ids": 1024, "ctl.forgotten_peers": GONE_KEPT,
               "proc.forgotten_peers": GONE_KEPT}
    grown = {k: (first.tables.get(k, 0), v) for k, v in last.tables.items()
             if v - first.tables.get(k, 0) > 1 and k not in bounded}
    span = last.cycle - first.cycle
    assert not grown, f"{pattern}: tables grew over {span} cycles: {grown}"
    for k, limit in bounded.items():
        assert last.tables.get(k, 0) <= limit, (k, last.tables.get(k))
    assert last.files - first.files <= 0, f"{pattern}: files under the runtime root"
    for who in ("ctl", "other"):
        a, b = getattr(first, who), getattr(last, who)
        assert b["fds"] - a["fds"] <= 2, (pattern, who, a, b)
        assert b["threads"] - a["threads"] <= 1, (pattern, who, a, b)


@pytest.mark.timeout(300)
def test_churn_leaves_nothing_behind():
    """Spawn-call-stop cycles of a 2-proc mesh (what stays in the controller and the host
    agent), of an actor mesh on a persistent mesh (in the controller and in that proc), 200
    each, counted at cycles 50, 125 and 200, then 300 RDMABuffer cycles: no record, port,
    future, connection, socket, thread, fd, file or table entry is left per cycle (runtime
    objects: at most 2 more), and no type of object at all grows by more than 20 (a leak of
    one per 8 cycles)."""
    bench = _bench_soak()
    soak = bench.Soak()
    try:
        soak.counts()  # the first count makes objects of its own (caches of gc, abc, psutil)
        for pattern in ("mesh", "actor"):
            seen, samples = [], []
            for i in range(200):
                soak.cycle(pattern, i)
                if i + 1 in (50, 125, 200):
                    samples.append(soak.sample(pattern, i + 1, objects=False))
                    seen.append(soak.counts())
            _flat(pattern, samples[0], samples[-1])
            for who in ("ctl", "proc"):
                a, b, c = (n[who] for n in seen)
                own = [k for k in c if k.startswith(_OWN) and k not in _BOUNDED]
                assert not _grown(a, b, c, 2, own), (
                    f"{pattern}: {who}'s runtime objects grew over 150 cycles (at 50, 125, "
                    f"200): {_grown(a, b, c, 2, own)}")
                every = [k for k in c if k not in _BOUNDED]
                assert not _grown(a, b, c, 20, every), (
                    f"{pattern}: {who}'s objects grew over 150 cycles (at 50, 125, 200): "
                    f"{_grown(a, b, c, 20, every)}")
                assert c.get("table.stopped_actor_ids", 0) <= 1024
                assert c.get("table.forgotten_peers", 0) <= GONE_KEPT
        _, samples = soak.run("rdma", 300, every=300, warmup=10, objects=False)
        _flat("rdma", samples[0], samples[-1])
    finally:
        pids = soak.pids()
        try:
            soak.close()
        finally:
            _kill(pids)


def test_stopped_and_failed_meshes_leave_the_tables():
    """Stopped: gone at once. Failed: the report stays while the user holds the mesh."""
    import gc

    import runtime
    from runtime import this_host

    bench = _bench_soak()
    rt = runtime.get_runtime()
    before = rt.table_sizes()
    pm = this_host().spawn_procs(per_host={"procs": 2}, name="soak-fail")
    am = pm.spawn("soak-echo", bench.Echo)
    am.initialized.get(30)
    victim = pm.procs[0].proc_id
    rt.kill_proc(victim)
    with pytest.raises(runtime.SupervisionError):
        for _ in range(100):
            am.ping.call(1).get(10)
            time.sleep(0.05)
    assert rt.proc_state(victim) == "failed"  # the user still holds the mesh: it answers
    pm.stop().get(30)
    keys = ("procs", "actor_meshes", "dead_procs", "agent_procs", "ports", "health_meshes")
    _until(lambda: all(rt.table_sizes()[k] <= before[k] for k in keys),
           f"tables not back to {before}: {rt.table_sizes()}")
    del am, pm
    gc.collect()
    _until(lambda: rt.proc_state(victim) is None, "not dropped with the user's objects")
    after = rt.table_sizes()
    assert after["retired_procs"] <= before["retired_procs"], (before, after)
    assert after["retired_meshes"] <= before["retired_meshes"], (before, after)
    assert after["health_meshes"] <= before["health_meshes"], (before, after)


def test_stopped_procs_remove_their_rdma_directories():
    """A proc exits with os._exit (no atexit): it closes its data server first."""
    from runtime import rundir, this_host

    bench = _bench_soak()
    pm = this_host().spawn_procs(per_host={"procs": 2}, name="soak-rdma")
    probe = pm.spawn("soak-probe", bench.Probe)
    assert list(probe.hold.call().get(30).values()) == [True, True]
    pids = {p.pid for p in pm.procs}

    def theirs() -> list[str]:
        return [n for d in rundir.roots() if d.is_dir() for n in os.listdir(d)
                if (rundir.creator(n) or ("", 0, 0))[1] in pids]

    assert len(theirs()) == 2, theirs()  # one rdma directory per proc
    pm.stop().get(30)
    _until(lambda: theirs() == [], f"left behind: {theirs()}")


_CRASHER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {root!r})
    import torch
    from runtime import Actor, endpoint, this_host
    from runtime.rdma import RDMABuffer

    class Holder(Actor):
        @endpoint
        def hold(self) -> int:
            self.buf = RDMABuffer(torch.ones(16, dtype=torch.uint8))
            return os.getpid()

    procs = this_host().spawn_procs(per_host={{"procs": 2}})
    pids = procs.spawn("holders", Holder).hold.call().get(60).values()
    mine = RDMABuffer(torch.ones(16, dtype=torch.uint8))
    print("READY", *pids, flush=True)
    time.sleep(600)
""")


@pytest.mark.timeout(120)
def test_sigkilled_controller_leftovers_are_swept_by_the_next():
    import shutil
    import tempfile

    from runtime import rundir

    root = Path(tempfile.mkdtemp(prefix="msoak-"))  # short: ipc paths live under it
    try:
        _crash_and_sweep(root, rundir)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _crash_and_sweep(root: Path, rundir) -> None:
    env = {**os.environ, "MONARCH_RUNTIME_DIR": str(root), "MONARCH_ADMIN": "1"}
    p = subprocess.Popen([sys.executable, "-c", _CRASHER.format(root=str(ROOT))], env=env,
                         stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line.startswith("READY"), line
        proc_pids = [int(x) for x in line.split()[1:]]
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    finally:
        end_popen(p)
    # every process of the dead controller goes (PDEATHSIG), leaving its files behind
    for pid in proc_pids:
        try:
            psutil.Process(pid).wait(10)
        except psutil.NoSuchProcess:
            pass
    left = sorted(os.listdir(root))
    kinds = {rundir.creator(n)[0] for n in left if rundir.creator(n)}
    assert {"run", "rdma", "admin"} <= kinds, left  # the test can fail: there is litter
    # entries the sweep must keep: a live process's, and a name not made by the runtime
    live = root / f"rdma-{rundir.tag()}-keep"
    live.mkdir()
    (root / "notes.txt").write_text("mine")
    out = subprocess.run(
        [sys.executable, "-c", "import os, runtime; runtime.get_runtime(); "
         "print(sorted(os.listdir(os.environ['MONARCH_RUNTIME_DIR'])))"],
        env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    now = set(os.listdir(root))
    assert not now & set(left), f"left by the SIGKILLed controller: {now & set(left)}"
    assert live.name in now and "notes.txt" in now
    live.rmdir()


_SERVER = textwrap.dedent("""
    import base64, logging, pickle, resource, sys, time
    sys.path.insert(0, {root!r})
    logging.basicConfig(level=logging.WARNING)
    import torch
    from runtime.rdma import RDMABuffer
    from runtime.rdma.server import get_server

    buf = RDMABuffer(torch.arange(256, dtype=torch.int32).to(torch.uint8))
    get_server()
    resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile}))
    print(base64.b64encode(pickle.dumps(buf)).decode(), flush=True)
    sys.stdin.read()
""")


def _flood(addr: str, n: int) -> list[socket.socket]:
    """Up to `n` connections to `addr`, held open; a connect the server's full backlog does
    not take is given up after 0.25 s (loopback answers at once when it does)."""
    kind, _, rest = addr.partition(":")
    out = []
    for _ in range(n):
        try:
            if kind == "unix":
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.settimeout(0.25)
                    s.connect(rest)
                except OSError:
                    s.close()
                    raise
            else:
                host, _, port = rest.rpartition(":")
                s = socket.create_connection((host.strip("[]"), int(port)), timeout=0.25)
        except OSError:
            continue
        out.append(s)
    return out


def _fds(p: subprocess.Popen) -> int:
    """Open descriptors of the server subprocess; a clear failure if it died."""
    try:
        return psutil.Process(p.pid).num_fds()
    except psutil.NoSuchProcess:
        p.wait(5)
        err = p.stderr.read() if p.stderr is not None else ""
        pytest.fail(f"the server process died (rc {p.returncode}): {err[-3000:]}")


def _until(cond, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _dropped(flood: list[socket.socket]) -> int:
    """How many of the flood's connections the server has closed (EOF or reset here);
    what a server sent on them first (its challenge) is read and thrown away."""
    n = 0
    for s in flood:
        s.settimeout(0)  # a look, no wait
        try:
            while s.recv(4096):
                pass
            n += 1
        except BlockingIOError:
            pass
        except OSError:
            n += 1
    return n


def _read_ok(buf, timeout: float) -> float:
    import torch

    t0 = time.monotonic()
    dst = torch.zeros(256, dtype=torch.uint8)
    buf.read_into(dst, timeout=timeout).get(timeout + 1)
    assert int(dst[5]) == 5
    return time.monotonic() - t0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["tcp", "vm"])
def test_data_server_serves_again_after_a_descriptor_flood(transport, monkeypatch,
                                                          record_detection):
    import base64

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 600:
        pytest.skip("the flood needs 600 descriptors in the test process")
    monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", transport)
    env = {**os.environ, "MONARCH_RDMA_MAX_PENDING": "1000"}  # let the flood hit EMFILE
    p = subprocess.Popen([sys.executable, "-c", _SERVER.format(root=str(ROOT), nofile=64)],
                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        buf = pickle.loads(base64.b64decode(p.stdout.readline()))
        addrs = buf._h.addresses
        flood = []
        for addr in addrs:
            flood += _flood(addr, 150)
        _until(lambda: _fds(p) >= 60, "the server never ran out of descriptors")
        for s in flood:
            s.close()
        took = _read_ok(buf, timeout=5.0)  # it serves again (the time goes to the report)
        record_detection(f"RDMA read after a descriptor flood ({transport})", took)
        p.stdin.close()
        p.wait(10)
        err = p.stderr.read()
        assert "accept failed" in err and "accepting again" in err, err[-2000:]
    finally:
        end_popen(p)


@pytest.mark.timeout(120)
def test_idle_unauthenticated_connections_cannot_lock_out_a_client():
    import base64

    env = {**os.environ, "MONARCH_RDMA_MAX_PENDING": "16", "MONARCH_RDMA_TRANSPORT": "tcp"}
    p = subprocess.Popen([sys.executable, "-c", _SERVER.format(root=str(ROOT), nofile=256)],
                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    flood: list[socket.socket] = []
    try:
        buf = pickle.loads(base64.b64decode(p.stdout.readline()))
        tcp = [a for a in buf._h.addresses if a.startswith("tcp:")][0]
        flood = _flood(tcp, 400)  # held open, never authenticated
        _until(lambda: _dropped(flood) >= len(flood) - 100, "the server dropped none")
        assert _fds(p) < 100  # bounded: the oldest were dropped
        old = os.environ.get("MONARCH_RDMA_TRANSPORT")
        os.environ["MONARCH_RDMA_TRANSPORT"] = "tcp"
        try:
            _read_ok(buf, timeout=5.0)  # not locked out
        finally:
            if old is None:
                os.environ.pop("MONARCH_RDMA_TRANSPORT")
            else:
                os.environ["MONARCH_RDMA_TRANSPORT"] = old
    finally:
        for s in flood:
            s.close()
        end_popen(p)


_ADMIN = textwrap.dedent("""
    import resource, sys
    sys.path.insert(0, {root!r})
    from runtime.admin.server import AdminServer
    srv = AdminServer(None)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    print(srv.connection_file, flush=True)
    sys.stdin.read()
""")


@pytest.mark.timeout(60)
def test_admin_endpoint_answers_again_after_a_descriptor_flood(tmp_path):
    """zmq's I/O thread retries a failed accept itself: the endpoint answers again."""
    from runtime.admin import AdminClient, read_connection_file

    env = {**os.environ, "MONARCH_RUNTIME_DIR": str(tmp_path)}
    p = subprocess.Popen([sys.executable, "-c", _ADMIN.format(root=str(ROOT))], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    flood: list[socket.socket] = []
    try:
        path = p.stdout.readline().strip()
        info = read_connection_file(path)
        host, port = info.address.removeprefix("tcp://").rsplit(":", 1)
        flood = _flood(f"tcp:{host}:{port}", 150)
        _until(lambda: _fds(p) >= 60, "the endpoint never ran out of descriptors")
        for s in flood:
            s.close()
        with AdminClient.from_connection_file(path, timeout=5) as client:
            assert client.ping()["pid"] == p.pid
    finally:
        for s in flood:
            s.close()
        p.stdin.close()
        try:
            p.wait(10)
        finally:
            end_popen(p)
