"""monarch_kernel: a Jupyter kernel, and IPython magics, that make a notebook the single
controller of Monarch meshes. `%load_ext monarch_kernel` loads the magics anywhere."""

from __future__ import annotations

from typing import Any

__all__ = ["load_ipython_extension", "unload_ipython_extension"]

__version__ = "0.1.0"


def load_ipython_extension(ipython: Any) -> None:
    """Register the %mesh magics and the remote-output routing in this IPython session."""
    from monarch_kernel.extension import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from monarch_kernel.extension import unload

    unload(ipython)
