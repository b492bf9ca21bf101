"""Forwarding of proc output to the controller.

In a proc, fds 1 and 2 are pipes read by the host agent, so output from C code is caught
too. Python-level writes from an actor's thread are tagged with the actor mesh's name
(an escape sequence at the start of each line) so the controller can prefix each line
with `[mesh rank]`. The agent splits the stream into labelled lines (`LineSplitter`).
"""

from __future__ import annotations

import collections
import io
import os
import re
import sys
import threading
from typing import Callable, Optional

from .. import config as _config
from .._base.context import get_context

__all__ = [
    "TAG_START", "TAG_END", "CONTROL_MARK", "strip_marks", "Sink", "emit", "OutputWriter",
    "LineSplitter", "set_thread_label", "TaggedWriter", "actor_logger", "set_actor_log_level",
    "install_actor_prefix",
]

TAG_START = "\x1b]777;mn:"
TAG_END = "\x07"
#: Lines starting with this are control marks for the output sink (e.g. the notebook's
#: end-of-cell marks): forwarded to the sink, but kept out of output and stderr tails.
CONTROL_MARK = "\x1b]777;mk-"
_CONTROL = re.compile(r"\x1b\]777;mk-[^\x07\n]*\x07(\r?\n)?")


def strip_marks(text: str, line_open: bool = False) -> str:
    """`text` without control marks: a mark that starts a line goes with its newline; one
    after a partial line (output without a final newline; `line_open`: `text` continues a
    line) leaves that line's newline in place."""
    if CONTROL_MARK not in text:
        return text

    def drop(m: "re.Match[str]") -> str:
        at_start = text[m.start() - 1] in "\r\n" if m.start() else not line_open
        return "" if at_start else (m.group(1) or "")

    return _CONTROL.sub(drop, text)

Sink = Callable[[str, str, str], None]

_print_lock = threading.Lock()


def emit(sink: Optional[Sink], prefix: str, stream: str, text: str,
         open_lines: Optional[set] = None) -> None:
    """Deliver forwarded output: to `sink(prefix, stream, text)`, or print it prefixed (a
    partial line printed as a line: `open_lines` keeps the (prefix, stream) whose line that
    was, so that the newline ending it later prints no empty line)."""
    if sink is not None:
        try:
            sink(prefix, stream, text)
            return
        except Exception:
            pass
    if open_lines is not None:
        key = (prefix, stream)
        if key in open_lines and text.startswith(("\n", "\r\n")):
            text = text[text.index("\n") + 1:]
        if text.endswith(("\n", "\r")) or not text:
            open_lines.discard(key)
        else:
            open_lines.add(key)
    out = sys.stderr if stream == "stderr" else sys.stdout
    lines = text.splitlines(keepends=True)
    formatted = "".join(f"[{prefix}] {ln}" if ln.strip("\r\n") or ln == "\n" else ln
                        for ln in lines)
    if formatted and not formatted.endswith("\n"):
        formatted += "\n"
    with _print_lock:
        try:
            out.write(formatted)
            out.flush()
        except (ValueError, OSError):
            pass


