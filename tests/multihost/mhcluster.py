"""A throwaway SLURM cluster whose nodes are network namespaces, for the multi-host tests.

`Cluster.up()` runs cluster/up.sh, `Cluster.down()` runs cluster/down.sh and checks that no
daemon, namespace, bridge or process of the cluster is left. Root only (see `unavailable()`).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from runtime._base.process import start_time

HERE = Path(__file__).resolve().parent
UP = HERE / "cluster" / "up.sh"
DOWN = HERE / "cluster" / "down.sh"
REQUIRED = ("slurmctld", "slurmd", "sbatch", "srun", "scancel", "munged", "mungekey", "nft",
            "ip", "nsenter", "unshare")


def unavailable(prefix: str = "mh") -> str | None:
    """Why the namespaced cluster cannot run on this machine, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, slurmd)"
    missing = [c for c in REQUIRED if shutil.which(c) is None]
    if missing:
        return f"missing commands: {' '.join(missing)} (apt-get install slurm-wlm munge nftables iproute2)"
    probe = f"{prefix}probe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot create network namespaces: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    reclaim_abandoned(prefix)
    if Path(f"/sys/class/net/{prefix}br0").exists():
        owner = _owner(prefix)
        who = f" (test process {owner['pid']})" if owner else ""
        return (f"bridge {prefix}br0 already exists: another multihost test run{who} holds "
                "the cluster")
    return None


def _owner_file(prefix: str) -> Path:
    """Where a cluster of `prefix` that is up says which test process owns it."""
    return Path(f"/run/mhcluster-{prefix}.json")


def _owner(prefix: str) -> dict | None:
    try:
        return json.loads(_owner_file(prefix).read_text())
    except (OSError, ValueError):
        return None


def reclaim_abandoned(prefix: str = "mh") -> bool:
    """Tear down a cluster of `prefix` whose test process is gone (a run killed from
    outside: its fixture's tear-down never ran), with the directory, size and network it
    recorded, so that this run has it instead of skipping. True when there was one."""
    owner = _owner(prefix)
    if owner is None or start_time(int(owner["pid"])) == owner.get("start"):
        return False  # none recorded, or its owner still runs
    env = {**os.environ, "MH_DIR": str(owner["dir"]), "N": str(owner["n"]),
           "MH_NET": str(owner["net"]), "MH_PFX": prefix}
    subprocess.run(["nft", "delete", "table", "inet", f"{prefix}fence"], capture_output=True)
    subprocess.run(["bash", str(DOWN)], env=env, capture_output=True, timeout=60)
    _owner_file(prefix).unlink(missing_ok=True)
    return True


