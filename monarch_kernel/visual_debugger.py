"""JupyterLab's Debugger panel on remote actors: a DAP multiplexer over ipykernel's debugger.

Local notebook code debugs as in plain ipykernel (its in-process debugpy). Paused remote
ranks are extra threads (`remote_ranks.py`); requests about them (by thread, frame or
variables id) go to the actor over the runtime's control plane and are answered by the
paused actor's pdb (`runtime.debugging.dap_engine`). Breakpoints set on a cell's file also
go to every proc (`runtime.debugging.set_line_breakpoints`). While the panel is on, a
remote stop is shown there; while it is off, `breakpoint()` opens the text pdb in the cell.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any, Callable

from ipykernel.debugger import Debugger

from monarch_kernel.remote_ranks import STEP_COMMANDS, RemoteRanks, thread_name

__all__ = ["ROUTED", "MonarchDebugger"]

log = logging.getLogger("monarch_kernel.debugger")

#: requests that may name a remote thread, frame or variables reference
ROUTED = {"stackTrace", "scopes", "variables", "evaluate", "continue", "next", "stepIn",
          "stepOut", "pause", "setVariable", "richInspectVariables"}


def _reply(message: dict, body: Any = None, success: bool = True, error: str = "") -> dict:
    r = {"type": "response", "request_seq": message["seq"], "seq": 0, "success": success,
         "command": message["command"], "body": body if body is not None else {}}
    if error:
        r["message"] = error
    return r


def _with_panel_refs(r: Any, s: Any, items: list) -> list:
    """Scopes or variables of a paused rank with their `variablesReference` mapped to ids the
    panel can send back (remote_ranks.RemoteRanks)."""
    for item in items:
        item["variablesReference"] = r.new_ref(s, item["variablesReference"])
    return items


def _on_control_loop(fn: Callable[[], None]) -> None:
    """Run `fn` on the kernel's control thread (events then leave where replies do)."""
    try:
        from ipykernel.kernelapp import IPKernelApp

        if IPKernelApp.initialized():
            ct = getattr(IPKernelApp.instance().kernel, "control_thread", None)
            if ct is not None and getattr(ct, "io_loop", None) is not None:
                ct.io_loop.add_callback(fn)
                return
    except Exception:  # noqa: BLE001
        log.debug("no control loop", exc_info=True)
    fn()


def _quiet_runtime_threads() -> None:
    """debugpy must neither trace nor suspend the runtime's own threads (heartbeats)."""
    for t in threading.enumerate():
        if t.name.startswith(("monarch-", "actor-")):
            t.pydev_do_not_trace = True  # type: ignore[attr-defined]
            t.is_pydev_daemon_thread = True  # type: ignore[attr-defined]


