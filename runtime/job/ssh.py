"""SSHJob: one `ssh HOST` per host starts its agent; the agent lives as long as the session.

The cluster key travels over the ssh session's stdin into a 0700 directory on the host and
never appears on a command line. The remote script prints the agent's address on stdout;
when the ssh session ends (controller gone, `kill()`), the remote side stops the agent.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

from .base import Job, JobError, parse_address, slots
from .gateway import SSHTunnel, gateway_option
from .slurm import DEFAULT_ADDRESS_CMD

__all__ = ["ADDRESS_TAG", "DEFAULT_SSH_OPTIONS", "remote_script", "ssh_argv", "SSHJob"]

ADDRESS_TAG = "MONARCH_AGENT_ADDRESS "
DEFAULT_SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ServerAliveInterval=5",
                       "-o", "ServerAliveCountMax=3", "-T")


def remote_script(python: str = "python3", port: int = 0,
                  address_cmd: str = DEFAULT_ADDRESS_CMD, chdir: str | None = None,
                  gateway_port: int | None = None) -> str:
    """The shell script run on each host: receive the key, start the agent (with a gateway on
    `gateway_port`, 0: any, when given), report, wait."""
    q = shlex.quote
    cd = f"cd {q(chdir)} && " if chdir else ""
    gw = f' --gateway "tcp://$a:{int(gateway_port)}"' if gateway_port is not None else ""
    return "; ".join([
        "set -eu", "umask 077",
        'd=$(mktemp -d "${TMPDIR:-/tmp}/monarch-agent.XXXXXX")',
        "pid=; w=",
        "trap 'kill $w $pid 2>/dev/null || true; rm -rf \"$d\"' EXIT",
        'read -r n', 'head -c "$n" > "$d/key"',
        f"a=$({address_cmd})",
        f'{cd}{q(python)} -m runtime.host --listen "tcp://$a:{port}" --key-file "$d/key" '
        f'--address-file "$d/addr" --log-dir "$d/logs"{gw} </dev/null >&2 & pid=$!',
        'while [ ! -s "$d/addr" ]; do kill -0 $pid 2>/dev/null || exit 1; sleep 0.1; done',
        f'echo "{ADDRESS_TAG}$(cat "$d/addr")"',
        # stdin closes when the ssh session ends: stop the agent then.
        # (fd 3: an asynchronous list's own stdin is /dev/null in sh)
        "exec 3<&0",
        "{ cat <&3 >/dev/null 2>&1; kill $pid 2>/dev/null; } >/dev/null 2>&1 & w=$!",
        "wait $pid",
    ])


def ssh_argv(host: str, script: str, ssh: tuple[str, ...] = ("ssh",),
             options: tuple[str, ...] = DEFAULT_SSH_OPTIONS) -> list[str]:
    """The local command line that runs `script` on `host` through ssh."""
    if not host or host.startswith("-") or any(c.isspace() for c in host):
        raise ValueError(f"bad ssh host {host!r}")
    return [*ssh, *options, host, "sh -c " + shlex.quote(script)]


class SSHJob(Job):
    """Start one agent per host over ssh (`hosts=[...]`, or meshes plus `hosts`)."""

    kind = "ssh"

    def __init__(self, hosts: list[str], *, meshes: dict[str, int] | None = None,
                 python: str = "python3", port: int = 0, ssh: tuple[str, ...] = ("ssh",),
                 ssh_options: tuple[str, ...] = DEFAULT_SSH_OPTIONS,
                 address_cmd: str = DEFAULT_ADDRESS_CMD, chdir: str | None = None,
                 gateway: bool | str = False, **kw) -> None:
        if not isinstance(hosts, (list, tuple)) or not hosts:
            raise ValueError(f"hosts must be a non-empty list of ssh destinations, got {hosts!r}")
        meshes = meshes if meshes is not None else {"hosts": len(hosts)}
        super().__init__(meshes, **kw)
        if self.hosts != len(hosts):
            raise ValueError(f"meshes need {self.hosts} hosts but {len(hosts)} were given")
        self.host_names = list(hosts)
        self.script = remote_script(python, port, address_cmd, chdir)
        self.gateway, gw_port = gateway_option(gateway)
        self.argvs = {slot: ssh_argv(h, self.script, tuple(ssh), tuple(ssh_options))
                      for slot, h in zip(slots(self.meshes), self.host_names)}
        if self.gateway:  # the first host's agent runs the gateway
            first = slots(self.meshes)[0]
            self.argvs[first] = ssh_argv(self.host_names[0], remote_script(
                python, port, address_cmd, chdir, gw_port), tuple(ssh), tuple(ssh_options))
        self._ssh = (tuple(ssh), tuple(ssh_options))
        self._published: dict[tuple[str, int], str] = {}
        self.tunnel: SSHTunnel | None = None
        self.procs: dict[tuple[str, int], subprocess.Popen] = {}
        self._found: dict[tuple[str, int], str] = {}
        self._errors: dict[tuple[str, int], list[str]] = {}

    def dump(self, path: str | os.PathLike) -> Path:
        """Not supported: the agents live only as long as this process's ssh sessions."""
        raise JobError("an SSHJob's agents end with this process's ssh sessions; it cannot be dumped")

    def _launch(self) -> None:
        assert self.key_file is not None
        key = Path(self.key_file).read_bytes()
        for slot, argv in self.argvs.items():
            p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
            assert p.stdin is not None
            p.stdin.write(b"%d\n" % len(key) + key)
            p.stdin.flush()  # stdin stays open: closing it stops the remote agent
            self.procs[slot] = p
            threading.Thread(target=self._read, args=(slot, p), daemon=True).start()

    def _read(self, slot: tuple[str, int], p: subprocess.Popen) -> None:
        err = self._errors.setdefault(slot, [])
        stdout, stderr = p.stdout, p.stderr
        assert stdout is not None and stderr is not None  # Popen'd with PIPEs (_launch)
        def read_stderr() -> None:
            with stderr:  # closed at EOF: the ssh session ended
                err.extend(line.decode(errors="replace").rstrip() for line in stderr)

        threading.Thread(target=read_stderr, daemon=True).start()
        with stdout:
            for raw in stdout:
                line = raw.decode(errors="replace").strip()
                if line.startswith(ADDRESS_TAG):
                    try:
                        self._published[slot] = line[len(ADDRESS_TAG):]
                        self._found[slot] = parse_address(line[len(ADDRESS_TAG):])
                    except ValueError as e:
                        err.append(str(e))

    def _addresses(self) -> dict[tuple[str, int], str]:
        return dict(self._found)

    def _check(self) -> str:
        for slot, p in self.procs.items():
            if p.poll() is not None and slot not in self._found:
                host = self.host_names[slots(self.meshes).index(slot)]
                raise JobError(f"ssh agent on {host} exited with {p.returncode}: "
                               + "\n".join(self._errors.get(slot, [])[-10:]))
        return f"{len(self._found)}/{len(self.procs)} agents up"

    def _gateway_address(self) -> str | None:
        """`gateway=True`: an `ssh -L` from a free local port to the gateway the first
        agent published (made once); `gateway="tcp://H:P"`: that address (your tunnel)."""
        if not self.gateway or isinstance(self.gateway, str):
            return self.gateway or None
        if self.tunnel is None:
            first = slots(self.meshes)[0]
            try:
                published = json.loads(self._published.get(first, "{}")).get("gateway", "")
            except ValueError:
                published = ""
            if not published:
                raise JobError(f"the agent on {self.host_names[0]} published no gateway address")
            self.tunnel = SSHTunnel(self.host_names[0], published, *self._ssh)
        return self.tunnel.address

    def _cancel(self) -> None:
        if self.tunnel is not None:
            self.tunnel.close()
        for p in self.procs.values():
            if p.poll() is None and p.stdin:
                try:
                    p.stdin.close()  # remote side sees EOF and stops its agent
                except OSError:
                    pass
        deadline = time.monotonic() + 5
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
