"""`python -m runtime.config [--markdown | --env]`: the settings table, or current values.

Layer 1 (basics): reads the declarations of `runtime.config`, nothing else of runtime.
"""

from __future__ import annotations

import sys
from typing import Optional

from . import SETTINGS, config, markdown

__all__ = ["main"]


def main(argv: Optional[list[str]] = None) -> int:
    """Print the settings table (`--markdown`), the values children get (`--env`), or every
    setting's current value (no argument); 2 with a usage line for anything else."""
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--markdown"]:
        sys.stdout.write(markdown())
    elif argv == ["--env"]:
        sys.stdout.writelines(f"{k}={v}\n" for k, v in config.to_env().items())
    elif not argv:
        sys.stdout.writelines(f"{s.env}={'***' if s.secret else s.to_text(getattr(config, s.name))}\n"
                              for s in SETTINGS.values())
    else:
        sys.stderr.write("usage: python -m runtime.config [--markdown | --env]\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
