"""Real host agents started directly inside the test cluster's node namespaces (no SLURM)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HB_TIMEOUT = 3.0  # heartbeat timeout for the multi-host runtime tests (controller and agents)
REPO = Path(__file__).resolve().parents[2]


class Agents:
    """Real host agents, one per node namespace, started directly (no SLURM)."""

    def __init__(self, cluster, key_file: Path, tmp: Path) -> None:
        self.cluster, self.key_file, self.tmp = cluster, key_file, tmp
        self.procs: dict[str, subprocess.Popen] = {}
        self.info: dict[str, dict] = {}  # node -> what its agent wrote to --address-file

    def log(self, node: str) -> str:
        """What the agent on `node` wrote to stderr/stdout so far."""
        return (self.tmp / f"{node}.log").read_text(errors="replace")

    def start(self, node: str, key_file: Path | None = None, extra: tuple = ()) -> str:
        af = self.tmp / f"{node}.{time.monotonic_ns()}.addr"
        out = open(self.tmp / f"{node}.log", "ab")
        env = {**os.environ, "PYTHONPATH": str(REPO), "MONARCH_HEARTBEAT_TIMEOUT": str(HB_TIMEOUT)}
        p = self.cluster.popen(node, [sys.executable, "-m", "runtime.host", "--listen",
                                      f"tcp://{self.cluster.addr(node)}:0", "--key-file",
                                      str(key_file or self.key_file), "--address-file", str(af),
                                      *extra],
                               env=env, cwd=str(REPO), stdout=out, stderr=subprocess.STDOUT)
        out.close()
        self.procs[node] = p
        deadline = time.monotonic() + 30
        while not af.exists():
            if p.poll() is not None:
                raise RuntimeError(f"agent on {node} exited with {p.returncode}: {self.log(node)}")
            assert time.monotonic() < deadline, f"agent on {node} published no address"
            time.sleep(0.05)
        self.info[node] = json.loads(af.read_text())
        return self.info[node]["address"]

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


