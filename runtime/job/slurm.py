"""SlurmJob: one batch job whose tasks start one host agent per node.

The batch script starts one `srun -N1 -n1 -w HOST` step per host, in the background, and
is submitted with `--no-kill --no-requeue`: when a node is lost the job shrinks and the
other agents keep running. Agents write their addresses to files in a shared directory.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from .base import Job, JobError, read_address_files, slots, tail
from .gateway import gateway_address, gateway_option

__all__ = ["DEFAULT_ADDRESS_CMD", "format_time_limit", "SlurmJob"]

# Pick the address other nodes reach this one at: the node name's address unless it is a
# loopback alias (Debian maps the hostname to 127.0.1.1), else the first of `hostname -I`.
DEFAULT_ADDRESS_CMD = ('a=$(getent hosts "$(hostname)" | awk \'{print $1; exit}\'); '
                       'case "$a" in ""|127.*|::1) a=$(hostname -I | cut -d" " -f1);; esac; echo "$a"')
_TIME_RE = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")
#: PENDING reasons of a job that cannot start as submitted (SLURM's squeue %r)
_NEVER_STARTS = {"BadConstraints", "DependencyNeverSatisfied", "InvalidAccount", "InvalidQOS",
                 "AccountNotAllowed", "QOSNotAllowed", "ReqNodeNotAvail", "JobLaunchFailure",
                 "NodeDown", "FrontEndDown", "Nodes_required_for_job_are_DOWN,_DRAINED_or_"
                 "reserved_for_jobs_in_higher_priority_partitions"}
_ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "RESIZING", "SUSPENDED",
           "REQUEUED", "STAGE_OUT", "SIGNALING"}


def _sbatch_value(name: str, value: object) -> str:
    text = str(value)
    if not text or any(c.isspace() for c in text) or "\n" in text:
        raise ValueError(f"{name} must be a non-empty value without spaces, got {value!r}")
    return text


def format_time_limit(value: int | str | None) -> str | None:
    """SLURM time limit from minutes (int) or a SLURM time string ('1:00:00', '2-0')."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"time_limit must be minutes or a SLURM time string, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"time_limit must be at least 1 minute, got {value}")
        return str(value)
    if isinstance(value, str) and _TIME_RE.match(value):
        return value
    raise ValueError(f"time_limit must be minutes or a SLURM time string like '1:00:00', got {value!r}")


