"""A controller outside the cluster (issue 40): on the namespaced cluster, this namespace
(the controller's) reaches only the gateway node's gateway port (nftables), as a laptop
through `ssh -L`. Everything else crosses the gateway; procs on the other hosts call actors
living in the controller. Also: the same calls without a gateway, and a client without the
cluster's key refused and logged at the gateway."""
from __future__ import annotations

import time

import pytest

import runtime
from runtime import SupervisionError, get_runtime, this_proc
from runtime.errors import ActorError
from runtime.transport import auth

from .actors import CallsHome, Store, Where
from .agents import HB_TIMEOUT

pytestmark = [pytest.mark.timeout(150), pytest.mark.usefixtures("runtime_ends_with_the_module")]


@pytest.fixture(scope="module", autouse=True)
def short_heartbeats():
    from runtime.config import config

    old = config.heartbeat_timeout
    config.heartbeat_timeout = HB_TIMEOUT
    yield
    config.heartbeat_timeout = old


@pytest.fixture
def gated(cluster, agents):
    """Agents on mh1 (with the gateway) and mh2; this namespace fenced off all but the
    gateway port. Yields (agent addresses, gateway address)."""
    gw_node = cluster.nodes[0]
    addrs = [agents.start(gw_node, extra=("--gateway", f"tcp://{cluster.addr(gw_node)}:0")),
             agents.start(cluster.nodes[1])]
    gw = agents.info[gw_node]["gateway"]
    cluster.fence_controller((gw_node, int(gw.rsplit(":", 1)[1])))
    yield addrs, gw
    cluster.unfence_controller()


