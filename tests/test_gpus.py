"""One GPU per proc: the pure choice of CUDA_VISIBLE_DEVICES, and spawn_procs applying it
(with a faked device count: MONARCH_GPU_COUNT, so this runs without GPUs)."""

from __future__ import annotations

import pytest

from runtime import configured, this_host
from runtime.gpus import GPUSpawnError, gpu_dim, proc_gpu_env, visible_list
from _gpu_actors import EnvProbe

pytestmark = pytest.mark.timeout(90)
VARS = ["CUDA_VISIBLE_DEVICES", "RUNTIME_HOST_CUDA_VISIBLE_DEVICES"]


def env_for(per_host, coords, user_env=None, visible=None, count=8):
    return proc_gpu_env(per_host, coords, user_env=user_env or {}, parent_visible=visible,
                        device_count=count)


def test_each_coordinate_gets_its_own_device():
    got = [env_for({"gpus": 4}, {"gpus": i})["CUDA_VISIBLE_DEVICES"] for i in range(4)]
    assert got == ["0", "1", "2", "3"]
    # the gpu dimension need not be last; "gpu" is accepted too
    assert env_for({"gpu": 2, "x": 3}, {"gpu": 1, "x": 2})["CUDA_VISIBLE_DEVICES"] == "1"
    assert gpu_dim({"procs": 2}) is None and gpu_dim({"gpus": 1, "gpu": 2}) == "gpus"


def test_a_parent_list_is_mapped_into():
    e = env_for({"gpus": 2}, {"gpus": 1}, visible="5, 7,GPU-abc")
    assert e == {"CUDA_VISIBLE_DEVICES": "7", "RUNTIME_HOST_CUDA_VISIBLE_DEVICES": "5,7,GPU-abc"}
    assert visible_list(None, 3) == ["0", "1", "2"] and visible_list("", 3) == []


def test_nothing_when_user_sets_it_or_no_gpus_or_no_gpu_dim():
    assert env_for({"gpus": 2}, {"gpus": 0}, user_env={"CUDA_VISIBLE_DEVICES": "3"}) == {}
    assert env_for({"gpus": 16}, {"gpus": 9}, count=0) == {}  # only a name without GPUs
    assert env_for({"procs": 2}, {"procs": 1}) == {}


def test_too_many_gpu_procs_is_a_clear_error():
    with pytest.raises(GPUSpawnError, match=r"'gpus': 3.*2 CUDA device\(s\)"):
        env_for({"gpus": 3}, {"gpus": 0}, count=2)
    with pytest.raises(GPUSpawnError, match="CUDA_VISIBLE_DEVICES='4'"):
        env_for({"gpus": 2}, {"gpus": 0}, visible="4")


def test_spawn_procs_gives_each_proc_a_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with configured(gpu_count=2):
        pm = this_host().spawn_procs(per_host={"gpus": 2})
        try:
            got = pm.spawn("probe", EnvProbe).env.call(VARS).get(timeout=60)
            assert [v["CUDA_VISIBLE_DEVICES"] for v in got.values()] == ["0", "1"]
            assert {v["RUNTIME_HOST_CUDA_VISIBLE_DEVICES"] for v in got.values()} == {"0,1"}
        finally:
            pm.stop().get(timeout=20)
        with pytest.raises(GPUSpawnError, match="asks for one GPU per proc"):
            this_host().spawn_procs(per_host={"gpus": 3})
        # the user's own placement wins
        pm = this_host().spawn_procs(per_host={"gpus": 2}, env={"CUDA_VISIBLE_DEVICES": "1"})
        try:
            got = pm.spawn("probe", EnvProbe).env.call(VARS).get(timeout=60)
            assert [v["CUDA_VISIBLE_DEVICES"] for v in got.values()] == ["1", "1"]
        finally:
            pm.stop().get(timeout=20)


def test_without_gpus_the_dimension_is_only_a_name(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with configured(gpu_count=0):
        pm = this_host().spawn_procs(per_host={"gpus": 3})
        try:
            got = pm.spawn("probe", EnvProbe).env.call(VARS).get(timeout=60)
            assert all(v["CUDA_VISIBLE_DEVICES"] is None for v in got.values())
        finally:
            pm.stop().get(timeout=20)


def test_a_remote_hosts_agent_places_procs_on_its_own_gpus(tmp_path, monkeypatch):
    """An attached (listening) agent with 2 GPUs of its own (faked: MONARCH_GPU_COUNT) and
    CUDA_VISIBLE_DEVICES=4,6 places the procs; asking for 3 fails those procs saying why."""
    import json
    import os
    import subprocess
    import sys
    import time

    from runtime import attach_to_workers
    from runtime.transport import auth

    key_file = str(tmp_path / "cluster.key")
    auth.write_key_file(key_file)
    addr_file = tmp_path / "agent.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), MONARCH_GPU_COUNT="2",
               CUDA_VISIBLE_DEVICES="4,6")
    agent = subprocess.Popen([sys.executable, "-m", "runtime.host", "--listen",
                              "tcp://127.0.0.1:0", "--key-file", key_file, "--address-file",
                              str(addr_file), "--parent-pid", str(os.getpid())], env=env)
    try:
        deadline = time.monotonic() + 30
        while not addr_file.exists():
            assert agent.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        hosts = attach_to_workers([json.loads(addr_file.read_text())["address"]],
                                  key_file=key_file)
        with configured(gpu_count=0):  # the controller's host has none: the agent decides
            pm = hosts.spawn_procs(per_host={"gpus": 2})
        got = pm.spawn("probe", EnvProbe).env.call(VARS).get(timeout=60)
        assert [v["CUDA_VISIBLE_DEVICES"] for v in got.values()] == ["4", "6"]
        pm.stop().get(timeout=20)
        with configured(gpu_count=0):
            bad = hosts.spawn_procs(per_host={"gpus": 3})
        with pytest.raises(Exception, match="asks for one GPU per proc"):
            bad.spawn("probe", EnvProbe).env.call(VARS).get(timeout=60)
        bad.stop().get(timeout=20)
        hosts.shutdown()
    finally:
        if agent.poll() is None:
            agent.kill()
        agent.wait(10)
