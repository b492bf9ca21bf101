"""`python -m runtime.config [--markdown | --env]`: the settings table, or current values.

Layer 1 (basics): imports nothing of runtime (`runtime.config` passes itself in).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Mapping, Optional


def main(argv: Optional[list[str]], settings: Mapping[str, Any], config: Any,
         markdown: Callable[[], str]) -> int:
    """`python -m runtime.config [--markdown | --env]`: the settings table, or current values."""
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--markdown"]:
        sys.stdout.write(markdown())
    elif argv == ["--env"]:
        sys.stdout.writelines(f"{k}={v}\n" for k, v in config.to_env().items())
    elif not argv:
        sys.stdout.writelines(f"{s.env}={'***' if s.secret else s.to_text(getattr(config, s.name))}\n"
                              for s in settings.values())
    else:
        sys.stderr.write("usage: python -m runtime.config [--markdown | --env]\n")
        return 2
    return 0
