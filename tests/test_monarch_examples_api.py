"""What Monarch's example programs use, through `runtime`'s public API: the deprecated
`proc_mesh(gpus=N)`, `TelemetryConfig`, `HostMesh._spawn_admin()`, stop reasons, and an actor
stopping itself with `context().actor_instance.stop(reason)`."""
from __future__ import annotations

import time

import pytest

import runtime
from runtime import SupervisionError, context, proc_mesh, this_host
from runtime.admin import AdminClient, read_connection_file, list_connection_files
from runtime.job import LocalJob, ProcessJob, TelemetryConfig

from _monarch_example_actors import (EnvReader, Finisher, failing_bootstrap, set_marker,
                                     set_marker_async)
from _procs import fault_hooks_done

pytestmark = pytest.mark.timeout(120)


def test_proc_mesh_gives_monarchs_dims_and_env():
    pm = proc_mesh(gpus=2, env={"EXAMPLE_FLAG": "on"})
    try:
        assert pm.extent == {"hosts": 1, "gpus": 2}
        r = pm.spawn("env", EnvReader)
        assert list(r.env.call("EXAMPLE_FLAG").get(timeout=60).values()) == ["on", "on"]
        # the ping_pong example slices by a peer's whole rank
        assert r.slice(gpus=1).where.call_one().get(timeout=60) == {"hosts": 0, "gpus": 1}
    finally:
        assert pm.stop("done").get(timeout=30) is None


def test_proc_mesh_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="only hosts=1"):
        proc_mesh(gpus=1, hosts=2)
    with pytest.raises(ValueError, match="positive"):
        proc_mesh(gpus=0)


def test_telemetry_config_is_accepted_and_chains():
    cfg = TelemetryConfig(include_dashboard=False, dashboard_port=0)
    assert cfg.dashboard_port == 0 and "include_dashboard=False" in repr(cfg)
    job = ProcessJob({"hosts": 1})
    assert job.enable_telemetry(cfg) is job  # nothing started: no agents yet
    assert job.enable_admin() is job


def test_admin_url_is_the_admin_endpoint_once_asked_for():
    plain = LocalJob(hosts=("hosts",))
    assert plain.state().admin_url is None and plain.state().telemetry_url is None
    job = LocalJob(hosts=("hosts",)).enable_telemetry(TelemetryConfig(dashboard_port=0))
    url = job.state().admin_url
    assert url == "tcp://" + this_host()._spawn_admin().get(timeout=30)
    late = LocalJob(hosts=("hosts",))
    state = late.state()
    late.enable_admin()  # after state(): the state learns it too
    assert state.admin_url == url


def test_spawn_admin_returns_the_admin_endpoint_address():
    addr = this_host()._spawn_admin().get(timeout=30)
    host, port = addr.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    # it is the endpoint `monarch-admin` attaches to: the connection file names it
    infos = [read_connection_file(p) for p in list_connection_files()]
    info = next(i for i in infos if i.address == f"tcp://{addr}")
    with AdminClient(info.address, info.token) as client:
        assert client.ping()
    with pytest.raises(ValueError, match="query engine"):
        this_host()._spawn_admin(query_engine=object())


def test_actor_stops_itself_without_a_failure():
    seen: list = []
    old = runtime.unhandled_fault_hook
    runtime.unhandled_fault_hook = seen.append
    pm = this_host().spawn_procs(per_host={"replica": 2})
    try:
        f = pm.spawn("finisher", Finisher)
        assert sorted(f.ping.call().get(timeout=60).values()) == [0, 1]
        # the call that asks for the stop still answers
        assert f.slice(replica=0).finish.call_one("work done").get(timeout=60) == \
            "finishing: work done"
        with pytest.raises(SupervisionError, match="stopped"):
            f.slice(replica=0).ping.call_one().get(timeout=60)
        assert f.slice(replica=1).ping.call_one().get(timeout=60) == 0  # rank 1 lives on
        assert fault_hooks_done()  # a failure report, had there been one, reached `seen`
        assert seen == []  # a stop is no failure: nothing reached the fault hook
        assert f.stop("mesh stopped by test").get(timeout=30) is None  # Monarch's reason arg
    finally:
        runtime.unhandled_fault_hook = old
        pm.stop().get(timeout=30)


def test_stop_outside_the_actor_is_refused():
    pm = this_host().spawn_procs(per_host={"replica": 1})
    try:
        f = pm.spawn("finisher2", Finisher)
        f.ping.call_one().get(timeout=60)
        ctx = context()  # the controller's context, not the actor's
        with pytest.raises(RuntimeError, match="inside the actor"):
            ctx.actor_instance.stop("no")
    finally:
        pm.stop().get(timeout=30)


def test_older_programs_await_meshes():
    """spmd_ddp.py awaits proc_mesh(...) and spawn(...), as older Monarch allowed."""
    import asyncio

    async def main():
        pm = await proc_mesh(gpus=1)
        r = await pm.spawn("env_awaited", EnvReader)
        assert r.where.call_one().get(timeout=60) == {"hosts": 0, "gpus": 0}
        await pm.stop()

    asyncio.run(main())


def test_bootstrap_runs_in_each_proc_before_its_actors():
    pm = this_host().spawn_procs(per_host={"replica": 2}, bootstrap=set_marker)
    try:
        r = pm.spawn("boot", EnvReader)
        got = r.env.call("EXAMPLE_BOOTSTRAPPED").get(timeout=60)
        pids = [p.pid for p in pm.procs]
        assert sorted(got.values()) == sorted(f"yes-{pid}" for pid in pids)
    finally:
        pm.stop().get(timeout=30)
    pm = proc_mesh(gpus=1, setup=set_marker_async)  # Monarch's setup= is the same hook
    try:
        r = pm.spawn("boot2", EnvReader)
        assert r.env.call_one("EXAMPLE_BOOTSTRAPPED").get(timeout=60) == "async"
    finally:
        pm.stop().get(timeout=30)


def test_bootstrap_that_raises_fails_the_proc():
    seen: list = []
    old = runtime.unhandled_fault_hook
    runtime.unhandled_fault_hook = seen.append
    try:
        pm = this_host().spawn_procs(per_host={"replica": 1}, bootstrap=failing_bootstrap)
        with pytest.raises(SupervisionError, match="failed to start.*exited with code 1"):
            pm.initialized.get(timeout=60)
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(seen) == 1 and "exited with code 1" in str(seen[0])  # a proc failure
        pm.stop().get(timeout=30)
        with pytest.raises(TypeError, match="callable"):
            this_host().spawn_procs(bootstrap="not a function")
    finally:
        runtime.unhandled_fault_hook = old


def test_bootstrap_reaches_procs_of_a_jobs_agents(tmp_path):
    """Through a job's agents (another path to the procs): the bootstrap writes a file. It is
    a partial of a builtin, so it unpickles without importing this test's modules there."""
    import functools

    marker = tmp_path / "booted"
    boot = functools.partial(
        exec, f"open({str(marker)!r}, 'w').write(str(__import__('os').getpid()))", {})
    job = LocalJob(1, progress=False)
    try:
        pm = job.state().hosts.spawn_procs(per_host={"r": 1}, bootstrap=boot)
        pm.initialized.get(timeout=60)
        assert marker.read_text() == str(pm.procs[0].pid)
        pm.stop().get(timeout=30)
    finally:
        job.cleanup()
