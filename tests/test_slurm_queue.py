"""SlurmJob's start deadline runs from when the allocation runs, not while the job waits in
SLURM's queue (issue 40, Monarch's #2159): `squeue` is replaced by a script that reports the
job queued for a while, then running, as real SLURM would (the namespaced cluster's test,
tests/multihost/test_slurm_launcher.py, holds a real job)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from runtime.job import JobError, SlurmJob

STANDIN = Path(__file__).parent / "multihost" / "fixtures" / "standin_agent.py"
pytestmark = pytest.mark.timeout(60)


def _fake_slurm(bin_dir: Path, reason: str, queued_polls: int) -> Path:
    """sbatch prints a job id; squeue says PENDING (`reason`) for `queued_polls` calls, then
    RUNNING; a marker file counts the calls. No agent ever publishes an address here."""
    bin_dir.mkdir()
    count = bin_dir / "polls"
    scripts = {
        "sbatch": "#!/bin/sh\necho 4242\n",
        "squeue": (f"#!/bin/sh\n[ -e {bin_dir}/cancelled ] && exit 0\n"
                   f"n=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); "
                   f"echo $n > {count}\nif [ $n -le {queued_polls} ]; then "
                   f"echo 'PENDING|{reason}'; else echo 'RUNNING|None'; fi\n"),
        "scancel": f"#!/bin/sh\ntouch {bin_dir}/cancelled\n",
    }
    for name, text in scripts.items():
        p = bin_dir / name
        p.write_text(text)
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return count


def _job(tmp_path: Path, timeout: float) -> SlurmJob:
    k = tmp_path / "cluster.key"
    k.write_bytes(b"unused")
    k.chmod(0o600)
    return SlurmJob({"m": 1}, python=sys.executable, key_file=k, workdir=tmp_path / "jobs",
                    progress=False, timeout=timeout)


def test_queued_time_does_not_count_against_the_start_timeout(tmp_path, monkeypatch):
    polls = _fake_slurm(tmp_path / "bin", "Resources", queued_polls=20)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    job = _job(tmp_path, timeout=1.0)  # 20 polls at 0.1 s or more are well over 1 s
    with pytest.raises(JobError, match="did not start within") as e:
        job.wait_addresses()
    # the deadline passed only after the job left the queue: every queued poll was waited
    assert int(polls.read_text()) > 20
    assert "RUNNING" in str(e.value)


def test_a_job_that_can_never_start_is_not_waited_for(tmp_path, monkeypatch):
    polls = _fake_slurm(tmp_path / "bin", "PartitionNodeLimit", queued_polls=10**6)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    job = _job(tmp_path, timeout=1.0)
    with pytest.raises(JobError, match=r"PENDING \(PartitionNodeLimit\)"):
        job.wait_addresses()
    assert int(polls.read_text()) < 10**6


def test_the_status_says_queued_and_why(tmp_path, monkeypatch):
    _fake_slurm(tmp_path / "bin", "Priority", queued_polls=10)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    job = _job(tmp_path, timeout=5)
    job.apply()
    assert job._check() == "job 4242 PENDING (Priority), queued: waiting for its allocation"
    job.kill()


def test_gateway_option_of_jobs_and_mesh_alloc(tmp_path):
    """`gateway=` of SlurmJob/SSHJob and `%mesh alloc --gateway [tcp://H:P]`."""
    from monarch_kernel.args import MagicArgError, parse_alloc
    from runtime.job import SSHJob

    spec = parse_alloc("t --job slurm --hosts 2 --gateway")
    assert spec.options == {"gateway": True}
    job = spec.make_job()
    assert job.gateway is True and '--gateway "tcp://$ADDR:$4"' in job.render_script()
    assert "--gateway" not in SlurmJob({"a": 1}).render_script()
    spec = parse_alloc("t --job ssh --ssh-hosts a b --gateway tcp://127.0.0.1:26601")
    ssh = spec.make_job()
    assert ssh.gateway == "tcp://127.0.0.1:26601"
    first = ssh.argvs[("t", 0)][-1]
    assert '--gateway "tcp://$a:26601"' in first and "--gateway" not in ssh.argvs[("t", 1)][-1]
    with pytest.raises(MagicArgError, match="--gateway does not apply to --job process"):
        parse_alloc("t --job process --hosts 1 --gateway")
    for bad in ["127.0.0.1:5", "tcp://h", "ipc:///x", 5]:
        with pytest.raises(ValueError, match="gateway="):
            SlurmJob({"a": 1}, gateway=bad)
        with pytest.raises(ValueError, match="gateway="):
            SSHJob(["h"], gateway=bad)