class OutputWriter:
    """Delivers forwarded output (`emit`) on a thread of its own, so that the thread that
    receives it (the I/O thread) never waits on a terminal or a notebook.

    `put` never blocks: it queues, in order, up to `config.output_buffer_bytes` of text; past
    that a line is dropped and counted, and once the writer catches up it delivers one line
    saying how many were dropped. `drain` waits until everything queued so far is out."""

    def __init__(self, name: str = "runtime-output") -> None:
        self._name = name
        self._cv = threading.Condition(threading.Lock())
        self._queue: "collections.deque[tuple[Optional[Sink], str, str, str]]" = \
            collections.deque()
        self._bytes = 0
        self._dropped = [0, 0]  # lines, bytes, not yet reported
        self._put = self._done = 0  # entries queued and delivered so far
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self._waiters: list[tuple[int, Callable[[], None]]] = []  # (entries, fn): when_drained
        self._open_lines: set[tuple[str, str]] = set()  # (writer thread only) see `emit`

    def put(self, sink: Optional[Sink], prefix: str, stream: str, text: str) -> None:
        """Queue `text` for `emit(sink, prefix, stream, text)` (any thread; never blocks)."""
        with self._cv:
            if self._closed:
                return
            if self._bytes + len(text) > _config.config.output_buffer_bytes and self._queue:
                self._dropped[0] += text.count("\n") or 1
                self._dropped[1] += len(text)
                return
            self._report_dropped(sink)
            self._append((sink, prefix, stream, text))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            else:
                self._cv.notify()

    def _report_dropped(self, sink: Optional[Sink]) -> None:
        """Queue the line that says what was dropped, where the dropped lines were (lock held)."""
        if self._dropped[0]:
            lines, size = self._dropped
            self._dropped = [0, 0]
            self._append((sink, "runtime", "stderr",
                          f"{lines} line(s), {size} bytes of proc output dropped: the output "
                          f"was not being read (output_buffer_bytes); the procs' log files "
                          f"have them\n"))

    def _append(self, item: "tuple[Optional[Sink], str, str, str]") -> None:
        self._queue.append(item)
        self._bytes += len(item[3])
        self._put += 1

    def when_drained(self, fn: Callable[[], None]) -> None:
        """Call `fn()` once what was queued before this call is delivered: at once on this
        thread if nothing waits, else on the writer's thread (`fn` must not block)."""
        with self._cv:
            target = self._put
            if self._done < target and self._thread is not None:
                self._waiters.append((target, fn))
                return
        fn()

    def drain(self, timeout: float) -> bool:
        """Wait until what was queued before this call is delivered; False on timeout."""
        with self._cv:
            target = self._put
            return self._cv.wait_for(lambda: self._done >= target or self._thread is None,
                                     timeout)

    def close(self, timeout: float = 1.0) -> None:
        """Deliver what is queued (up to `timeout`), then stop the thread."""
        self.drain(timeout)
        with self._cv:
            self._closed = True
            self._queue.clear()
            self._cv.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed:
                    self._thread = None
                    self._cv.notify_all()
                    due, self._waiters = [fn for _, fn in self._waiters], []
                    break
                sink, prefix, stream, text = self._queue.popleft()
            emit(sink, prefix, stream, text, self._open_lines)
            with self._cv:
                self._bytes -= len(text)
                self._done += 1
                if not self._queue:  # caught up: say what was dropped meanwhile
                    self._report_dropped(sink)
                self._cv.notify_all()
                due = [fn for target, fn in self._waiters if target <= self._done]
                if due:
                    self._waiters = [w for w in self._waiters if w[0] > self._done]
            for fn in due:
                fn()
        for fn in due:  # closed: nothing more will be delivered
            fn()


class LineSplitter:
    """Splits a byte stream into (label, text) chunks, reading the per-line tags."""

    def __init__(self, default_label: str) -> None:
        self.default_label = default_label
        self._buf = b""
        #: the label of a partial line already flushed: its continuation (the rest of a
        #: `print` whose newline came after the flush) keeps it
        self._open_label: Optional[str] = None

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        self._buf += data
        if b"\n" not in self._buf:
            return []
        head, _, self._buf = self._buf.rpartition(b"\n")
        return self._split(head.decode("utf-8", "replace") + "\n")

    def flush(self) -> list[tuple[str, str]]:
        if not self._buf:
            return []
        text, self._buf = self._buf.decode("utf-8", "replace"), b""
        return self._split(text)

    def pending(self) -> bool:
        return bool(self._buf)

    def _split(self, text: str) -> list[tuple[str, str]]:
        """(label, text) runs of `text`. A tag also counts in the middle of a line: a
        Python-level write after fd-level output without a newline (`os.write(1, b"raw")`)
        tags its line there; the text before it keeps the line's label."""
        out: list[tuple[str, str]] = []
        for line in text.splitlines(keepends=True):
            label = self._open_label or self.default_label
            self._open_label = None
            if not line.endswith(("\n", "\r")):  # a partial line (flush): it may go on
                self._open_label = self._label_at_end(line, label)
            while line:
                if line.startswith(TAG_START):
                    end = line.find(TAG_END)
                    if end > 0:
                        label = line[len(TAG_START):end]
                        line = line[end + 1:]
                        continue
                cut = line.find(TAG_START, 1)
                seg, line = (line, "") if cut < 0 else (line[:cut], line[cut:])
                if out and out[-1][0] == label:
                    out[-1] = (label, out[-1][1] + seg)
                else:
                    out.append((label, seg))
        return out

    @staticmethod
    def _label_at_end(line: str, label: str) -> str:
        """The label in force at the end of `line` (the last complete tag in it)."""
        end = line.rfind(TAG_END)
        start = line.rfind(TAG_START, 0, end) if end > 0 else -1
        return line[start + len(TAG_START):end] if start >= 0 else label


