"""runtime.spmd: torchrun's environment from a proc's point, and Monarch's spmd_ddp example
(imports rewritten) running an unchanged DDP script on 2 CPU procs with gloo."""

from __future__ import annotations

import json
import os

import pytest

from runtime import configured, this_host
from runtime.spmd import SPMDActor, elastic_env

TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_spmd_train.py")


def test_elastic_env_follows_the_gpu_dimension():
    e = elastic_env({"hosts": 1, "gpus": 2}, {"hosts": 2, "gpus": 4}, "10.0.0.1", 29500)
    assert (e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) == ("6", "2", "8", "4")
    assert (e["GROUP_RANK"], e["GROUP_WORLD_SIZE"], e["MASTER_PORT"]) == ("1", "2", "29500")
    # the gpu dimension first: LOCAL_RANK is still its coordinate, GROUP_RANK the host's
    e = elastic_env({"gpus": 1, "hosts": 2}, {"gpus": 2, "hosts": 3}, "h", 1)
    assert (e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"], e["LOCAL_WORLD_SIZE"]) == ("5", "1", "2", "2")
    # without one, the last dimension is the local one (as Monarch)
    e = elastic_env({"a": 1, "b": 0}, {"a": 2, "b": 3}, "h", 1)
    assert (e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"]) == ("3", "0", "1")


@pytest.mark.timeout(240)
def test_monarch_spmd_ddp_example_runs_on_cpu_with_gloo(tmp_path):
    # Monarch's python/examples/ddp/spmd_ddp.py with `monarch.actor` -> `runtime` and
    # `monarch.spmd` -> `runtime.spmd`; only the master address is loopback here.
    with configured(gpu_count=0):
        local_proc_mesh = this_host().spawn_procs(per_host={"gpus": 2},
                                                  env={"GLOO_SOCKET_IFNAME": "lo"})
    try:
        spmd_actors = local_proc_mesh.spawn("_SPMDActor", SPMDActor)
        first_values = dict.fromkeys(local_proc_mesh._labels, 0)
        host, master_port = spmd_actors.slice(**first_values).get_host_port.call_one(None).get(
            timeout=60)
        assert isinstance(host, str) and isinstance(master_port, int)
        done = spmd_actors.main.call("127.0.0.1", master_port, [TRAIN, str(tmp_path)]).get(
            timeout=180)
        assert list(done.values()) == [True, True]
    finally:
        local_proc_mesh.stop().get(timeout=30)
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r, g in enumerate(got):
        assert g["env"] == {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                            "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": str(master_port), "GROUP_RANK": "0"}
        assert g["world"] == 2 and g["argv"] == [TRAIN, str(tmp_path)]
    assert got[0]["weight"] == got[1]["weight"]  # DDP kept the replicas identical


@pytest.mark.timeout(120)
def test_a_failing_script_fails_the_call(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nsys.exit(3)\n")
    pm = this_host().spawn_procs(per_host={"procs": 1})
    try:
        actors = pm.spawn("spmd", SPMDActor)
        with pytest.raises(Exception, match="exited with 3"):
            actors.main.call("127.0.0.1", 1, [str(bad)]).get(timeout=60)
        with pytest.raises(Exception, match="needs \\[script"):
            actors.main.call("127.0.0.1", 1, []).get(timeout=60)
    finally:
        pm.stop().get(timeout=30)


@pytest.mark.timeout(60)
def test_heartbeats_do_not_start_cuda_in_a_proc():
    """A proc's heartbeat must not call torch.cuda.is_available() before CUDA is in use:
    that starts the driver, after which SPMDActor cannot widen CUDA_VISIBLE_DEVICES."""
    from _gpu_actors import CudaProbe

    with configured(heartbeat_interval=0.1):
        pm = this_host().spawn_procs(per_host={"procs": 1})
    try:
        n = pm.spawn("probe", CudaProbe).count_is_available.call_one(1.0).get(timeout=30)
        assert n == 0
    finally:
        pm.stop().get(timeout=30)


@pytest.mark.timeout(90)
def test_setup_env_gives_a_gpu_proc_torchruns_view_of_the_host(monkeypatch):
    """Procs the runtime gave one GPU each (faked count: MONARCH_GPU_COUNT) see the host's
    whole list again after setup_env, so set_device(LOCAL_RANK) picks their own GPU."""
    from _gpu_actors import EnvProbe

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    with configured(gpu_count=2):
        pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        names = ["CUDA_VISIBLE_DEVICES", "LOCAL_RANK"]
        probe = pm.spawn("probe", EnvProbe)
        before = probe.env.call(names).get(timeout=60)
        assert [v["CUDA_VISIBLE_DEVICES"] for v in before.values()] == ["3", "5"]
        pm.spawn("_SPMDActor", SPMDActor).setup_env.call("127.0.0.1", 1).get(timeout=60)
        after = probe.env.call(names).get(timeout=60)
        assert [(v["CUDA_VISIBLE_DEVICES"], v["LOCAL_RANK"]) for v in after.values()] == [
            ("3,5", "0"), ("3,5", "1")]  # entry LOCAL_RANK of the list: the proc's own GPU
    finally:
        pm.stop().get(timeout=30)
