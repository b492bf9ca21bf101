"""The Monarch Jupyter kernel: ipykernel's IPython kernel with the %mesh magics loaded,
remote output routed into cells, and every mesh stopped on shutdown or restart."""

from __future__ import annotations

import asyncio
import atexit
import inspect
import shutil
import signal
from contextlib import contextmanager
from typing import Any, Iterator

from ipykernel.ipkernel import IPythonKernel
from traitlets import Type

from monarch_kernel import __version__

__all__ = ["MonarchKernel", "launch"]


class MonarchKernel(IPythonKernel):
    """An IPython kernel that is a Monarch single controller."""

    implementation = "monarch_kernel"
    implementation_version = __version__
    #: the Debugger panel: local code through debugpy, paused remote ranks as threads
    debugger_class = Type("monarch_kernel.visual_debugger.MonarchDebugger")

    @property
    def kernel_info(self) -> dict:  # type: ignore[override]
        """ipykernel's, plus the deprecated `debugger` flag older front-ends read."""
        info = dict(super().kernel_info)
        info["debugger"] = "debugger" in info.get("supported_features", [])
        return info

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        assert self.shell is not None
        self.shell.extension_manager.load_extension("monarch_kernel")

    @property
    def banner(self) -> str:  # type: ignore[override]
        base = super().banner
        return (f"{base}\nMonarch kernel {__version__}: this notebook is the controller. "
                "Try '%mesh --help'.\n")

    @contextmanager
    def _cancel_on_sigint(self, future: "asyncio.Future[Any]") -> Iterator[None]:
        """Cancel an awaiting cell at once on SIGINT (the stop button).

        ipykernel 7's version sets the result from another thread's loop, so the cell's
        loop only notices at its next wake-up (an awaited call then runs to its end). Here
        the handler wakes the cell's own loop; cancelling the awaited runtime Future also
        interrupts the remote actors of the call."""
        loop = future.get_loop()

        def cancel() -> None:
            if not future.done():
                future.cancel()

        def handle_sigint(*args: Any) -> None:
            loop.call_soon_threadsafe(cancel)

        saved = signal.signal(signal.SIGINT, handle_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, saved)

    async def do_complete(self, code: str, cursor_pos: Any) -> Any:
        """A %%mesh body completes against a proc's namespace; the rest as IPython does
        (with the mesh-aware matcher the extension adds)."""
        from monarch_kernel.completion import complete_cell

        cursor = len(code) if cursor_pos is None else cursor_pos
        reply = await complete_cell(self.shell, code, cursor)
        return reply if reply is not None else super().do_complete(code, cursor)

    async def do_inspect(self, code: str, cursor_pos: Any, detail_level: int = 0,
                         omit_sections: Any = ()) -> Any:
        """Shift-Tab in a %%mesh body inspects the object on a proc; elsewhere, locally."""
        from monarch_kernel.completion import inspect_cell

        cursor = len(code) if cursor_pos is None else cursor_pos
        reply = await inspect_cell(self.shell, code, cursor, detail_level)
        if reply is not None:
            return reply
        return super().do_inspect(code, cursor, detail_level, omit_sections)

    async def do_shutdown(self, restart: bool) -> Any:
        """Stop every mesh this notebook created before the process goes (or restarts)."""
        from monarch_kernel.extension import shutdown_all

        shutdown_all()
        reply = super().do_shutdown(restart)
        if inspect.isawaitable(reply):
            reply = await reply
        return reply


def _remove_cell_files() -> None:
    """The debugger's copies of the notebook's cells (ipykernel writes them under
    <tmp>/ipykernel_<pid> for breakpoints) go with the kernel process."""
    from ipykernel.compiler import get_tmp_directory

    shutil.rmtree(get_tmp_directory(), ignore_errors=True)


def launch() -> None:
    """Start the kernel (the kernelspec runs `python -m monarch_kernel -f FILE`)."""
    from ipykernel.kernelapp import IPKernelApp

    atexit.register(_remove_cell_files)
    IPKernelApp.launch_instance(kernel_class=MonarchKernel)