_current_label = threading.local()


def set_thread_label(label: Optional[str]) -> None:
    """Label Python-level output written by this thread (the actor mesh's name)."""
    _current_label.value = label


class TaggedWriter(io.TextIOBase):
    """A text stream over a raw fd that tags each line with the writing thread's label."""

    def __init__(self, fd: int, name: str) -> None:
        self._fd = fd
        self._name = name
        self._at_line_start = threading.local()
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._name

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def write(self, s: str) -> int:
        if not s:
            return 0
        label = getattr(_current_label, "value", None)
        if label:
            start = getattr(self._at_line_start, "v", True)
            tag = f"{TAG_START}{label}{TAG_END}"
            parts = s.split("\n")
            out = []
            for i, p in enumerate(parts):
                if i > 0:
                    out.append("\n")
                if p and (start if i == 0 else True):
                    out.append(tag)
                out.append(p)
            self._at_line_start.v = s.endswith("\n")
            data = "".join(out).encode("utf-8", "replace")
        else:
            data = s.encode("utf-8", "replace")
        with self._lock:
            view = memoryview(data)
            while view:
                try:
                    n = os.write(self._fd, view)
                except InterruptedError:
                    continue
                except BlockingIOError:
                    import select

                    select.select([], [self._fd], [], 1.0)
                    continue
                view = view[n:]
        return len(s)

    def flush(self) -> None:
        pass


# -- Actor.logger: records carry the actor's name and rank; printed on the proc's stderr ---
import logging  # noqa: E402

_ACTOR_FORMAT = "%(levelname)s %(name)s: %(message)s"


class _ActorRecordFilter(logging.Filter):
    """Adds `actor_name` (mesh name), `rank` (int) and `point` (Monarch's str form)."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = get_context()
        record.actor_name = ctx.name if ctx is not None else "controller"
        record.rank = ctx.rank.rank if ctx is not None else 0
        record.point = str(ctx.rank) if ctx is not None else "{}"
        return True


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is now (a proc replaces it with a TaggedWriter)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


_actor_handler = _StderrHandler()
_actor_handler.setFormatter(logging.Formatter(_ACTOR_FORMAT))
_actor_handler.setLevel(logging.INFO)
_actor_filter = _ActorRecordFilter()


def actor_logger(name: str) -> logging.Logger:
    """The logger behind `Actor.logger`: level DEBUG as in Monarch; what prints is the
    handler's level (INFO, or `ProcMesh.logging_option(level=...)`)."""
    lg = logging.getLogger(name)
    if _actor_handler not in lg.handlers:
        lg.setLevel(logging.DEBUG)
        lg.addFilter(_actor_filter)
        lg.addHandler(_actor_handler)
        lg.propagate = False
    return lg


def set_actor_log_level(level: int) -> None:
    """The lowest level `Actor.logger` records print at in this process."""
    _actor_handler.setLevel(level)


# -- Monarch's `[actor=NAME]` prefix on log records -----------------------------------------
_base_factory = logging.getLogRecordFactory()


def _actor_record_factory(*args: object, **kwargs: object) -> logging.LogRecord:
    """Make a log record whose message starts with `[actor=<root>.<mod.Cls name{..}>] ` (the
    running actor's Monarch name; `<root>` outside actors), as Monarch's records do. Empty
    and non-string messages (structured logging) are left alone; none has it while
    `runtime.config.prefix_python_logs_with_actor` (Monarch's `monarch.actor.config.`) is False."""
    record = _base_factory(*args, **kwargs)
    msg = record.msg
    if isinstance(msg, str) and msg and not msg.startswith("[actor=") and \
            _config.prefix_python_logs_with_actor:
        ctx = get_context()
        record.msg = f"[actor={ctx if ctx is not None else '<root>'}] {msg}"
    return record


def install_actor_prefix() -> None:
    """Install the `[actor=...]` prefix for log records of this process (idempotent)."""
    if logging.getLogRecordFactory() is not _actor_record_factory:
        logging.setLogRecordFactory(_actor_record_factory)


install_actor_prefix()