def pid_alive(pid: int) -> bool:
    """True when pid exists and is not a zombie (PID 1 may reap late here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass
class Cluster:
    """Handle on one throwaway cluster: addresses, SLURM environment, namespace helpers."""

    n: int = 3
    net: str = "10.77.0"
    prefix: str = "mh"
    dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="mhcluster.")))
    pids: list[int] = field(default_factory=list)
    up_seconds: float = 0.0
    _started: list[subprocess.Popen] = field(default_factory=list)

    @property
    def nodes(self) -> list[str]:
        return [f"{self.prefix}{i}" for i in range(1, self.n + 1)]

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br0"

    @property
    def controller_addr(self) -> str:
        """This (root) namespace's address on the bridge."""
        return f"{self.net}.254"

    def addr(self, node: str) -> str:
        return f"{self.net}.{self.nodes.index(node) + 1}"

    def veth(self, node: str) -> str:
        return f"{self.prefix}v{self.nodes.index(node) + 1}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for SLURM client commands."""
        return {**os.environ, "SLURM_CONF": str(self.dir / "slurm.conf")}

    def _script_env(self) -> dict[str, str]:
        return {**os.environ, "MH_DIR": str(self.dir), "N": str(self.n), "MH_NET": self.net,
                "MH_PFX": self.prefix}

    def up(self) -> None:
        t0 = time.monotonic()
        r = subprocess.run(["bash", str(UP)], env=self._script_env(), capture_output=True,
                           text=True, timeout=120)
        if r.returncode != 0:
            logs = self.logs()
            self.down(check=False)
            raise RuntimeError(f"cluster up failed ({r.returncode}): {r.stderr[-2000:]}\n{logs}")
        self.up_seconds = time.monotonic() - t0
        self.pids = [int(p.read_text()) for p in sorted(self.dir.glob("*.pid"))]
        _owner_file(self.prefix).write_text(json.dumps({
            "pid": os.getpid(), "start": start_time(os.getpid()), "dir": str(self.dir),
            "n": self.n, "net": self.net}))
        self.check_route()

    def check_route(self) -> None:
        """Raise unless every node address is routed over the test bridge from here."""
        for node in self.nodes:
            out = subprocess.run(["ip", "route", "get", self.addr(node)], capture_output=True,
                                 text=True).stdout
            if f"dev {self.bridge} " not in out:
                raise RuntimeError(f"{self.addr(node)} is not routed via {self.bridge}: {out!r}")

    def logs(self) -> str:
        parts = []
        for p in sorted((self.dir / "log").glob("*.log")):
            parts.append(f"--- {p.name}\n" + p.read_text(errors="replace")[-1500:])
        return "\n".join(parts)

    def run(self, *argv: str, timeout: float = 30, node: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
        """Run a command here (SLURM env set), or inside `node`'s namespace with its hostname."""
        cmd = list(argv) if node is None else self.in_node(node, list(argv))
        r = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"{cmd} failed ({r.returncode}): {r.stderr[-2000:]}")
        return r

    def in_node(self, node: str, argv: list[str]) -> list[str]:
        """argv wrapped to run in `node`'s network namespace with its hostname and /etc/hosts."""
        import shlex
        inner = (f"mount --bind {self.dir}/hosts /etc/hosts && hostname {node} && exec "
                 + " ".join(shlex.quote(a) for a in argv))
        return ["nsenter", f"--net=/run/netns/{node}", "unshare", "--uts", "--mount",
                "sh", "-c", inner]

    def popen(self, node: str, argv: list[str], **kw) -> subprocess.Popen:
        """Start a long-running process inside `node`; down() kills it by pid if still alive."""
        p = subprocess.Popen(self.in_node(node, argv), env=kw.pop("env", self.env), **kw)
        self._started.append(p)
        return p

    def ns_pids(self) -> dict[str, list[int]]:
        """Live pids inside each of the cluster's namespaces."""
        out = {}
        for ns in [f"{self.prefix}ctl", *self.nodes]:
            r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            out[ns] = [int(x) for x in r.stdout.split() if pid_alive(int(x))]
        return out

    # --- faults -------------------------------------------------------------------------
    def link(self, node: str, up: bool) -> None:
        """Cut (or restore) a node's only link: the whole host disappears from the network."""
        subprocess.run(["ip", "link", "set", self.veth(node), "up" if up else "down"], check=True)

    def partition(self, node: str, peer: str) -> None:
        """Inside `node`, drop all traffic to and from `peer` (both ways); SLURM stays reachable."""
        a = self.addr(peer)
        rules = (f"add table inet mhpart\n"
                 f"add chain inet mhpart in {{ type filter hook input priority 0; }}\n"
                 f"add chain inet mhpart out {{ type filter hook output priority 0; }}\n"
                 f"add rule inet mhpart in ip saddr {a} drop\n"
                 f"add rule inet mhpart out ip daddr {a} drop\n")
        subprocess.run(["nsenter", f"--net=/run/netns/{node}", "nft", "-f", "-"], input=rules,
                       text=True, check=True)

    def heal(self, node: str) -> None:
        subprocess.run(["nsenter", f"--net=/run/netns/{node}", "nft", "delete", "table", "inet",
                        "mhpart"], capture_output=True)

    def fence_controller(self, *allowed: tuple[str, int]) -> None:
        """In this (the controller's) namespace, drop all traffic with the nodes except TCP to
        the (node, port) pairs `allowed` and its answers: as a laptop that reaches one
        forwarded port (or only ssh)."""
        nodes = "{ " + ", ".join(self.addr(n) for n in self.nodes) + " }"
        t = f"inet {self.prefix}fence"
        rules = [f"add table {t}",
                 f"add chain {t} in {{ type filter hook input priority 0; }}",
                 f"add chain {t} out {{ type filter hook output priority 0; }}"]
        for node, port in allowed:
            a = self.addr(node)
            rules += [f"add rule {t} out ip daddr {a} tcp dport {port} accept",
                      f"add rule {t} in ip saddr {a} tcp sport {port} accept"]
        rules += [f"add rule {t} out ip daddr {nodes} drop",
                  f"add rule {t} in ip saddr {nodes} drop"]
        subprocess.run(["nft", "-f", "-"], input="\n".join(rules) + "\n", text=True, check=True)

    def unfence_controller(self) -> None:
        subprocess.run(["nft", "delete", "table", "inet", f"{self.prefix}fence"],
                       capture_output=True)

    # --- teardown -----------------------------------------------------------------------
    def leftovers(self) -> list[str]:
        """What of this cluster still exists: live pids, namespaces, the bridge, the directory."""
        left = [f"pid {p}" for p in self.pids if pid_alive(p)]
        # poll(), not pid_alive(): a reaped child's pid may belong to another process by now
        # (pid_max is 32768 here, and a full test run starts thousands)
        left += [f"started pid {p.pid}" for p in self._started if p.poll() is None]
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        ours = {f"{self.prefix}ctl", *self.nodes}
        left += [f"netns {line.split()[0]}" for line in names.splitlines()
                 if line.split() and line.split()[0] in ours]
        if Path(f"/sys/class/net/{self.bridge}").exists():
            left.append(f"bridge {self.bridge}")
        left += [f"link {v}" for v in (f"{self.prefix}vc", *map(self.veth, self.nodes))
                 if Path(f"/sys/class/net/{v}").exists()]
        if self.dir.exists():
            left.append(f"dir {self.dir}")
        return left

    def down(self, check: bool = True) -> list[str]:
        """Tear everything down; with check, raise if anything is left after a short grace."""
        self.unfence_controller()
        for p in self._started:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self._started:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        subprocess.run(["bash", str(DOWN)], env=self._script_env(), capture_output=True,
                       timeout=60)
        if (_owner(self.prefix) or {}).get("dir") == str(self.dir):
            _owner_file(self.prefix).unlink(missing_ok=True)
        deadline = time.monotonic() + 5
        while (left := self.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.1)
        if check and left:
            raise RuntimeError(f"cluster teardown left: {left}")
        return left
