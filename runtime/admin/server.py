"""The admin endpoint: a token-guarded JSON request server on 127.0.0.1, inside a controller.

It runs on its own daemon thread (a zmq ROUTER socket), so it answers while the
controller's main thread is busy; handlers run on a small thread pool so a slow request
(a stack dump) does not hold up the others. A request without the right token gets no
reply at all, only a log line.

Under resource exhaustion zmq's I/O thread retries a failed accept (EMFILE) by itself, so
the endpoint serves again once descriptors free up; a peer must finish the ZMTP handshake
within 5 s. zmq offers no per-peer connection limit: a local user can hold idle
connections (each costs a descriptor) but never gets an answer without the token.
"""

from __future__ import annotations

import atexit
import hmac
import json
import logging
import os
import queue
import secrets
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

import zmq

from runtime._base import features as _features
from runtime.admin.codec import encode_snapshot
from runtime.admin.connection import (ConnectionInfo, remove_connection_file,
                                      write_connection_file)

__all__ = ["MAX_REQUEST_BYTES", "Handler", "AdminServer", "serve"]

log = logging.getLogger("runtime.admin")

MAX_REQUEST_BYTES = 1 << 20
Handler = Callable[..., Any]


class AdminServer:
    """Serves named requests (`register(name, handler)`) to clients holding the token."""

    def __init__(self, rt: Any = None, *, directory: Optional[Path] = None,
                 write_file: bool = True) -> None:
        self.rt = rt
        self.token = secrets.token_hex(32)
        self._handlers: dict[str, Handler] = {}
        self._ctx: zmq.Context = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
        self._sock.setsockopt(zmq.HANDSHAKE_IVL, 5000)
        port = self._sock.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self._replies: queue.SimpleQueue[list[bytes]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="admin-handler")
        self._stop = threading.Event()
        self.rejected = 0  # requests dropped for a bad token or a malformed frame
        self.connection_file: Optional[Path] = None
        self._register_defaults()
        if write_file:
            info = ConnectionInfo(address=self.address, token=self.token, pid=os.getpid(),
                                  argv=list(sys.argv), started=time.time())
            self.connection_file = write_connection_file(info, directory)
        self._thread = threading.Thread(target=self._loop, name="monarch-admin", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # -- registry -----------------------------------------------------------------------
    def register(self, name: str, handler: Handler) -> None:
        """Serve request `name`: `handler(**args)` returns a JSON-able value or raises."""
        if not name or not isinstance(name, str):
            raise ValueError(f"request name must be a non-empty string, got {name!r}")
        if not callable(handler):
            raise TypeError(f"handler for {name!r} is not callable: {handler!r}")
        self._handlers[name] = handler

    def requests(self) -> list[str]:
        return sorted(self._handlers)

    def _register_defaults(self) -> None:
        self.register("ping", self._ping)
        self.register("requests", self.requests)
        if self.rt is None:
            return
        self.register("snapshot", self._snapshot)
        self.register("output_tail", self._output_tail)
        self.register("dump_stack", self._dump_stack)
        self.register("py_spy_stack", self._py_spy_stack)
        self.register("stop_mesh", self._stop_mesh)
        self.register("kill_proc", self._kill_proc)

    # -- default handlers ---------------------------------------------------------------
    def _ping(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "argv": list(sys.argv), "time": time.time()}

    def _snapshot(self, internal: bool = False) -> list[dict[str, Any]]:
        """The health snapshot; the runtime's and front-ends' internal meshes on request."""
        return encode_snapshot(self.rt.health.snapshot(internal=bool(internal)))

    def _output_tail(self, proc_id: str, n: int = 200) -> list[str]:
        lines = list(self.rt.output_tail(proc_id))
        return [str(x) for x in lines[-int(n):]]

    def _dump_stack(self, proc_id: str, timeout: float = 10.0) -> str:
        return str(self.rt.dump_stack(proc_id).get(timeout=float(timeout)))

    def _py_spy_stack(self, proc_id: str, native: bool = False, timeout: float = 10.0) -> str:
        """A proc's threads taken by py-spy from its host agent (runtime/stacks.py), as text;
        what went wrong (py-spy missing, ptrace refused) is in the text."""
        return str(_features.call("stacks.of_proc", self.rt, str(proc_id), bool(native),
                                  float(timeout)))

    def _kill_proc(self, proc_id: str) -> bool:
        self.rt.kill_proc(proc_id, reason="killed by the user (monarch-admin)")
        return True

    def _stop_mesh(self, name: str, timeout: float = 30.0) -> int:
        """Stop every live actor mesh or proc mesh called `name`; returns how many."""
        found = [m for m in self.rt.meshes() if getattr(m, "name", None) == name or
                 getattr(m, "health_name", None) == name]
        if not found:
            raise KeyError(f"no live mesh named {name!r}")
        for m in found:
            res = type(m).stop(m)  # not an endpoint called stop
            if hasattr(res, "get"):
                res.get(timeout=float(timeout))
        return len(found)

    # -- serving ------------------------------------------------------------------------
    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                events = dict(poller.poll())  # close() and replies wake it (the pipe)
            except zmq.ZMQError:
                break
            if self._wake_r in events:
                try:
                    os.read(self._wake_r, 4096)
                except OSError:
                    pass
            while True:
                try:
                    frames = self._replies.get_nowait()
                except queue.Empty:
                    break
                try:
                    self._sock.send_multipart(frames, zmq.NOBLOCK)
                except zmq.ZMQError as e:
                    log.warning("admin reply dropped: %s", e)
            if self._sock in events:
                while True:
                    try:
                        frames = self._sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    except zmq.ZMQError:
                        return
                    self._accept(frames)
        try:
            self._sock.close(0)
        except zmq.ZMQError:
            pass

    def _accept(self, frames: list[bytes]) -> None:
        """Check one request; hand it to the pool or drop it with a log line."""
        if len(frames) != 3 or frames[1] != b"":
            self._reject("malformed frames")
            return
        ident, _, body = frames
        try:
            req = json.loads(body)
            if not isinstance(req, dict):
                raise ValueError("not an object")
            token = req.get("token")
            op = req.get("op")
            args = req.get("args", {})
            rid = req.get("id")
        except ValueError:
            self._reject("not JSON")
            return
        if not isinstance(token, str) or not hmac.compare_digest(
                token.encode(), self.token.encode()):
            self._reject("bad token")
            return
        if not isinstance(op, str) or not isinstance(args, dict):
            self._reply(ident, rid, error="request needs 'op' (string) and 'args' (object)")
            return
        self._pool.submit(self._run, ident, rid, op, args)

    def _reject(self, why: str) -> None:
        self.rejected += 1
        if self.rejected <= 10 or self.rejected % 1000 == 0:  # a flood must not flood the log
            log.warning("admin endpoint %s: request dropped (%s); %d dropped so far",
                        self.address, why, self.rejected)

    def _run(self, ident: bytes, rid: Any, op: str, args: dict[str, Any]) -> None:
        handler = self._handlers.get(op)
        if handler is None:
            self._reply(ident, rid, error=f"unknown request {op!r}; known: {self.requests()}")
            return
        try:
            result = handler(**args)
        except Exception as e:  # reported to the (authenticated) client
            self._reply(ident, rid, error=f"{type(e).__name__}: {e}")
            return
        self._reply(ident, rid, result=result)

    def _reply(self, ident: bytes, rid: Any, result: Any = None,
               error: Optional[str] = None) -> None:
        msg = {"id": rid, "ok": error is None}
        if error is None:
            msg["result"] = result
        else:
            msg["error"] = error
        try:
            body = json.dumps(msg, default=str).encode()
        except (TypeError, ValueError) as e:
            body = json.dumps({"id": rid, "ok": False, "error": f"unserializable: {e}"}).encode()
        self._replies.put([ident, b"", body])
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        """Stop serving and remove the connection file (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=2.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.connection_file is not None:
            remove_connection_file(self.connection_file)
        atexit.unregister(self.close)

    def __enter__(self) -> "AdminServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_server_lock = threading.Lock()
_servers: dict[int, AdminServer] = {}


def serve(rt: Any = None, *, directory: Optional[Path] = None) -> AdminServer:
    """Start (once per runtime) the admin endpoint of `rt` (default: `get_runtime()`)."""
    if rt is None:
        from .._core import get_runtime

        rt = get_runtime()
    with _server_lock:
        for key, old in list(_servers.items()):  # runtimes shut down since: stop theirs
            if getattr(old.rt, "closed", False) and old.rt is not rt:
                old.close()
                del _servers[key]
        srv = _servers.get(id(rt))
        if srv is None or srv._stop.is_set():
            srv = AdminServer(rt, directory=directory)
            _servers[id(rt)] = srv
        return srv
