"""A scripted Debugger panel: the Jupyter debug messages JupyterLab's panel sends, sent by a
thread of the kernel to the kernel's own control channel (events read from its IOPub).

For notebooks run headless (nbclient, CI) and for demonstrations: turn the panel on, set a
breakpoint on a cell's line, and let a handler inspect each paused rank (stack, variables,
evaluate, next) before it continues, while a later cell waits on the call:

    panel = HeadlessPanel.start()           # in its own cell: the panel's `initialize`
    panel.attach()                           # in the next cell
    panel.set_breakpoint(Trainer.step, 9)    # the cell that defined Trainer, its line 9
    panel.serve(lambda rank: rank.evaluate("grad"))   # on each stop, then continue
    trainers.step.call(0.1).get()
    print(panel.transcript)
"""

from __future__ import annotations

import linecache
import queue
import threading
import time
from typing import Any, Callable, Optional

__all__ = ["PausedRank", "HeadlessPanel"]


class PausedRank:
    """One stopped remote rank as the panel sees it (its thread and top frame)."""

    def __init__(self, panel: "HeadlessPanel", thread_id: int, name: str) -> None:
        self.panel, self.thread_id, self.name = panel, thread_id, name
        self.frames = panel.request("stackTrace", {"threadId": thread_id})["stackFrames"]

    @property
    def line(self) -> int:
        return int(self.frames[0]["line"])

    def variables(self) -> dict:
        """The top frame's locals: {name: value summary}."""
        scopes = self.panel.request("scopes", {"frameId": self.frames[0]["id"]})["scopes"]
        ref = scopes[0]["variablesReference"]
        vs = self.panel.request("variables", {"variablesReference": ref})["variables"]
        return {v["name"]: v["value"] for v in vs}

    def evaluate(self, expression: str) -> str:
        return self.panel.request("evaluate", {"expression": expression, "context": "repl",
                                               "frameId": self.frames[0]["id"]})["result"]

    def next(self) -> None:
        """Step one line (the panel's `next`), then refresh the stack."""
        mark = len(self.panel.events)
        self.panel.request("next", {"threadId": self.thread_id})
        self.panel.wait_event("stopped", mark)
        self.frames = self.panel.request("stackTrace",
                                         {"threadId": self.thread_id})["stackFrames"]


class HeadlessPanel:
    """A Jupyter debug-protocol client living in the kernel it debugs."""

    def __init__(self, kc: Any) -> None:
        self.kc = kc
        self.seq = 0
        self.events: list[dict] = []
        self.transcript: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read_iopub, daemon=True,
                                        name="headless-panel-iopub")
        self._reader.start()
        self._server: Optional[threading.Thread] = None

    @classmethod
    def start(cls, timeout: float = 30.0) -> "HeadlessPanel":
        """Connect to this kernel and send `initialize`. Call it alone in a cell: the
        kernel's debugger starts debugpy through the shell, which runs it after this cell."""
        from ipykernel.connect import get_connection_file
        from jupyter_client import BlockingKernelClient

        kc = BlockingKernelClient(connection_file=get_connection_file())
        kc.load_connection_file()
        kc.start_channels(shell=False, stdin=False, hb=False)
        panel = cls(kc)
        started = threading.Event()
        threading.Thread(target=lambda: (panel.request("initialize", {
            "clientID": "headless", "adapterID": "python", "pathFormat": "path",
            "linesStartAt1": True, "columnsStartAt1": True}, timeout=120), started.set()),
            daemon=True).start()
        debugger = _kernel_debugger()
        deadline = time.monotonic() + timeout
        while debugger is not None and not debugger.debugpy_initialized and \
                str(debugger.debugpy_client.debugpy_port) in ("-1", "0") and \
                time.monotonic() < deadline:
            time.sleep(0.02)  # until the control thread has asked the shell to listen
        time.sleep(0.2)
        panel.initialized = started
        return panel

    def _read_iopub(self) -> None:
        while not self._stop.is_set():
            try:
                m = self.kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                continue
            except Exception:  # noqa: BLE001 - the kernel is going away
                return
            if m["msg_type"] == "debug_event":
                with self._lock:
                    self.events.append(m["content"])

    def request(self, command: str, arguments: Optional[dict] = None,
                timeout: float = 30.0) -> dict:
        """One debug request; its body (RuntimeError if it did not succeed)."""
        with self._lock:
            self.seq += 1
            seq = self.seq
        msg = self.kc.session.msg("debug_request", {"type": "request", "seq": seq,
                                                    "command": command,
                                                    "arguments": arguments or {}})
        self.kc.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                r = self.kc.control_channel.get_msg(timeout=0.1)
            except queue.Empty:
                continue
            if r["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                c = r["content"]
                if not c.get("success"):
                    raise RuntimeError(f"{command} failed: {c.get('message', c)}")
                return c.get("body") or {}
        raise TimeoutError(f"no reply to {command} in {timeout} s")

    def wait_event(self, event: str, start: int = 0, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                for e in self.events[start:]:
                    if e.get("event") == event:
                        return e
            time.sleep(0.02)
        raise TimeoutError(f"no {event} event in {timeout} s")

    def attach(self, timeout: float = 60.0) -> None:
        """The panel's `attach` and `configurationDone` (after `initialize` was answered)."""
        if not self.initialized.wait(timeout):
            raise TimeoutError("the kernel's debugger did not start")
        self.request("attach", {})
        self.request("configurationDone")

    def set_breakpoint(self, fn: Any, line: int) -> str:
        """Break at `line` of the cell that defined `fn` (a function or endpoint); the
        panel's dumpCell + setBreakpoints. Returns the cell's file."""
        code = getattr(getattr(fn, "__wrapped__", fn), "__code__", None) or \
            getattr(getattr(fn, "fn", None), "__code__", None)
        path = code.co_filename
        source = "".join(linecache.getlines(path))
        for text in (source, source[:-1]) if source else ():  # the cell as Lab dumps it
            if self.request("dumpCell", {"code": text})["sourcePath"] == path:
                break
        self.request("setBreakpoints", {"source": {"path": path},
                                        "breakpoints": [{"line": int(line)}]})
        return path

    def serve(self, handler: Callable[[PausedRank], Any], count: int,
              timeout: float = 120.0) -> None:
        """In the background: for each of the next `count` stops, `handler(rank)`, record
        what it returns in `transcript`, and continue that rank."""
        start = len(self.events)

        def run() -> None:
            nonlocal start
            for _ in range(count):
                e = self.wait_event("stopped", start, timeout)
                tid = e["body"]["threadId"]
                rank = PausedRank(self, tid, e["body"].get("text", str(tid)))
                try:
                    out = handler(rank)
                except Exception as err:  # noqa: BLE001 - shown in the transcript
                    out = f"handler failed: {type(err).__name__}: {err}"
                self.transcript.append(f"{rank.name}: {out}")
                start = len(self.events)  # the next rank's stop comes after this continue
                self.request("continue", {"threadId": tid})

        self._server = threading.Thread(target=run, daemon=True, name="headless-panel")
        self._server.start()

    def join(self, timeout: float = 60.0) -> None:
        if self._server is not None:
            self._server.join(timeout)

    def close(self) -> None:
        """`disconnect` (remote ranks continue, breakpoints cleared), then the client."""
        try:
            self.request("disconnect", {"restart": False, "terminateDebuggee": False})
        finally:
            self._stop.set()
            self.kc.stop_channels()


def _kernel_debugger() -> Any:
    try:
        from IPython import get_ipython

        return getattr(get_ipython().kernel, "debugger", None)
    except Exception:  # noqa: BLE001
        return None
