"""Client of a controller's admin endpoint (used by `monarch-admin` and tests)."""

from __future__ import annotations

import itertools
import json
import os
import threading
from typing import Any, Optional

import zmq

from runtime.admin.codec import decode_snapshot
from runtime.admin.connection import ConnectionInfo, read_connection_file
from runtime.supervision.health import MeshHealth

__all__ = ["AdminError", "AdminClient"]


class AdminError(RuntimeError):
    """The endpoint did not answer in time, or the request failed there."""


class AdminClient:
    """Sends JSON requests with the token; one request at a time (thread-safe)."""

    def __init__(self, address: str, token: str, *, timeout: float = 10.0,
                 pid: Optional[int] = None) -> None:
        if not address.startswith("tcp://127.0.0.1:"):
            raise ValueError(f"admin endpoints listen on 127.0.0.1 only, got {address!r}")
        self.address = address
        self.pid = pid
        self.timeout = float(timeout)
        self._token = token
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._ctx: zmq.Context = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(address)

    @classmethod
    def from_connection_file(cls, path: str | os.PathLike[str], *,
                             timeout: float = 10.0) -> "AdminClient":
        info: ConnectionInfo = read_connection_file(path)
        return cls(info.address, info.token, timeout=timeout, pid=info.pid)

    def call(self, op: str, args: Optional[dict[str, Any]] = None, *,
             wait: Optional[float] = None) -> Any:
        """Run request `op` with `args` there; returns its result or raises AdminError."""
        if args is not None and not isinstance(args, dict):
            raise TypeError(f"args must be a dict, got {type(args).__name__}")
        wait = self.timeout if wait is None else float(wait)
        with self._lock:
            rid = next(self._ids)
            body = json.dumps({"token": self._token, "id": rid, "op": op, "args": args or {}})
            self._sock.send_multipart([b"", body.encode()])
            while True:
                if not self._sock.poll(int(wait * 1000)):
                    raise AdminError(
                        f"no reply to {op!r} from {self.address} within {wait:.1f}s "
                        "(controller gone, busy, or token rejected)")
                frames = self._sock.recv_multipart()
                try:
                    msg = json.loads(frames[-1])
                except ValueError:
                    continue
                if not isinstance(msg, dict) or msg.get("id") != rid:
                    continue  # a late reply to an earlier request that timed out
                if not msg.get("ok"):
                    raise AdminError(f"{op} failed: {msg.get('error')}")
                return msg.get("result")

    # -- typed helpers --------------------------------------------------------------------
    def ping(self) -> dict[str, Any]:
        return self.call("ping")

    def snapshot(self, internal: bool = False) -> list[MeshHealth]:
        """The controller's health snapshot; its internal meshes too with `internal=True`."""
        return decode_snapshot(self.call("snapshot", {"internal": True} if internal else None))

    def output_tail(self, proc_id: str, n: int = 200) -> list[str]:
        return list(self.call("output_tail", {"proc_id": proc_id, "n": n}))

    def dump_stack(self, proc_id: str, timeout: float = 10.0) -> str:
        return str(self.call("dump_stack", {"proc_id": proc_id, "timeout": timeout},
                             wait=timeout + 5.0))

    def py_spy_stack(self, proc_id: str, native: bool = False, timeout: float = 10.0) -> str:
        """Every thread of a proc taken from outside by py-spy (its host agent runs it):
        the GIL holder, native frames if `native`; the reason when it cannot."""
        return str(self.call("py_spy_stack", {"proc_id": proc_id, "native": native,
                                              "timeout": timeout}, wait=timeout + 10.0))

    def stop_mesh(self, name: str) -> int:
        return int(self.call("stop_mesh", {"name": name}, wait=max(self.timeout, 35.0)))

    def kill_proc(self, proc_id: str) -> bool:
        return bool(self.call("kill_proc", {"proc_id": proc_id}))

    def close(self) -> None:
        self._sock.close(0)

    def __enter__(self) -> "AdminClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
