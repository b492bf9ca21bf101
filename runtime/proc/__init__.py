"""The proc: a process that hosts actors, forked by its host's zygote (`main`). Each actor
has its own thread, mailbox and asyncio loop and handles one message at a time
(`_actor_instance`); the I/O thread keeps heartbeats going meanwhile and dispatches actor
traffic (`_server`); start-up options (`_startup`) apply before the proc says
hello, and a stand-in for interpreter finalization (`_exit`) runs before it exits.

Layer 6 (process roles): imports `_server` and the parts below it; the debugger (above)
is installed through `runtime._base.features`.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys

from .. import logs, telemetry
from .._base import features as _features
from . import _reload
from ._actor_instance import (ActorInstance, current_actor, set_call_hook,  # noqa: F401
                              set_error_hook)
from ._exit import graceful_exit, user_modules  # noqa: F401 - user_modules: public here
from ._server import ProcServer, add_heartbeat_field, dump_stacks  # noqa: F401
from ._startup import apply_proc_bind, run_bootstrap
from ..config import config
from ..transport.framing import Header, Kind

__all__ = [
    "ActorInstance", "current_actor", "set_call_hook", "set_error_hook", "graceful_exit",
    "user_modules", "ProcServer", "add_heartbeat_field", "dump_stacks", "apply_proc_bind",
    "run_bootstrap", "main",
]


def main(cfg: dict) -> None:
    """Entry point of a forked proc (called by the zygote in the child)."""
    from .._core import Runtime, set_runtime
    from .._core.roles import ProcRole
    from ..transport import auth

    sys.stdout = logs.TaggedWriter(1, "<stdout>")
    sys.stderr = logs.TaggedWriter(2, "<stderr>")
    faulthandler.enable(file=sys.stderr, all_threads=True)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, force=True,
                        format="%(levelname)s %(name)s: %(message)s")
    apply_proc_bind()
    if cfg.get("workspace"):  # the host's synced workspace, first on sys.path
        _reload.startup(cfg["workspace"])
    run_bootstrap(os.environ.pop("MONARCH_PROC_BOOTSTRAP", ""))
    keys = None
    if cfg.get("key_file"):
        keys = auth.read_key_file(cfg["key_file"])
    server = ProcServer(None, cfg)
    role = ProcRole(server, cfg.get("agent", ""), cfg.get("host_id", ""))
    rt = Runtime(proc_id=cfg["proc_id"], token=bytes.fromhex(cfg["token"]), rundir=cfg["rundir"],
                 owner_address=cfg["owner"], keys=keys, role=role, start=False)
    if cfg.get("agent", "").startswith("ipc://"):  # other hosts: through the agent
        rt.loop.relay = cfg["agent"]
    server.rt = rt
    set_runtime(rt)
    _features.call("debugging.install_in_proc", rt)  # debugging is above this layer
    telemetry.start_in_proc(cfg["proc_id"], cfg.get("mesh", ""), cfg.get("rank", 0))
    if cfg.get("agent_tcp") and rt.loop.relay and keys is not None:
        rt.messenger.reached_through(keys, f"{cfg['agent_tcp']}#{cfg['proc_id']}")
    elif cfg.get("listen_ip") and keys is not None:
        rt.enable_tcp(cfg["listen_ip"])
    rt.start()
    rt.send(cfg["owner"], Header(Kind.HELLO, extra={"pid": os.getpid(), "host": rt.host,
                                                    "address": rt.address,
                                                    "tcp": rt.tcp_address}))
    signal.signal(signal.SIGTERM, lambda *_: server.stopped.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    server.stopped.wait()  # SIGTERM's handler or a STOP_PROC sets it
    graceful_exit(server, config.stop_timeout / 2)
    telemetry.shutdown(timeout=config.stop_timeout / 2)  # os._exit skips OpenTelemetry's atexit
    try:
        rt.loop.stop(timeout=1.0)
        rdma_server = sys.modules.get("runtime.rdma.server")
        if rdma_server is not None and rdma_server.current_server() is not None:
            rdma_server.current_server().close()  # its directory (os._exit skips atexit)
    finally:
        sys.stdout.flush()
        os._exit(0)
