"""Route remote output into the notebook cell that is running, with a `[mesh rank]` prefix.

`LinePrefixer` is the pure part: it turns chunks from many ranks into prefixed lines that do
not interleave mid-line. `OutputRouter` is the runtime's output sink in a kernel: it is
called on the runtime's I/O thread and writes to the kernel's stdout/stderr streams with
the running cell's parent header set for that thread (ipykernel 7 keys output by a
per-thread parent; without it, output from other threads can land in the wrong cell).
"""

from __future__ import annotations

import re
import sys
import threading
import time
from typing import Any, Callable, Optional

__all__ = ["LinePrefixer", "Writer", "OutputRouter", "kernel_writer"]

_LINE_END = re.compile(r"\r\n|\n|\r(?!\n)")
#: The end-of-cell mark a %%mesh cell runner writes (see cell_runner.END_MARK).
_MARK = re.compile(r"\x1b\]777;mk-end:([0-9A-Za-z_-]+)\x07(\r?\n)?")
_MARK_START = "\x1b]777;mk-end:"


class LinePrefixer:
    """Prefix every line of every label's output; hold partial lines until they end.

    Not thread-safe by itself; `OutputRouter` serializes calls."""

    def __init__(self, fmt: str = "[{label}] ") -> None:
        self.fmt = fmt
        self._pending: dict[tuple[str, str], str] = {}
        self._open: dict[str, Optional[str]] = {}  # stream -> label whose line is open

    def _prefix(self, label: str) -> str:
        return self.fmt.format(label=label)

    def _emit(self, label: str, stream: str, segment: str, complete: bool) -> str:
        open_label = self._open.get(stream)
        if open_label == label:
            out = segment  # continues this label's open line
        elif open_label is not None:
            out = "\n" + self._prefix(label) + segment  # close the other label's line
        else:
            out = self._prefix(label) + segment
        self._open[stream] = None if complete else label
        return out

    def feed(self, label: str, stream: str, text: str) -> str:
        """Return the text to write to `stream` now (maybe empty) for a new chunk."""
        if not text:
            return ""
        text = self._pending.pop((label, stream), "") + text
        out: list[str] = []
        pos = 0
        for m in _LINE_END.finditer(text):
            out.append(self._emit(label, stream, text[pos:m.end()], complete=True))
            pos = m.end()
        if pos < len(text):
            self._pending[(label, stream)] = text[pos:]
        return "".join(out)

    def has_pending(self) -> bool:
        return bool(self._pending)

    def flush(self) -> list[tuple[str, str]]:
        """Write out every held partial line (its line stays open): [(stream, text)]."""
        out: list[tuple[str, str]] = []
        pending, self._pending = self._pending, {}
        for (label, stream), text in pending.items():
            out.append((stream, self._emit(label, stream, text, complete=False)))
        return out

    def close_lines(self) -> list[tuple[str, str]]:
        """Flush partials and end any open line, so the next cell starts clean."""
        out = self.flush()
        for stream, label in list(self._open.items()):
            if label is not None:
                out.append((stream, "\n"))
                self._open[stream] = None
        return out


Writer = Callable[[str, str, Optional[dict]], None]


