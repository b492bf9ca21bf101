"""Execute a notebook headless with the Monarch kernel and print each cell's outputs.

`python -m monarch_kernel.run_notebook notebooks/quickstart.ipynb [--timeout S]`: exits
non-zero when a cell fails or times out; `--save PATH` writes the executed notebook.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any, Optional, Sequence, TextIO

__all__ = ["strip_ansi", "output_text", "cell_text", "run_notebook", "main"]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def _join(v: Any) -> str:
    return "".join(v) if isinstance(v, list) else str(v)


def output_text(output: Any) -> str:
    """One output of a cell as plain text (streams, results, displays, errors)."""
    kind = output.get("output_type")
    if kind == "stream":
        return _join(output.get("text", ""))
    if kind in ("execute_result", "display_data"):
        data = output.get("data", {})
        if "text/plain" in data:
            text = _join(data["text/plain"])
            return text if text.endswith("\n") else text + "\n"
        kinds = ", ".join(sorted(data))
        return f"<{kinds}>\n"
    if kind == "error":
        tb = "\n".join(strip_ansi(line) for line in output.get("traceback", []))
        return (tb or f"{output.get('ename')}: {output.get('evalue')}") + "\n"
    return ""


def cell_text(cell: Any) -> str:
    """All outputs of a code cell as plain text."""
    return "".join(output_text(o) for o in cell.get("outputs", []))


def _print_cell(cell: Any, index: int, out: TextIO) -> None:
    count = cell.get("execution_count")
    src = _join(cell.get("source", "")).strip().splitlines()
    first = src[0] if src else ""
    out.write(f"--- [{count if count is not None else ' '}] cell {index}: {first[:70]}\n")
    text = cell_text(cell)
    if text:
        out.write(text if text.endswith("\n") else text + "\n")
    out.flush()


def run_notebook(path: str, kernel_name: str = "monarch", timeout: float = 300.0,
                 startup_timeout: float = 60.0, save: Optional[str] = None,
                 out: Optional[TextIO] = None, cwd: Optional[str] = None) -> int:
    """Execute `path`; print each cell's outputs as it completes. Returns an exit status."""
    import nbformat
    from jupyter_client.kernelspec import NoSuchKernel
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    out = out or sys.stdout
    nb = nbformat.read(path, as_version=4)
    workdir = cwd or os.path.dirname(os.path.abspath(path))

    def on_executed(cell: Any, cell_index: int, execute_reply: Any) -> None:
        _print_cell(cell, cell_index, out)

    client = NotebookClient(
        nb, kernel_name=kernel_name, timeout=int(timeout), startup_timeout=int(startup_timeout),
        resources={"metadata": {"path": workdir}}, on_cell_executed=on_executed,
    )
    status = 0
    try:
        client.execute()
        out.write(f"=== {path}: all cells ran\n")
    except NoSuchKernel:
        out.write(f"=== {path}: no kernelspec named {kernel_name!r}; install it with "
                  "'python -m monarch_kernel install --sys-prefix'\n")
        status = 2
    except CellTimeoutError as e:
        out.write(f"=== {path}: a cell timed out after {timeout:g} s: "
                  f"{strip_ansi(str(e)).splitlines()[0] if str(e) else ''}\n")
        status = 1
    except CellExecutionError as e:
        name = getattr(e, "ename", "") or "error"
        out.write(f"=== {path}: a cell failed ({name}); see its output above\n")
        status = 1
    except DeadKernelError as e:
        out.write(f"=== {path}: the kernel died: {e}\n")
        status = 1
    except RuntimeError as e:  # e.g. the kernel did not start in time
        out.write(f"=== {path}: {e}\n")
        status = 1
    finally:
        if save:
            nbformat.write(nb, save)
    out.flush()
    return status


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m monarch_kernel.run_notebook",
                                description="Execute a notebook headless and print its outputs.")
    p.add_argument("notebook", help="path of the .ipynb to execute")
    p.add_argument("--kernel", default="monarch", help="kernelspec name (default monarch)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds each cell may run (default 300)")
    p.add_argument("--startup-timeout", type=float, default=60.0,
                   help="seconds the kernel may take to start (default 60)")
    p.add_argument("--save", metavar="PATH", help="write the executed notebook to PATH")
    a = p.parse_args(argv)
    if not os.path.isfile(a.notebook):
        print(f"run_notebook: no such notebook: {a.notebook}", file=sys.stderr)
        return 2
    if a.timeout <= 0:
        print("run_notebook: --timeout must be positive", file=sys.stderr)
        return 2
    return run_notebook(a.notebook, a.kernel, a.timeout, a.startup_timeout, a.save)


if __name__ == "__main__":
    sys.exit(main())