class MonarchDebugger(Debugger):
    """ipykernel's debugger, plus paused remote ranks as threads."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        emit = self.event_callback
        self.ranks = RemoteRanks(lambda e: _on_control_loop(lambda: emit(e)))
        try:
            from runtime.hooks import add_startup_hook

            add_startup_hook(self._on_runtime_start)
        except Exception:  # noqa: BLE001
            log.debug("no runtime hooks", exc_info=True)

    def _on_runtime_start(self, rt: Any) -> None:
        if self.ranks.enabled:
            _quiet_runtime_threads()
            self.ranks.wire()

    def start(self) -> bool:
        """ipykernel's start, with debugpy told not to follow subprocesses: procs are
        debugged through the runtime, and a proc started while debugpy followed children
        would wait for a debug adapter."""
        if not self.debugpy_initialized:
            from ipykernel.debugger import get_tmp_directory
            from zmq import ROUTING_ID

            os.makedirs(get_tmp_directory(), mode=0o700, exist_ok=True)
            host, port = self.debugpy_client.get_host_port()
            code = ("import debugpy;debugpy.configure(subProcess=False);"
                    f"debugpy.listen(({host!r},{port}))")
            self.session.send(self.shell_socket, "execute_request",
                              {"code": code, "silent": True}, None,
                              self.shell_socket.getsockopt(ROUTING_ID))
            _ident, msg = self.session.recv(self.shell_socket, mode=0)
            self.debugpy_initialized = msg["content"]["status"] == "ok"
        ok = super().start()  # (listens no more: initialized) the cleanup transforms, connect
        _quiet_runtime_threads()
        return ok

    # -- routing ---------------------------------------------------------------------------
    async def process_request(self, message: dict) -> dict:
        cmd = message.get("command", "")
        args = message.get("arguments") or {}
        if cmd == "evaluate" and str(args.get("expression", "")).startswith("%"):
            return _reply(message, self._meta(str(args["expression"])))
        if cmd == "continue" and not self.ranks.is_remote(args.get("threadId")) and \
                args.get("threadId") not in self.stopped_threads and \
                self.ranks.focus is not None:
            # JupyterLab (4.6) forgets the stopped thread before it sends `continue`, so
            # the request names thread 1: it means the rank on screen
            args = dict(args, threadId=self.ranks.focus)
            message = dict(message, arguments=args)
        if cmd in ROUTED and self._is_remote(cmd, args):
            try:
                return await self._remote(message, cmd, args)
            except Exception as e:  # noqa: BLE001 - the panel shows the message
                return _reply(message, success=False, error=f"{type(e).__name__}: {e}")
        reply = await super().process_request(message)
        if cmd in ("initialize", "attach") and self.is_started:
            self.ranks.enable()
        elif cmd == "setBreakpoints":
            self._push_breakpoints(args)
        elif cmd == "setExceptionBreakpoints":
            from runtime.debugging import set_exception_breakpoints

            set_exception_breakpoints(list(args.get("filters") or []))
        elif cmd == "threads" and isinstance(reply, dict):
            body = reply.setdefault("body", {})
            body["threads"] = list(body.get("threads") or []) + self.ranks.threads()
        elif cmd == "debugInfo" and isinstance(reply, dict):
            body = reply.setdefault("body", {})
            body["stoppedThreads"] = self.ranks.stopped_ids() + list(
                body.get("stoppedThreads") or [])
        elif cmd == "disconnect":
            self.ranks.disable()
            self._clear_breakpoints()
        return reply

    def _is_remote(self, cmd: str, args: dict) -> bool:
        r = self.ranks
        if cmd in ("scopes", "evaluate", "richInspectVariables") and "frameId" in args:
            return r.is_remote(args["frameId"])
        if cmd in ("variables", "setVariable"):
            return r.is_remote(args.get("variablesReference"))
        return r.is_remote(args.get("threadId"))

    def _push_breakpoints(self, args: dict) -> None:
        path = (args.get("source") or {}).get("path")
        if not path:
            return
        lines = [int(b["line"]) for b in args.get("breakpoints") or [] if "line" in b]
        from runtime.debugging import set_line_breakpoints

        set_line_breakpoints(path, lines)

    def _clear_breakpoints(self) -> None:
        from runtime.debugging import (line_breakpoints, set_exception_breakpoints,
                                       set_line_breakpoints)

        for path in list(line_breakpoints()):
            set_line_breakpoints(path, [])
        set_exception_breakpoints([])

    async def _remote(self, message: dict, cmd: str, args: dict) -> dict:
        loop = asyncio.get_running_loop()
        body = await loop.run_in_executor(None, self._remote_blocking, cmd, args)
        return _reply(message, body)

    def _remote_blocking(self, cmd: str, args: dict) -> dict:
        r = self.ranks
        dap = r.client()
        if dap is None:
            raise RuntimeError("no runtime runs in this kernel")
        if cmd == "stackTrace":
            s = r.session_of(args["threadId"])
            st = dap.request(s, "stackTrace")
            frames = []
            for f in st["frames"]:
                name = f["name"] if f["index"] != st["frames"][0]["index"] else \
                    f"{f['name']} · {thread_name(s)}"
                frames.append({"id": r.new_frame(s, f["index"]), "name": name,
                               "line": f["line"], "column": 1,
                               "source": {"path": f["file"],
                                          "name": os.path.basename(f["file"])}})
            return {"stackFrames": frames, "totalFrames": len(frames)}
        if cmd == "scopes":
            s, index = r.frame_of(args["frameId"])
            scopes = dap.request(s, "scopes", {"frame": index})["scopes"]
            return {"scopes": _with_panel_refs(r, s, scopes)}
        if cmd == "variables":
            s, ref = r.ref_of(args["variablesReference"])
            vs = dap.request(s, "variables", {"ref": ref})["variables"]
            return {"variables": _with_panel_refs(r, s, vs)}
        if cmd == "evaluate":
            s, index = r.frame_of(args["frameId"])
            ev = dap.request(s, "evaluate", {"frame": index,
                                             "expression": args.get("expression", "")})
            ev["variablesReference"] = r.new_ref(s, ev.get("variablesReference", 0))
            return ev
        if cmd == "richInspectVariables":  # the variable's "view" button: its summary
            s, index = r.frame_of(args["frameId"])
            ev = dap.request(s, "evaluate", {"frame": index,
                                             "expression": args.get("variableName", "")})
            return {"data": {"text/plain": ev["result"]}, "metadata": {}}
        s = r.session_of(args["threadId"])
        if cmd == "continue":
            r.reg.release(s)
            return {"allThreadsContinued": False}
        if cmd in STEP_COMMANDS:
            r.stepping.add(s.sid)
            if cmd == "stepOut":
                r.step_out.add(s.sid)
            r.reg.send_line(s, STEP_COMMANDS[cmd])
            return {}
        raise RuntimeError(f"{cmd} is not supported for a remote rank")

    def _meta(self, line: str) -> dict:
        """`%ranks` lists paused ranks; `%continue` lets all of them continue."""
        word = line[1:].split()[0] if line[1:].split() else ""
        r = self.ranks
        if word == "ranks":
            text = "\n".join(f"{t['name']} (thread {t['id']})" for t in r.threads()) or \
                "no paused ranks"
        elif word == "continue":
            reg = r.wire()
            n = reg.continue_all() if reg is not None else 0
            text = f"{n} paused rank{'s' if n != 1 else ''} continue"
        else:
            text = "debugger commands: %ranks, %continue (all paused ranks)"
        return {"result": text, "variablesReference": 0}
