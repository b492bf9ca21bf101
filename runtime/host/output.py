"""Output pipes: the agent reads each proc's stdout/stderr pipe, splits it into labelled
lines, forwards them to the proc's owner, keeps the last lines of stderr, and appends them
to the proc's log file when file capture is on (`logfiles.LogFile`)."""

from __future__ import annotations

import collections
import os
from typing import Any, Callable, Optional

from .. import logs
from .logfiles import LogFile

__all__ = ["Forward", "ProcPipes"]

#: send(owner, proc_id, stream, label, text)
Forward = Callable[[str, str, str, str, str], None]


class ProcPipes:
    """The output pipes of one proc, read on the agent's I/O thread."""

    def __init__(self, proc_id: str, pid: int, mesh: str, owner: str, out_fd: int,
                 err_fd: int, tail_lines: int, loop: Any, forward: Forward,
                 log_file: Optional[LogFile] = None) -> None:
        self.proc_id = proc_id
        self.log_file = log_file
        self.pid = pid
        self.owner = owner
        self.loop = loop
        self.forward = forward
        self.fds = {out_fd: "stdout", err_fd: "stderr"}
        self.splitters = {"stdout": logs.LineSplitter(mesh), "stderr": logs.LineSplitter(mesh)}
        #: per stream: its last text did not end its line (control marks are stripped
        #: from the log file and tails accordingly)
        self.line_open = {"stdout": False, "stderr": False}
        self.stderr_tail: collections.deque = collections.deque(maxlen=tail_lines)
        self.flush_scheduled = False
        self.exited = False
        for fd in (out_fd, err_fd):
            os.set_blocking(fd, False)
            loop.add_reader(fd, lambda fd=fd: self.read(fd))

    def read(self, fd: int, final: bool = False) -> None:
        stream = self.fds.get(fd)
        if stream is None:
            return
        chunks = []
        eof = False
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError:
                eof = True
                break
            if not data:
                eof = True
                break
            chunks.append(data)
            if not final and len(chunks) > 16:
                break
        if chunks:
            self._send(stream, self.splitters[stream].feed(b"".join(chunks)))
            if self.splitters[stream].pending() and not self.flush_scheduled:
                self.flush_scheduled = True
                self.loop.call_later(0.1, self.flush)
        if eof:
            self._close_fd(fd)

    def finish(self) -> None:
        """The proc exited: read what is left, flush partial lines, close the pipes."""
        self.exited = True
        for fd in list(self.fds):
            self.read(fd, final=True)
        self.flush()
        if self.log_file is not None:
            self.log_file.close()

    def flush(self) -> None:
        self.flush_scheduled = False
        for stream, sp in self.splitters.items():
            self._send(stream, sp.flush())
        if not self.fds or self.exited:
            for fd in list(self.fds):
                self._close_fd(fd)

    def _close_fd(self, fd: int) -> None:
        self.loop.remove_reader(fd)
        self.fds.pop(fd, None)
        try:
            os.close(fd)
        except OSError:
            pass

    def _send(self, stream: str, parts: list) -> None:
        for label, text in parts:
            plain = logs.strip_marks(text, self.line_open[stream])
            if plain:
                self.line_open[stream] = not plain.endswith(("\n", "\r"))
            if self.log_file is not None and plain:
                self.log_file.write(plain.encode())
            if stream == "stderr":
                self.stderr_tail.extend(plain.splitlines())
            self.forward(self.owner, self.proc_id, stream, label, text)