def _positive(name: str, value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _monarch_names(kw: dict, python: str, sbatch_args: Any, port: int, workdir: Any) -> tuple:
    """Accept Monarch's SlurmJob keyword names (python_exe, slurm_args, monarch_port, log_dir,
    job_start_timeout, ntasks_per_node=1); they are removed from `kw`."""
    python = kw.pop("python_exe", python)
    if "slurm_args" in kw:
        sbatch_args = [a for a in kw.pop("slurm_args") if str(a).startswith("-")]
    port = kw.pop("monarch_port", port)
    workdir = kw.pop("log_dir", workdir)
    if kw.get("job_start_timeout") is not None:
        kw["timeout"] = kw.pop("job_start_timeout")
    kw.pop("job_start_timeout", None)
    tasks = kw.pop("ntasks_per_node", 1)
    if tasks != 1:
        raise ValueError(f"ntasks_per_node={tasks!r}: one host agent runs per node here "
                         f"(procs per node come from spawn_procs(per_host=...))")
    return python, sbatch_args, port, workdir


class SlurmJob(Job):
    """Submit one sbatch job that runs a host agent on every allocated node."""

    kind = "slurm"

    def __init__(self, meshes: dict[str, int], *, partition: str | None = None,
                 time_limit: int | str | None = None, account: str | None = None,
                 qos: str | None = None, job_name: str = "monarch",
                 sbatch_args: list[str] | tuple[str, ...] = (), python: str = sys.executable,
                 address_cmd: str = DEFAULT_ADDRESS_CMD, port: int = 0,
                 chdir: str | os.PathLike | None = None, workdir: str | os.PathLike | None = None,
                 gpus_per_node: int | None = None, cpus_per_task: int | None = None,
                 mem: str | None = None, exclusive: bool = False,
                 gateway: bool | str = False, **kw) -> None:
        python, sbatch_args, port, workdir = _monarch_names(kw, python, sbatch_args, port, workdir)
        if workdir is None:  # must be on a filesystem every node sees: the home directory
            workdir = Path.home() / ".monarch" / "jobs"
        super().__init__(meshes, workdir=workdir, **kw)
        self.partition = _sbatch_value("partition", partition) if partition is not None else None
        self.time_limit = format_time_limit(time_limit)
        self.account = _sbatch_value("account", account) if account is not None else None
        self.qos = _sbatch_value("qos", qos) if qos is not None else None
        self.job_name = _sbatch_value("job_name", job_name)
        self.sbatch_args = [str(a) for a in sbatch_args]
        self.python = python
        self.address_cmd = address_cmd
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"port must be 0 (any) or a TCP port number, got {port!r}")
        self.port = port
        self.chdir = Path(chdir) if chdir is not None else Path.cwd()
        self.gpus_per_node = _positive("gpus_per_node", gpus_per_node)
        self.cpus_per_task = _positive("cpus_per_task", cpus_per_task)
        self.mem = _sbatch_value("mem", mem) if mem is not None else None
        self.exclusive = bool(exclusive)
        self.gateway, self._gateway_port = gateway_option(gateway)
        self.job_id: str | None = None
        self._last_state = "not submitted"

    # --- rendering (pure) ---------------------------------------------------------------
    def render_script(self, workdir: Path | None = None, key_file: Path | None = None) -> str:
        """The sbatch script: directives, then one background srun per host, then wait."""
        workdir = Path(workdir or self.workdir or "$MONARCH_JOB_DIR")
        key_file = Path(key_file or self.key_file or workdir / "cluster.key")
        q = shlex.quote
        lines = ["#!/bin/bash",
                 f"#SBATCH --job-name={self.job_name}",
                 f"#SBATCH --nodes={self.hosts}",
                 "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --no-kill",
                 "#SBATCH --no-requeue",
                 f"#SBATCH --chdir={self.chdir}",
                 f"#SBATCH --output={workdir}/slurm-%j.out"]
        for opt, val in (("partition", self.partition), ("time", self.time_limit),
                         ("account", self.account), ("qos", self.qos),
                         ("gpus-per-node", getattr(self, "gpus_per_node", None)),
                         ("cpus-per-task", getattr(self, "cpus_per_task", None)),
                         ("mem", getattr(self, "mem", None))):
            if val is not None:
                lines.append(f"#SBATCH --{opt}={val}")
        if getattr(self, "exclusive", False) and "--exclusive" not in self.sbatch_args:
            lines.append("#SBATCH --exclusive")
        lines += [f"#SBATCH {a}" for a in self.sbatch_args]
        names = " ".join(q(m) for m, _ in slots(self.meshes))
        index = " ".join(str(i) for _, i in slots(self.meshes))
        agent = ('ADDR=$(' + self.address_cmd + '); '
                 f'exec "$0" -m runtime.host --listen "tcp://$ADDR:{self.port}" '
                 '--key-file "$1" --address-file "$2" --log-dir "$3"')
        gw = getattr(self, "gateway", False)
        if gw:  # the first agent also runs the job's gateway (docs/multihost.md)
            agent += '${4:+ --gateway "tcp://$ADDR:$4"}'
        lines += [
            "set -u",
            f"JOBDIR={q(str(workdir))}",
            f"MESHES=({names})",
            f"INDEX=({index})",
            'mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
            f'if [ "${{#HOSTS[@]}}" -lt {self.hosts} ]; then',
            f'  echo "monarch: expected {self.hosts} nodes, got ${{#HOSTS[@]}}" >&2; exit 1',
            "fi",
            'for i in "${!MESHES[@]}"; do',
            '  slot="${MESHES[$i]}.${INDEX[$i]}"',
            *([f'  GW=""; [ "$i" -eq 0 ] && GW={self._gateway_port}'] if gw else []),
            '  srun --nodes=1 --ntasks=1 --nodelist="${HOSTS[$i]}" --kill-on-bad-exit=0 \\',
            '    --output="$JOBDIR/agent-$slot.log" \\',
            f"    bash -c {q(agent)} {q(self.python)} {q(str(key_file))} "
            '"$JOBDIR/addrs/$slot.addr" "$JOBDIR/logs"' + (' "$GW"' if gw else '') + ' &',
            "done",
            "wait",
        ]
        return "\n".join(lines) + "\n"

    def _spec(self) -> dict:
        return {"meshes": self.meshes, "script": self.render_script(Path("/"), Path("/k"))}

    def _alive(self) -> bool:
        return self.slurm_state() in _ACTIVE

    def _gateway_address(self) -> str | None:
        assert self.workdir is not None
        return gateway_address(self.gateway, self.workdir / "addrs", slots(self.meshes)[0])

    # --- Job hooks ----------------------------------------------------------------------
    def _launch(self) -> None:
        assert self.workdir is not None
        (self.workdir / "addrs").mkdir(mode=0o700, exist_ok=True)
        script = self.workdir / "job.sbatch"
        script.write_text(self.render_script())
        r = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True,
                           text=True, timeout=60)
        if r.returncode != 0:
            raise JobError(f"sbatch failed ({r.returncode}): {r.stderr.strip()}")
        self.job_id = r.stdout.strip().split(";")[0]
        if not self.job_id.isdigit():
            raise JobError(f"sbatch printed no job id: {r.stdout!r}")

    def slurm_state(self) -> str:
        """The job's SLURM state (PENDING, RUNNING, ...), or 'GONE' once squeue forgot it."""
        if self.job_id is None:
            return "NOT_SUBMITTED"
        state, _ = self._squeue()
        return state

    def _squeue(self) -> tuple[str, str]:
        r = subprocess.run(["squeue", "-h", "-j", str(self.job_id), "-o", "%T|%r"],
                           capture_output=True, text=True, timeout=30)
        line = r.stdout.strip().split("\n")[0] if r.returncode == 0 else ""
        state, _, reason = line.partition("|")
        return (state or "GONE"), ("" if reason in ("", "None") else reason)

    def _addresses(self) -> dict[tuple[str, int], str]:
        assert self.workdir is not None
        return read_address_files(self.workdir / "addrs", slots(self.meshes))

    def _check(self) -> str:
        state, reason = self._squeue()
        self._last_state = state
        if state not in _ACTIVE:
            raise JobError(f"slurm job {self.job_id} ended ({state}) before all agents "
                           f"started{self._diagnostics()}")
        self._last_reason = reason
        queued = ", queued: waiting for its allocation" if self._queued() else ""
        return f"job {self.job_id} {state}" + (f" ({reason})" if reason else "") + queued

    def _queued(self) -> bool:
        """PENDING in the queue for a reason it may leave (resources, priority, a hold, a
        begin time: reported by `_check`), not for one that never clears (a partition
        too small, a bad constraint), whose start deadline keeps running."""
        reason = getattr(self, "_last_reason", "")
        return getattr(self, "_last_state", "") == "PENDING" and not (
            reason in _NEVER_STARTS or reason.startswith("Partition"))

    def _diagnostics(self) -> str:
        if self.workdir is None:
            return ""
        out = [f"\n--- {p.name}\n{tail(p)}" for p in sorted(self.workdir.glob("*.out"))]
        out += [f"\n--- {p.name}\n{tail(p, 10)}" for p in sorted(self.workdir.glob("agent-*.log"))]
        return "".join(out)

    def _cancel(self) -> None:
        if self.job_id is None:
            return
        subprocess.run(["scancel", self.job_id], capture_output=True, timeout=30)
        import time
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and self.slurm_state() in _ACTIVE:
            time.sleep(0.2)

    def agent_log(self, mesh: str, index: int) -> str:
        """The output of one agent's srun step (what it printed before and while serving)."""
        assert self.workdir is not None
        return tail(self.workdir / f"agent-{mesh}.{index}.log", 200)
