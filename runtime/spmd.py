"""Monarch's `monarch.spmd` counterpart: run an unchanged torch.distributed script (what
torchrun would start) in every proc of a mesh, with torchrun's environment variables.

Layer 8 (a feature): may import every layer below; nothing below imports it.
"""

from __future__ import annotations

import logging
import math
import os
import runpy
import socket
import subprocess
import sys
from typing import Any, Mapping, Optional

from .actor import Actor, current_rank, current_size, endpoint
from .gpus import GPU_DIMS, PARENT_VISIBLE, VISIBLE

__all__ = ["elastic_env", "SPMDActor", "setup_torch_elastic_env", "setup_torch_elastic_env_async"]

log = logging.getLogger("runtime.spmd")


def elastic_env(coords: Mapping[str, int], sizes: Mapping[str, int], master_addr: str,
                master_port: int) -> dict[str, str]:
    """torchrun's variables for the proc at `coords` of a mesh of `sizes` (pure).

    The local dimension is the GPU one ("gpus"/"gpu") if present, else the last; RANK is
    the row-major rank, GROUP_RANK the rank among the other dimensions."""
    labels = list(sizes)
    local = next((d for d in GPU_DIMS if d in sizes), labels[-1] if labels else None)
    rank = 0
    for d in labels:
        rank = rank * sizes[d] + coords[d]
    lws = sizes[local] if local is not None else 1
    group = 0
    for d in labels:
        if d != local:
            group = group * sizes[d] + coords[d]
    world = math.prod(sizes.values())
    return {
        "MASTER_ADDR": str(master_addr), "MASTER_PORT": str(int(master_port)),
        "RANK": str(rank), "LOCAL_RANK": str(coords[local] if local is not None else 0),
        "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(lws),
        "GROUP_RANK": str(group), "GROUP_WORLD_SIZE": str(world // lws),
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world), "ROLE_NAME": "rank",
    }


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _host_address(use_ipaddr: Any) -> str:
    """This host's name (None) or its IPv4/IPv6 address (Monarch's AddrType or a name)."""
    host = socket.gethostname()
    if use_ipaddr is None:
        return host
    kind = str(getattr(use_ipaddr, "name", use_ipaddr)).lower()
    if kind in ("loopback", "localhost"):
        return "127.0.0.1"
    family = {"ipv4": socket.AF_INET, "ipv6": socket.AF_INET6}.get(kind)
    if family is None:
        raise ValueError(f"use_ipaddr must be None, 'ipv4', 'ipv6' or 'loopback', got "
                         f"{use_ipaddr!r}")
    addr = socket.getaddrinfo(host, None, family, socket.SOCK_STREAM)[0][4][0]
    assert isinstance(addr, str)  # an AF_INET/AF_INET6 sockaddr starts with the host string
    return addr


class SPMDActor(Actor):
    """Sets torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
    GROUP_*, ROLE_*, MASTER_ADDR, MASTER_PORT) from this actor's point and runs a script."""

    def __init__(self) -> None:
        point = current_rank()
        self._coords = {d: point[d] for d in point.extent.labels}
        self._sizes = dict(current_size())

    @endpoint
    def get_host_port(self, use_ipaddr: Any = None) -> tuple[str, int]:
        """(this host's name or address, a port free now) for MASTER_ADDR/MASTER_PORT."""
        return _host_address(use_ipaddr), _free_port()

    def _setup_env(self, master_addr: str, master_port: int) -> None:
        os.environ.update(elastic_env(self._coords, self._sizes, master_addr, master_port))
        self._torchrun_device_view()

    def _torchrun_device_view(self) -> None:
        """A proc the runtime gave one GPU sees the host's GPUs again, as under torchrun, so
        `torch.cuda.set_device(LOCAL_RANK)` selects that same GPU (before CUDA starts only)."""
        host_list = os.environ.get(PARENT_VISIBLE)
        if host_list is None or os.environ.get(VISIBLE) is None:
            return
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            log.warning("SPMDActor: CUDA is already initialised in this proc; it keeps seeing "
                        "only CUDA_VISIBLE_DEVICES=%s (use cuda:0, not LOCAL_RANK)",
                        os.environ.get(VISIBLE))
            return
        os.environ[VISIBLE] = host_list

    @endpoint
    def setup_env(self, master_addr: str, master_port: int) -> None:
        """Set torchrun's environment variables in this proc (for code run afterwards)."""
        self._setup_env(master_addr, master_port)

    @endpoint
    def main(self, master_addr: str, master_port: int, script_args: list) -> bool:
        """Set the environment, then run `[script, *args]` or `["-m", module, *args]` as
        `__main__` in this proc; True when it returns (its exception fails the call)."""
        if not script_args or (script_args[0] == "-m" and len(script_args) < 2):
            raise ValueError("main() needs [script, *args] or ['-m', module, *args]")
        self._setup_env(master_addr, master_port)
        saved = sys.argv
        try:
            if script_args[0] == "-m":
                sys.argv = [script_args[1], *map(str, script_args[2:])]
                runpy.run_module(script_args[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = [str(a) for a in script_args]
                runpy.run_path(str(script_args[0]), run_name="__main__")
        except SystemExit as e:  # a script ending with sys.exit(0) succeeded
            if e.code not in (None, 0):
                raise RuntimeError(f"{script_args[0]} exited with {e.code!r}") from None
        finally:
            sys.argv = saved
        return True

    @endpoint
    def run_command(self, entrypoint: str, args: list, env: dict) -> bool:
        """Run `entrypoint *args` with `env` added (e.g. a whole torchrun command line)."""
        subprocess.run([entrypoint, *args], check=True, env={**os.environ, **env})
        return True


def setup_torch_elastic_env(proc_mesh: Any, master_addr: Optional[str] = None,
                            master_port: Optional[int] = None,
                            use_ipaddr: Optional[Any] = None) -> Any:
    """Spawn SPMDActor on `proc_mesh` and set torchrun's variables in every proc (the
    first proc's host and a free port unless given); returns the actor mesh."""
    actors = proc_mesh.spawn_internal("spmd", SPMDActor)
    if master_addr is None or master_port is None:
        first = actors.slice(**dict.fromkeys(proc_mesh.shape.labels, 0))
        addr, port = first.get_host_port.call_one(use_ipaddr).get()
        master_addr = master_addr if master_addr is not None else addr
        master_port = master_port if master_port is not None else port
    actors.setup_env.call(master_addr, master_port).get()
    return actors


async def setup_torch_elastic_env_async(proc_mesh: Any, master_addr: Optional[str] = None,
                                        master_port: Optional[int] = None,
                                        use_ipaddr: Optional[Any] = None) -> Any:
    """`setup_torch_elastic_env` for async code: awaits the calls instead of blocking."""
    actors = proc_mesh.spawn_internal("spmd", SPMDActor)
    if master_addr is None or master_port is None:
        first = actors.slice(**dict.fromkeys(proc_mesh.shape.labels, 0))
        addr, port = await first.get_host_port.call_one(use_ipaddr)
        master_addr = master_addr if master_addr is not None else addr
        master_port = master_port if master_port is not None else port
    await actors.setup_env.call(master_addr, master_port)
    return actors