def _wait(cond, budget: float, what: str):
    deadline = time.monotonic() + budget
    while not (got := cond()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return got


def test_the_fence_lets_only_the_gateway_port_through(cluster, gated, key_file):
    addrs, gw = gated
    with pytest.raises(TimeoutError, match="no answer"):  # an agent dialed directly: silence
        runtime.attach_to_workers([addrs[1]], key_file=str(key_file), timeout=3)


def test_everything_through_the_gateway(cluster, gated, key_file):
    addrs, gw = gated
    hosts = runtime.attach_to_workers(addrs, key_file=str(key_file), gateway=gw)
    rt = get_runtime()
    inner = rt.messenger.tcp_addresses()[auth.read_key_file(str(key_file)).public]
    assert inner.startswith(f"tcp://{cluster.addr(cluster.nodes[0])}:")
    try:
        assert sorted(hosts.hosts) == cluster.nodes[:2]
        procs = hosts.spawn_procs(per_host={"procs": 2}, name="gw")
        where = procs.spawn("where", Where)
        got = where.where.call().get(timeout=60)
        assert sorted(v[0] for _, v in got.items()) == sorted(cluster.nodes[:2] * 2)
        assert sorted(f.get(timeout=30)[0] for f in where.where.stream()) == \
            sorted(cluster.nodes[:2] * 2)
        # live output crosses the gateway, labelled with the host
        seen = []
        rt.set_output_sink(lambda label, stream, text: seen.append((label, text)))
        try:
            where.shout.call("via gateway").get(timeout=30)
            _wait(lambda: sum("via gateway" in t for _, t in seen) == 4, 15, f"output: {seen}")
        finally:
            rt.set_output_sink(None)
        # procs on both hosts call a this_proc() actor and a singleton of this controller,
        # dialing the gateway's inner address (not this machine's ipc socket, which the
        # namespaces' shared file system would let them reach)
        store = this_proc().spawn("store", Store)
        callers = procs.spawn("home", CallsHome)
        for _, (host, dialed, store_host, n) in callers.via_ref.call(store).get(
                timeout=60).items():
            assert host in cluster.nodes[:2] and dialed == inner and n >= 1
        got = callers.via_singleton.call("gw_store").get(timeout=60)
        assert sorted(n for _, (_, dialed, n) in got.items()) == [1, 2, 3, 4]
        assert {dialed for _, (_, dialed, _) in got.items()} == {inner}
        port, recv = runtime.Channel.open()
        dialed = callers.slice(hosts=1).via_port.call(port).get(timeout=30)
        assert {d for _, d in dialed.items()} == {inner}
        assert sorted(recv.recv().get(timeout=10) for _ in range(2)) == [cluster.nodes[1]] * 2
        recv.close()
        # RDMA data does not cross the gateway: both directions fail at once, saying why
        from runtime.rdma import RDMABuffer, RDMATransportError

        mem = bytearray(64)
        text = callers.slice(hosts=1, procs=0).read_buffer.call_one(
            RDMABuffer(memoryview(mem))).get(timeout=30)
        assert text.startswith("RDMATransportError") and "relays messages, not RDMA" in text
        far = callers.slice(hosts=1, procs=0).make_buffer.call_one().get(timeout=30)
        with pytest.raises(RDMATransportError, match="through the gateway"):
            far.read_into(memoryview(bytearray(64))).get(timeout=1)
        # errors and supervision: an exception, then a proc of the far host dying
        with pytest.raises(ActorError):
            where.slice(hosts=1, procs=0).ask.call_one(None, 0).get(timeout=30)
        with pytest.raises(SupervisionError):
            where.slice(hosts=1, procs=1).crash.call_one(7).get(timeout=30)
        assert where.slice(hosts=0).where.call().get(timeout=30)  # the rest still serves
    finally:
        hosts.shutdown()


@pytest.fixture
def lease():
    """Set gateway_lease for one test."""
    from runtime.config import config

    old = config.gateway_lease
    yield lambda s: setattr(config, "gateway_lease", s)
    config.gateway_lease = old


def _cut(cluster):
    cluster.unfence_controller()
    cluster.fence_controller()  # nothing passes: the tunnel is cut


def _mend(cluster, gw):
    cluster.unfence_controller()
    cluster.fence_controller((cluster.nodes[0], int(gw.rsplit(":", 1)[1])))


def test_mesh_cells_and_the_dashboard_through_the_gateway(cluster, gated, key_file):
    """In an IPython shell with the extension (as in a notebook): `%mesh alloc` on hosts
    reached only through the gateway, a `%%mesh` cell with live output from both hosts, the
    dashboard following an actor mesh there, and a proc that dies in a cell reported in the
    user's words and shown as failed."""
    from pathlib import Path

    from IPython.testing.globalipapp import get_ipython, start_ipython
    from IPython.utils.capture import capture_output
    from monarch_kernel.folding import MeshCellError
    from monarch_widgets.state import STATE_NAMES
    from monarch_widgets.widget import Dashboard

    def grid(w: Dashboard, mesh: str) -> list[str]:
        for m in w.state["meshes"]:
            if m["name"] == mesh:
                return [STATE_NAMES[a[1]] for a in m["actors"]]
        return []

    addrs, gw = gated
    hosts = runtime.attach_to_workers(addrs, key_file=str(key_file), gateway=gw)
    ip = start_ipython()
    if ip is None:  # started earlier in this pytest process
        ip = get_ipython()
    else:  # IPython's test shell keeps a history file in /tmp: removed at exit
        ip.tempfiles.append(Path(ip.history_manager.hist_file))
    ip.run_line_magic("load_ext", "monarch_kernel")
    rt = get_runtime()
    w = Dashboard(rt.health, runtime=rt, max_rate=10)
    try:
        ip.user_ns["gwhosts"] = hosts
        with capture_output():
            ip.run_line_magic("mesh", "alloc gwcells --hosts gwhosts --per-host procs=1 "
                                      "--no-progress")
        with capture_output() as cap:
            vm = ip.run_cell_magic("mesh", "gwcells",
                                   "import socket\nprint('cell on', socket.gethostname())\n"
                                   "socket.gethostname()")
        assert sorted(vm.values()) == sorted(cluster.nodes[:2])
        for node in cluster.nodes[:2]:  # live output of both hosts, prefixed with the mesh
            assert any(line.startswith("[gwcells") and line.endswith(f"cell on {node}")
                       for line in cap.stdout.splitlines()), cap.stdout
        where = ip.user_ns["gwcells"].spawn("gwwhere", Where)
        where.where.call().get(timeout=60)
        _wait(lambda: grid(w, "gwwhere") == ["idle"] * 2, 30, "dashboard never showed idle")
        code = "import os\nif current_rank().rank == 1:\n    os._exit(7)\n'alive'"
        with pytest.raises(MeshCellError) as e, capture_output():
            ip.run_cell_magic("mesh", "gwcells", code)
        report = str(e.value)
        assert "the proc of gwcells rank 1" in report and "exit" in report, report
        for internal in ("CellRunner", "cell_runner", "<root>", "Endpoint call"):
            assert internal not in report, report
        _wait(lambda: "failed" in grid(w, "gwwhere"), 30,
              f"the dashboard never showed the dead proc: {grid(w, 'gwwhere')}")
        names = {m["name"] for m in w.state["meshes"]}
        # the %%mesh cells' internal meshes (runner, completer) are not shown
        assert "gwwhere" in names and not any("completer" in n for n in names), names
    finally:
        w.close()
        try:
            with capture_output():
                ip.run_line_magic("mesh", "stop --all")
        finally:
            ip.run_line_magic("unload_ext", "monarch_kernel")
            hosts.shutdown()


def test_a_tunnel_cut_within_the_lease_keeps_the_procs(cluster, gated, key_file, lease):
    """Cut the only connection for less than the lease: calls meanwhile fail saying why, and
    once it is back the same actors answer (their procs were kept)."""
    addrs, gw = gated
    lease(60.0)
    hosts = runtime.attach_to_workers(addrs, key_file=str(key_file), gateway=gw)
    try:
        where = hosts.spawn_procs(per_host={"procs": 1}, name="kept").spawn("where", Where)
        before = [v for _, v in where.pid.call().get(timeout=60).items()]
        _cut(cluster)
        # a call made right at the cut: it waits until the cut is noticed, or (if the cut
        # was noticed first) is refused at once; either way the error says why
        with pytest.raises(SupervisionError, match="keeps its procs for gateway_lease|"
                                                   "calls fail until the connection returns"):
            where.where.call().get(timeout=30)
        with pytest.raises(SupervisionError, match="calls fail until the connection returns"):
            where.where.call().get(timeout=5)  # made meanwhile: fails at once
        # cut for longer than an agent waits for a silent controller without a lease
        # (2 x max(heartbeat_timeout, 5 s) = 10 s)
        time.sleep(12)
        _mend(cluster, gw)

        def answers():
            try:
                return [v for _, v in where.pid.call().get(timeout=5).items()]
            except SupervisionError:
                return None
        after = _wait(answers, 60, "the kept actors never answered again")
        assert after == before  # the same processes
    finally:
        hosts.shutdown()


def test_a_tunnel_cut_past_the_lease_is_one_partition_and_ends_the_procs(
        cluster, gated, agents, key_file, caplog, lease):
    """Cut for longer than the lease: the hosts behind the gateway fail with one cause, the
    gateway's, logged once, and their agents end the procs."""
    import logging

    addrs, gw = gated
    lease(0.5)  # shorter than heartbeat_timeout: the first silence check ends it
    hosts = runtime.attach_to_workers(addrs, key_file=str(key_file), gateway=gw)
    try:
        where = hosts.spawn_procs(per_host={"procs": 1}, name="cut").spawn("where", Where)
        assert len(where.where.call().get(timeout=60)) == 2
        caplog.set_level(logging.WARNING, logger="runtime.gateway")
        _cut(cluster)
        with pytest.raises(SupervisionError, match="connection to the gateway .* is lost") as e:
            where.where.call().get(timeout=30)
        assert "partition" in str(e.value)
        lost = [r for r in caplog.records if "connection to the gateway" in r.getMessage()]
        assert len(lost) == 1, [r.getMessage() for r in lost]
        # the agents, silent controller past the lease, ended the procs (as for a dead one)
        for node in cluster.nodes[:2]:
            _wait(lambda: "ending its procs" in agents.log(node), 30, agents.log(node)[-2000:])
    finally:
        hosts.shutdown()


def test_controller_actors_reachable_without_a_gateway(cluster, agents, key_file):
    addrs = [agents.start(n) for n in cluster.nodes[1:]]
    hosts = runtime.attach_to_workers(addrs, key_file=str(key_file))
    rt = get_runtime()
    mine = rt.messenger.tcp_addresses()[auth.read_key_file(str(key_file)).public]
    try:
        procs = hosts.spawn_procs(per_host={"procs": 1}, name="home")
        callers = procs.spawn("home", CallsHome)
        store = this_proc().spawn("store2", Store)
        got = callers.via_ref.call(store).get(timeout=60)
        assert sorted(h for _, (h, _, _, _) in got.items()) == cluster.nodes[1:]
        assert {d for _, (_, d, _, _) in got.items()} == {mine}  # this controller's TCP inbox
        got = callers.via_singleton.call("direct_store").get(timeout=60)
        assert sorted(n for _, (_, _, n) in got.items()) == [1, 2]
    finally:
        hosts.shutdown()


def test_a_client_without_the_key_is_refused_and_logged(cluster, gated, agents, tmp_path):
    addrs, gw = gated
    other = tmp_path / "other" / "other.key"
    other.parent.mkdir(mode=0o700)
    auth.write_key_file(str(other))
    with pytest.raises(TimeoutError, match="gateway"):
        runtime.attach_to_workers(addrs, key_file=str(other), gateway=gw, timeout=3)
    _wait(lambda: "refused a client" in agents.log(cluster.nodes[0]), 10,
          f"gateway log: {agents.log(cluster.nodes[0])[-2000:]}")


def test_slurm_job_through_its_gateway(cluster, monkeypatch, tmp_path):
    """SlurmJob(gateway=True): the first agent runs the gateway; with this namespace fenced
    off all but its port (SLURM's controller and the shared job directory stay reachable),
    state() attaches through it and the procs work."""
    from runtime.job import SlurmJob

    from .agents import REPO

    monkeypatch.setenv("SLURM_CONF", str(cluster.dir / "slurm.conf"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("MONARCH_HEARTBEAT_TIMEOUT", str(HB_TIMEOUT))
    job = SlurmJob({"trainers": 2}, workdir=tmp_path / "jobs", chdir=REPO, progress=False,
                   timeout=60, gateway=True)
    assert '--gateway "tcp://$ADDR:$4"' in job.render_script()
    try:
        job.wait_addresses()
        gw = job._gateway_address()
        node = next(n for n in cluster.nodes if f"//{cluster.addr(n)}:" in gw)
        cluster.fence_controller((node, int(gw.rsplit(":", 1)[1])))
        hosts = job.state().trainers
        assert sorted(hosts.hosts) == cluster.nodes[:2]
        where = hosts.spawn_procs(per_host={"procs": 2}).spawn("where", Where)
        got = where.where.call().get(timeout=60)
        assert sorted(v[0] for _, v in got.items()) == sorted(cluster.nodes[:2] * 2)
    finally:
        job.kill()
        cluster.unfence_controller()


DBG_CELL = "<gateway-cell>"
DBG_SRC = '''\
import socket
from runtime import Actor, endpoint


class Paused(Actor):
    @endpoint
    def work(self, x):
        host = socket.gethostname()
        breakpoint()
        return (host, x * 2)
'''


def test_breakpoint_through_the_gateway(cluster, gated, key_file):
    """breakpoint() in actors on both hosts behind the gateway: the controller's debugger
    sees them, drives their pdb, serves the cell's source, and continues them."""
    import linecache

    addrs, gw = gated
    hosts = runtime.attach_to_workers(addrs, key_file=str(key_file), gateway=gw)
    linecache.cache[DBG_CELL] = (len(DBG_SRC), None, DBG_SRC.splitlines(True), DBG_CELL)
    ns = {"__name__": "not_importable_gateway_cell"}
    exec(compile(DBG_SRC, DBG_CELL, "exec"), ns)
    reg = runtime.debugging.get_registry()
    reg.notify = lambda text: None
    try:
        m = hosts.spawn_procs(per_host={"procs": 1}, name="gwdbg").spawn("paused", ns["Paused"])
        fut = m.work.call(21)
        sessions = _wait(lambda: len(reg.paused()) >= 2 and reg.paused(), 60,
                         f"paused: {reg.sessions()}")
        sessions = sorted(sessions, key=lambda s: s.rank)
        assert [s.host for s in sessions] == cluster.nodes[:2]
        for s, node in zip(sessions, cluster.nodes):
            assert "-> return (host, x * 2)" in reg.wait(s, 10)[0]
            assert reg.run_command(s, "p host")[0] == f"'{node}'\n"
            assert "breakpoint()" in reg.run_command(s, "l")[0]  # source from the controller
        assert reg.continue_all() == 2
        assert sorted(v for _, v in fut.get(30).items()) == [(n, 42) for n in cluster.nodes[:2]]
    finally:
        hosts.shutdown()