class OutputRouter:
    """The runtime's output sink for a notebook: prefixed, live, into the right cell.

    `target` is the parent header of the cell whose output this is: the running cell, or
    after it ended the last one that ran (late output still lands in that cell)."""

    def __init__(self, write: Writer, partial_delay: float = 0.2, fmt: str = "[{label}] ",
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._write = write
        #: what `settle` measures its durations with, and waits with (tests pass theirs)
        self.clock, self.sleep = clock, sleep
        self._lock = threading.Lock()
        self._marked = threading.Condition(self._lock)
        self._marks: dict[str, int] = {}
        self._prefixer = LinePrefixer(fmt)
        self._delay = partial_delay
        self._timer: Optional[threading.Timer] = None
        self.target: Optional[dict] = None
        self.chunks = 0
        self.last_output = 0.0
        self._stderr_labels: set[str] = set()  # who wrote to stderr in the target cell

    def set_target(self, parent: Optional[dict]) -> None:
        """Send what follows to the cell with this parent header (flushing what was held)."""
        with self._lock:
            if parent is not self.target:
                self._write_all(self._prefixer.close_lines())
                self._stderr_labels = set()
            self.target = parent

    def __call__(self, label: str, stream: str, text: str) -> None:
        """The sink: called on the runtime's I/O thread for each chunk of remote output."""
        stream = "stderr" if stream == "stderr" else "stdout"
        with self._lock:
            self.chunks += 1
            self.last_output = self.clock()
            if _MARK_START in text:
                text = self._take_marks(text)
                self._marked.notify_all()
            out = self._prefixer.feed(label, stream, text)
            if out:
                self._write(stream, out, self.target)
                if stream == "stderr":
                    self._stderr_labels.add(label)
            if self._prefixer.has_pending() and self._timer is None:
                self._timer = threading.Timer(self._delay, self._flush_partials)
                self._timer.daemon = True
                self._timer.start()

    def wrote_stderr(self, mesh: str, rank: int) -> bool:
        """Whether rank `rank` of proc mesh `mesh` wrote to stderr in the cell output goes
        to now (its last lines need not be repeated in that cell's error)."""
        with self._lock:
            return any(lb == f"{mesh} {rank}" or lb.startswith(f"{mesh} {rank}@")
                       for lb in self._stderr_labels)

    def _take_marks(self, text: str) -> str:
        """Count and remove end-of-cell marks; a mark on its own line goes with its line,
        one after a partial line leaves that line's newline in place."""

        def drop(m: "re.Match[str]") -> str:
            self._marks[m.group(1)] = self._marks.get(m.group(1), 0) + 1
            while len(self._marks) > 256:  # marks of cells nobody waits for (interrupted)
                del self._marks[next(iter(self._marks))]
            at_line_start = m.start() == 0 or text[m.start() - 1] in "\r\n"
            return "" if at_line_start else (m.group(2) or "")

        return _MARK.sub(drop, text)

    def _flush_partials(self) -> None:
        with self._lock:
            self._timer = None
            self._write_all(self._prefixer.flush())

    def flush(self) -> None:
        """Write held partial lines and end open lines (at the end of a cell)."""
        with self._lock:
            self._write_all(self._prefixer.close_lines())

    def _write_all(self, items: list[tuple[str, str]]) -> None:
        for stream, text in items:
            if text:
                self._write(stream, text, self.target)

    def wait_marks(self, token: str, count: int, timeout: float) -> bool:
        """Wait until `count` end-of-cell marks with `token` arrived (False on timeout):
        all output written before them has then been written to the cell."""
        with self._marked:
            ok = self._marked.wait_for(lambda: self._marks.get(token, 0) >= count, timeout)
            self._marks.pop(token, None)
            return ok

    def settle(self, grace: float = 0.03, quiet: float = 0.03, limit: float = 0.25) -> float:
        """Wait `grace` s, then until no output arrived for `quiet` s (at most `limit` s in
        all): output still in flight when a cell ends then lands in that cell. Returns the
        time waited. (Remote output travels proc -> host agent -> here, replies directly.)"""
        start = self.clock()
        end = start + limit
        while True:
            now = self.clock()
            if now >= end or (now - start >= grace and now - self.last_output >= quiet):
                return now - start
            self.sleep(0.005)


def kernel_writer(stdout: Any = None, stderr: Any = None) -> Writer:
    """A Writer onto ipykernel's OutStreams that sets this thread's parent per write.

    Without explicit streams it writes to whatever sys.stdout/sys.stderr are at the time."""
    fixed = {"stdout": stdout, "stderr": stderr}

    def write(stream: str, text: str, parent: Optional[dict]) -> None:
        s = fixed[stream] or getattr(sys, stream)
        set_parent = getattr(s, "set_thread_parent", None)
        if parent is not None and set_parent is not None:
            token = set_parent(parent)
            try:
                s.write(text)
            finally:
                s.reset_thread_parent(token)
        else:
            s.write(text)
            try:  # a plain terminal stream; ipykernel's OutStream flushes on its own thread
                s.flush()
            except Exception:
                pass

    return write
