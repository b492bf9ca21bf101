"""The host agent: starts, watches and reaps the procs of one host.

`python -m runtime.host --owner ADDR --token HEX --rundir DIR` is started by a controller
for its local host; `python -m runtime.host --listen tcp://ADDR:PORT --key-file F` serves a
host for controllers that attach over the network (CurveZMQ). `run_worker_loop_forever(address,
ca="trust_all_connections")` (Monarch's name, in `worker`) runs the latter in-process with
this user's key file.

At start the agent forks a single-threaded *zygote* (`zygote`) with the runtime already
imported; procs are forked from it, which makes spawning fast. The agent (`agent`) holds the
read ends of every proc's stdout/stderr pipes (`output`): it forwards output to the proc's
owner and keeps the last lines of stderr for failure reports, and it reports every exit
with its code or signal.

Layer 6 (process roles, above `proc`): imports proc, _core, transport and the basics.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Optional

from .._base import process as _process
from ..config import TOKEN_ENV

__all__ = ["main", "listening_line"]


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of `python -m runtime.host`."""
    p = argparse.ArgumentParser(prog="python -m runtime.host",
                                description="Serve one host: spawn and watch procs.")
    p.add_argument("--owner", help="address of the controller that owns this agent")
    p.add_argument("--token", help="session token (hex); default MONARCH_TOKEN or random")
    p.add_argument("--rundir", help="private directory for ipc sockets")
    p.add_argument("--agent-id")
    p.add_argument("--listen", help="also listen on tcp://ADDR:PORT, loopback too, with "
                                    "CurveZMQ: needs --key-file or MONARCH_KEY_FILE (make one "
                                    "with python -m runtime.transport.auth keygen PATH); "
                                    "prints where it listens")
    p.add_argument("--key-file", help="CurveZMQ key file (mode 600); default MONARCH_KEY_FILE")
    p.add_argument("--advertise", help="the address controllers dial, when it differs from "
                                       "--listen (e.g. listening on 0.0.0.0)")
    p.add_argument("--exit-on-shutdown", action="store_true",
                   help="exit when the attached controller shuts the host mesh down "
                        "(run_worker_loop_forever); by default only its procs end")
    p.add_argument("--address-file", help="write the bound address here (JSON)")
    p.add_argument("--gateway", help="also run a gateway at tcp://ADDR:PORT: one controller "
                                     "outside the cluster reaches the job through it "
                                     "(CurveZMQ, the cluster key; needs --listen)")
    p.add_argument("--log-dir", help="where this agent's directory of proc log files goes "
                                     "(default: the log_dir setting, else <runtime root>/logs)")
    p.add_argument("--keep", type=float, default=0.0,
                   help="seconds a listening agent keeps its procs after their controller "
                        "goes away (the default lease of procs spawned without keep=); with "
                        "it the agent also ends itself once the lease passes with no "
                        "controller attached and no proc left")
    p.add_argument("--job-dir", help="with --keep: the job's directory, removed by the last "
                                     "of its agents to end (their address files in "
                                     "DIR/addrs)")
    p.add_argument("--parent-pid", type=int, default=0,
                   help="exit when this parent process dies")
    args = p.parse_args(argv)
    if not args.token:
        args.token = os.environ.pop(TOKEN_ENV, "")  # a secret: procs do not inherit it
    from ..transport import auth

    # a key file this user does not own privately is refused (PermissionError) before
    # anything is swept, made, forked or bound
    try:
        if args.key_file:
            auth.check_key_file(args.key_file, "key file (--key-file)")
        else:
            auth.keys_from_env()
    except (OSError, ValueError) as e:  # refused or unreadable: one line, not a traceback
        print(f"runtime.host: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 2
    if args.parent_pid:
        _process.die_with_parent(args.parent_pid)
    _process.set_process_name("monarch-agent")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s agent: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from .agent import Agent

    agent = Agent(args)
    signal.signal(signal.SIGTERM, lambda *_: agent.loop.call_soon(agent.shutdown, "SIGTERM"))
    if args.listen:
        print(listening_line(agent.tcp_address, agent.key_file,
                             agent.gateway.address if agent.gateway else ""), flush=True)
    agent.run()
    return 0


def listening_line(address: str, key_file: str, gateway: str = "") -> str:
    """The one line a listening agent prints: where controllers reach it, with which key,
    and how to stop it (Ctrl-C is ignored: a job's agents outlive a terminal's)."""
    import socket

    gw = f"; gateway at {gateway}" if gateway else ""
    key = f" with the key {key_file}" if key_file else " with the key of MONARCH_KEY_FILE"
    return (f"monarch host agent on {socket.gethostname()} (pid {os.getpid()}) listening on "
            f"{address}{key}{gw}; attach_to_workers([{address!r}], key_file=...) reaches "
            f"it; stop it with kill {os.getpid()}")

