"""The settings tables of docs/configuration.md, as markdown (`runtime.config.markdown()`).

Layer 1 (basics): imports nothing of runtime (the tables are passed in).
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["markdown"]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(settings: Mapping[str, Any], aliases: Mapping[str, str],
             unmapped: Mapping[str, str]) -> str:
    """The settings tables of docs/configuration.md."""
    lines = ["| name | env var | type | default | read | description |",
             "|---|---|---|---|---|---|"]
    for s in settings.values():
        kind = s.type + (" (s)" if s.seconds else "")
        if s.choices:
            kind += ": " + ", ".join(s.choices)
        default = s.to_text(s.default)
        lines.append(f"| `{s.name}` | `{s.env}` | {kind} | "
                     f"{f'`{default}`' if default else '(unset)'} | "
                     f"{'each use' if s.live else 'import'} | {_cell(s.doc)} |")
    lines += ["", "| Monarch name | here |", "|---|---|"]
    lines += [f"| `{k}` | `{v}` |" for k, v in aliases.items()]
    lines += ["", "| Monarch name, ignored with a warning | why |", "|---|---|"]
    lines += [f"| `{k}` | {_cell(v)} |" for k, v in unmapped.items()]
    return "\n".join(lines) + "\n"
