"""A headless Jupyter Debugger panel: debug requests on the control channel, debug events
and cell output from IOPub (what JupyterLab's debugger sends and reads)."""

from __future__ import annotations

import queue
import time
from typing import Any, Callable, Optional


class DapDriver:
    """Sends debug_request messages to a kernel client and collects what comes back."""

    def __init__(self, kc: Any) -> None:
        self.kc = kc
        self.seq = 0
        self.connected = False  # between an answered initialize/attach and a disconnect
        self.events: list[dict] = []  # debug events, in arrival order
        self.stream = ""  # stdout and stderr of every cell
        self.replies: dict[str, dict] = {}  # execute replies by msg_id
        self.results: dict[str, list] = {}  # execute results (text/plain) by msg_id

    def _pump(self, timeout: float = 0.02) -> None:
        kc = self.kc
        while True:
            try:
                m = kc.get_iopub_msg(timeout=timeout)
            except queue.Empty:
                break
            t, c = m["msg_type"], m["content"]
            if t == "debug_event":
                self.events.append(c)
            elif t == "stream":
                self.stream += c["text"]
            elif t == "execute_result":
                pid = m["parent_header"].get("msg_id", "")
                self.results.setdefault(pid, []).append(c["data"].get("text/plain", ""))
            timeout = 0.0
        while True:
            try:
                r = kc.get_shell_msg(timeout=0.0)
            except queue.Empty:
                break
            self.replies[r["parent_header"].get("msg_id", "")] = r

    def request(self, command: str, arguments: Optional[dict] = None,
                timeout: float = 30.0) -> dict:
        """One debug request; returns the DAP response (its `success` not checked)."""
        self.seq += 1
        content = {"type": "request", "seq": self.seq, "command": command,
                   "arguments": arguments or {}}
        msg = self.kc.session.msg("debug_request", content)
        self.kc.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._pump(0.0)
            try:
                r = self.kc.control_channel.get_msg(timeout=0.05)
            except queue.Empty:
                continue
            if r["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                if command in ("initialize", "attach", "disconnect"):
                    self.connected = command != "disconnect"
                return r["content"]
        raise TimeoutError(f"no reply to debug request {command} in {timeout} s")

    def ok(self, command: str, arguments: Optional[dict] = None, timeout: float = 30.0) -> dict:
        r = self.request(command, arguments, timeout)
        assert r.get("success"), (command, r)
        return r.get("body") or {}

    def wait_event(self, pred: Callable[[dict], bool], timeout: float = 30.0,
                   start: int = 0) -> dict:
        """The first debug event from index `start` on that satisfies `pred`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._pump()
            for e in self.events[start:]:
                if pred(e):
                    return e
        raise TimeoutError(f"no such debug event in {timeout} s; have {self.events[start:]}")

    def execute(self, code: str) -> str:
        """Start a cell (does not wait); returns its msg_id."""
        return self.kc.execute(code, allow_stdin=False)

    def wait_reply(self, msg_id: str, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._pump()
            if msg_id in self.replies:
                return self.replies[msg_id]["content"]
        raise TimeoutError(f"cell did not finish in {timeout} s; output:\n{self.stream}")

    def run(self, code: str, timeout: float = 60.0) -> dict:
        return self.wait_reply(self.execute(code), timeout)

    def stopped(self, start: int = 0, timeout: float = 30.0) -> dict:
        return self.wait_event(lambda e: e.get("event") == "stopped", timeout, start)
