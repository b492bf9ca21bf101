"""Install the Monarch kernelspec: `python -m monarch_kernel install [options]`."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from typing import Optional, Sequence

__all__ = ["KERNEL_NAME", "DISPLAY_NAME", "kernel_dict", "write_kernel_spec", "install", "main"]

KERNEL_NAME = "monarch"
DISPLAY_NAME = "Monarch (Python 3)"


def kernel_dict(display_name: str = DISPLAY_NAME, env: Optional[dict[str, str]] = None,
                executable: Optional[str] = None) -> dict:
    """The kernel.json contents: this Python, running `-m monarch_kernel`."""
    spec = {
        "argv": [executable or sys.executable, "-m", "monarch_kernel", "-f",
                 "{connection_file}"],
        "display_name": display_name,
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": {"debugger": True},
        "kernel_protocol_version": "5.5",
    }
    if env:
        spec["env"] = dict(env)
    return spec


def write_kernel_spec(path: str, display_name: str = DISPLAY_NAME,
                      env: Optional[dict[str, str]] = None) -> str:
    """Write kernel.json (and ipykernel's logos) into the directory `path`."""
    os.makedirs(path, exist_ok=True)
    try:  # reuse ipykernel's logos so the launcher shows an icon
        from ipykernel.kernelspec import RESOURCES

        for name in os.listdir(RESOURCES):
            if name.startswith("logo"):
                shutil.copy(os.path.join(RESOURCES, name), path)
    except Exception:
        pass
    with open(os.path.join(path, "kernel.json"), "w") as f:
        json.dump(kernel_dict(display_name, env), f, indent=1)
    return path


def install(name: str = KERNEL_NAME, display_name: str = DISPLAY_NAME, user: bool = False,
            prefix: Optional[str] = None, env: Optional[dict[str, str]] = None) -> str:
    """Install the kernelspec; returns the directory it was installed to."""
    from jupyter_client.kernelspec import KernelSpecManager

    with tempfile.TemporaryDirectory() as tmp:
        src = write_kernel_spec(os.path.join(tmp, name), display_name, env)
        return KernelSpecManager().install_kernel_spec(
            src, kernel_name=name, user=user, prefix=prefix)


def _env_item(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m monarch_kernel install",
        description="Install the Monarch Jupyter kernelspec.")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true",
                       help="install for the current user (~/.local/share/jupyter)")
    where.add_argument("--sys-prefix", action="store_true",
                       help=f"install into this environment ({sys.prefix})")
    where.add_argument("--prefix", metavar="DIR", help="install under DIR/share/jupyter")
    p.add_argument("--name", default=KERNEL_NAME, help=f"kernelspec name (default {KERNEL_NAME})")
    p.add_argument("--display-name", default=DISPLAY_NAME,
                   help=f"name shown in frontends (default {DISPLAY_NAME!r})")
    p.add_argument("--env", action="append", type=_env_item, default=[], metavar="KEY=VALUE",
                   help="environment variable for the kernel (repeatable)")
    a = p.parse_args(argv)
    prefix = sys.prefix if a.sys_prefix else a.prefix
    try:
        dest = install(a.name, a.display_name, user=a.user, prefix=prefix,
                       env=dict(a.env) or None)
    except OSError as e:
        print(f"monarch_kernel install: cannot install kernelspec: {e}", file=sys.stderr)
        if not (a.user or prefix):
            print("  (try --user or --sys-prefix)", file=sys.stderr)
        return 1
    print(f"Installed kernelspec {a.name} ({a.display_name}) in {dest}")
    return 0
