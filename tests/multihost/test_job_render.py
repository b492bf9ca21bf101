"""Jobs without a cluster: argument checks, rendered sbatch scripts, ssh commands, manifests."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.job import KubernetesJob, LocalJob, SlurmJob, SSHJob
from runtime.job.base import check_meshes, parse_address, read_address_files, slots
from runtime.job.ssh import ADDRESS_TAG, remote_script, ssh_argv
from _procs import end_popen

STANDIN = Path(__file__).parent / "fixtures" / "standin_agent.py"


@pytest.mark.parametrize("bad, words", [
    ({}, "non-empty"), ({"1x": 2}, "identifier"), ({"a": 0}, "positive"),
    ({"a": True}, "positive"), ({"a": 1.5}, "positive"), ([("a", 1)], "dict"),
])
def test_bad_meshes_are_named(bad, words):
    with pytest.raises(ValueError, match=words):
        check_meshes(bad)


def test_parse_address():
    assert parse_address("tcp://10.77.0.1:4242\n") == "tcp://10.77.0.1:4242"
    assert parse_address("tcp://[::1]:1") == "tcp://[::1]:1"
    assert parse_address('{"address": "tcp://h1:7", "ipc": "ipc:///x"}') == "tcp://h1:7"
    for bad in ["", '{"address": "ipc:///x"}', '{"addr', "tcp://h:0", "tcp://h:70000", "ipc:///x", "tcp://h", "tcp://a b:1"]:
        with pytest.raises(ValueError, match="not an agent address"):
            parse_address(bad)


def test_address_files_skip_partial(tmp_path):
    (tmp_path / "m.0.addr").write_text("tcp://10.0.0.1:5\n")
    (tmp_path / "m.1.addr").write_text("tcp://10.0.0.")  # being written
    assert read_address_files(tmp_path, slots({"m": 3})) == {("m", 0): "tcp://10.0.0.1:5"}


def test_local_job_arguments():
    with pytest.raises(ValueError, match="exactly one"):
        LocalJob()
    with pytest.raises(ValueError, match="exactly one"):
        LocalJob(2, meshes={"a": 2})
    assert LocalJob(3).meshes == {"hosts": 3}
    with pytest.raises(ValueError, match="key_file"):
        LocalJob(1, key_file="/nonexistent/key")


def test_slurm_script(tmp_path):
    job = SlurmJob({"trainers": 2, "gen": 1}, partition="debug", time_limit=30,
                   account="acct", sbatch_args=["--exclusive"], workdir=tmp_path)
    text = job.render_script(tmp_path / "j", tmp_path / "j" / "cluster.key")
    d = dict(line[len("#SBATCH --"):].split("=", 1) if "=" in line else (line[10:], "")
             for line in text.splitlines() if line.startswith("#SBATCH --"))
    assert d["nodes"] == "3" and d["ntasks-per-node"] == "1" and d["partition"] == "debug"
    assert d["time"] == "30" and d["account"] == "acct"
    assert "no-kill" in d and "no-requeue" in d and "exclusive" in d
    assert "MESHES=(trainers trainers gen)" in text and "INDEX=(0 1 0)" in text
    # one single-node srun per host, in the background, then wait
    assert text.count("srun --nodes=1 --ntasks=1 --nodelist=") == 1 and " &\ndone\nwait\n" in text
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_slurm_bad_options(tmp_path):
    with pytest.raises(ValueError, match="time_limit"):
        SlurmJob({"a": 1}, time_limit="soon", workdir=tmp_path)
    with pytest.raises(ValueError, match="partition"):
        SlurmJob({"a": 1}, partition="a b", workdir=tmp_path)
    with pytest.raises(ValueError, match="port"):
        SlurmJob({"a": 1}, port=70000, workdir=tmp_path)


def test_ssh_argv_and_errors():
    argv = ssh_argv("user@h1", "echo hi")
    assert argv[0] == "ssh" and "BatchMode=yes" in argv and argv[-2] == "user@h1"
    assert argv[-1] == "sh -c 'echo hi'"
    for bad in ["", "-oProxyCommand=x", "a b"]:
        with pytest.raises(ValueError, match="bad ssh host"):
            ssh_argv(bad, "true")
    with pytest.raises(ValueError, match="hosts"):
        SSHJob([])
    with pytest.raises(ValueError, match="need 3 hosts"):
        SSHJob(["a", "b"], meshes={"m": 3})
    job = SSHJob(["h1", "h2"], meshes={"a": 1, "b": 1})
    assert [v[-2] for v in job.argvs.values()] == ["h1", "h2"]
    assert all("cluster.key" not in " ".join(v) for v in job.argvs.values())  # key goes by stdin


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["eof", "agent-dies"])
def test_ssh_remote_script_runs_agent_and_stops_it(tmp_path, how):
    """The remote script itself (run by a local sh instead of sshd) with a stand-in agent."""
    script = remote_script(python=str(STANDIN), address_cmd="echo 127.0.0.1")
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)}
    p = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    try:
        key = b"k" * 80
        p.stdin.write(b"%d\n" % len(key) + key)
        p.stdin.flush()
        line = p.stdout.readline().decode()
        assert line.startswith(ADDRESS_TAG)
        host, port = parse_address(line[len(ADDRESS_TAG):])[6:].rsplit(":", 1)
        import socket
        with socket.create_connection((host, int(port)), timeout=5) as c:
            assert c.recv(100).decode().split()[1] == "0o600"  # key file readable by user only
        import psutil
        agent = [c.pid for c in psutil.Process(p.pid).children()
                 if c.cmdline()[1:2] == [str(STANDIN)]]
        assert len(agent) == 1
        if how == "eof":
            p.stdin.close()
        else:
            import os, signal
            os.kill(agent[0], signal.SIGKILL)
        p.wait(timeout=10)
        from .mhcluster import pid_alive
        deadline = time.monotonic() + 10  # the agent ends and its key directory goes
        while pid_alive(agent[0]) or list(tmp_path.glob("monarch-agent.*")):
            assert time.monotonic() < deadline, (pid_alive(agent[0]),
                                                 list(tmp_path.glob("monarch-agent.*")))
            time.sleep(0.02)
    finally:
        end_popen(p)


def test_kubernetes_manifests_validate():
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    job = KubernetesJob({"trainers": 2, "gen_x": 1}, image="registry.example/monarch:1",
                        cpu="2", memory="4Gi", gpus=1)
    docs = job.manifests(key=b"secret")
    kinds = [d["kind"] for d in docs]
    assert kinds == ["Service", "Secret", "Job", "Job"]
    for d in docs:
        kv.validate(d, kv.latest_version(), strict=True)  # raises on any schema violation
    svc, _, trainers, gen = docs
    assert svc["spec"]["clusterIP"] == "None"
    assert trainers["spec"]["completionMode"] == "Indexed" and trainers["spec"]["completions"] == 2
    pod = trainers["spec"]["template"]
    assert pod["spec"]["subdomain"] == svc["metadata"]["name"]
    assert all(pod["metadata"]["labels"][k] == v for k, v in svc["spec"]["selector"].items())
    assert gen["metadata"]["name"] == "monarch-gen-x"
    assert job.addresses()[("gen_x", 0)] == "tcp://monarch-gen-x-0.monarch-agents.default.svc:26600"
    import yaml
    assert list(yaml.safe_load_all(job.to_yaml())) == job.manifests()


def test_kubernetes_bad_names():
    with pytest.raises(ValueError, match="DNS label"):
        KubernetesJob({"a": 1}, image="x", name="Bad_Name")
    with pytest.raises(ValueError, match="image"):
        KubernetesJob({"a": 1}, image="")


def test_parse_alloc():
    from monarch_kernel.args import parse_alloc

    s = parse_alloc("trainers --job slurm --hosts 2 --per-host procs=2 --partition debug --time 10")
    assert (s.name, s.kind, s.hosts, s.per_host) == ("trainers", "slurm", 2, {"procs": 2})
    assert s.options == {"partition": "debug", "time_limit": "10"}
    job = s.make_job()
    assert isinstance(job, SlurmJob) and job.meshes == {"trainers": 2} and job.partition == "debug"
    assert parse_alloc("w --hosts 3").make_job().meshes == {"w": 3}
    assert parse_alloc("w --hosts 1 --per-host procs=2,gpus=4").per_host == {"procs": 2, "gpus": 4}
    s = parse_alloc("w --job ssh --ssh-hosts a b --per-host gpus=8")
    assert s.hosts == 2 and s.per_host == {"gpus": 8} and s.make_job().host_names == ["a", "b"]
    for line, words in [("w", "--hosts"), ("w --hosts 0", "positive"), ("1w --hosts 1", "identifier"),
                        ("w --hosts 2 --per-host procs", "DIM=N"), ("w --hosts 1 --job pbs", "invalid choice"),
                        ("w --hosts 1 --partition p", "does not apply"), ("w --hosts 1 --bogus", "unknown"),
                        ("w --job kubernetes --hosts 1", "--image"), ("w --job ssh --hosts 1", "--ssh-hosts")]:
        with pytest.raises(ValueError, match=words):
            parse_alloc(line)
