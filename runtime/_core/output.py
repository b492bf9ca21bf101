"""Proc output arriving at the controller: kept in the proc's record, streamed to the output
sink line by line or aggregated over a window (`ProcMesh.logging_option`). I/O thread only;
the sink (a notebook, a terminal) is called by a writer thread (`logs.OutputWriter`), so a
terminal that stops reading never stops the I/O thread."""
from __future__ import annotations

import time
from typing import Any, Callable, Optional, Protocol

from .. import logs
from ..logs.aggregation import Aggregator
from ..transport.framing import Header
from ..transport.loop import IOLoop
from .records import ProcRecord
from .state import State

__all__ = ["OutputHost", "ProcOutput"]


class OutputHost(Protocol):
    """What ProcOutput uses of its process's Runtime: the procs' records, the I/O loop (a
    timer), and where the lines go (`output_sink`, which a front-end sets)."""

    @property
    def state(self) -> State: ...

    @property
    def loop(self) -> IOLoop: ...

    @property
    def output_sink(self) -> Optional[Callable[[str, str, str], None]]: ...


class ProcOutput:
    """The LOG handler: `on_log` records and forwards; `flush` empties the aggregator."""

    def __init__(self, rt: OutputHost) -> None:
        self.rt = rt
        self.aggregator = Aggregator()
        self.writer = logs.OutputWriter()
        self.announced: set[str] = set()  # logs directories of agents' procs, named once

    def _said_before(self, text: str) -> bool:
        """An agent's "proc output files: HOST:DIR/" line whose logs directory (DIR's
        parent: a job's agents write side by side) another agent named already: one line
        per job, not one per host agent."""
        head, _, where = text.partition(": ")
        if head != "proc output files":
            return False
        key = where.strip().rstrip("/").rsplit("/", 1)[0].split(":", 1)[-1]
        if key in self.announced:
            return True
        self.announced.add(key)
        return False

    def on_log(self, h: Header, body: Any, buffers: list) -> None:
        e = h.extra or {}
        proc_id = e.get("proc", "")
        stream = e.get("stream", "stdout")
        label = e.get("label", "")
        text = bytes(body).decode("utf-8", "replace")
        rec = self.rt.state.proc(proc_id)
        if rec is None:
            if not proc_id and label == "monarch" and self._said_before(text):
                return
            self.writer.put(self.rt.output_sink, label or proc_id, stream, text)
            return
        label = label or rec.mesh
        ends_open_line = self._ends_open_line(rec, stream, text)
        lines = logs.strip_marks(text).splitlines()[ends_open_line:]
        rec.output.extend(f"[{stream}] {ln}" for ln in lines)
        if stream == "stderr":
            rec.stderr_tail.extend(lines)
        if not rec.log_stream:
            return  # kept in the proc's log only (logging_option(stream_to_client=False))
        if rec.log_window:
            self._aggregate(label, stream, rec.rank, text.splitlines()[ends_open_line:],
                            rec.log_window)
            return
        prefix = f"{label} {rec.rank}"
        if rec.agent is not None and rec.agent.remote:
            prefix = f"{label} {rec.rank}@{rec.host}"
        self.writer.put(self.rt.output_sink, prefix, stream, text)

    @staticmethod
    def _ends_open_line(rec: ProcRecord, stream: str, text: str) -> bool:
        """Whether `text` starts with the newline of a line whose start was taken whole
        already (its agent flushes a partial line after 0.1 s, and the rest of a `print`,
        often just its newline, may come later): that newline makes no empty line."""
        ends = stream in rec.open_streams and text.startswith(("\n", "\r"))
        if text.endswith(("\n", "\r")):
            rec.open_streams.discard(stream)
        else:
            rec.open_streams.add(stream)
        return ends

    def _aggregate(self, label: str, stream: str, rank: int, lines: list[str],
                   window: float) -> None:
        now = time.monotonic()
        for line in lines:
            if line.startswith(logs.CONTROL_MARK):
                # a front-end's mark (e.g. the end of a notebook cell): what came before it
                # is delivered before it
                self.flush(label)
                self.writer.put(self.rt.output_sink, f"{label} {rank}", stream, line + "\n")
            elif self.aggregator.add(label, stream, rank, line, now, window):
                self.rt.loop.call_later(window, self._flush_due)

    def _flush_due(self) -> None:
        now = time.monotonic() + 1e-3
        for key in self.aggregator.due(now):
            self._emit(self.aggregator.flush(key))

    def flush(self, label: str | None = None) -> None:
        """Deliver every aggregated line now (of one mesh label, or all)."""
        for key in self.aggregator.keys(label):
            self._emit(self.aggregator.flush(key))

    def _emit(self, items: list[tuple[str, str, str]]) -> None:
        for prefix, stream, text in items:
            self.writer.put(self.rt.output_sink, prefix, stream, text)
