"""Small display objects for the magics: a table and a progress bar, each with a plain-text
form (terminals, headless runs) and an HTML form (JupyterLab)."""

from __future__ import annotations

import html
from typing import Any, Optional, Sequence


class Table:
    """Rows of cells under a header; shows as HTML in notebooks and aligned text elsewhere."""

    def __init__(self, columns: Sequence[str], title: str = "") -> None:
        self.columns = list(columns)
        self.rows: list[list[str]] = []
        self.title = title

    def add(self, *cells: Any) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"row of {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(["" if c is None else str(c) for c in cells])

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        if not self.rows:
            return f"(no {self.title or 'rows'})"
        widths = [max(len(c), *(len(r[i]) for r in self.rows)) for i, c in
                  enumerate(self.columns)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        lines = [fmt.format(*self.columns), fmt.format(*("-" * w for w in widths))]
        lines += [fmt.format(*r) for r in self.rows]
        return "\n".join(line.rstrip() for line in lines)

    def _repr_html_(self) -> str:
        if not self.rows:
            return f"<i>no {html.escape(self.title or 'rows')}</i>"
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                       for r in self.rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class Rendered:
    """Text shown as is (no quotes), with an HTML form for notebooks when given."""

    def __init__(self, text: str, html_text: Optional[str] = None) -> None:
        self.text = text
        self.html = html_text

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> Optional[str]:
        return self.html


class Progress:
    """How many of `total` things are done; updated in place through a display handle."""

    def __init__(self, label: str, total: int) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.elapsed: Optional[float] = None
        self.error: Optional[str] = None

    def finish(self, elapsed: float) -> None:
        self.done = self.total
        self.elapsed = elapsed

    def fail(self, error: str) -> None:
        self.error = error

    def _status(self) -> str:
        if self.error:
            return f"failed: {self.error}"
        if self.elapsed is not None:
            return f"ready in {self.elapsed:.1f} s"
        return "starting"

    def __repr__(self) -> str:
        width = 20
        filled = int(width * self.done / self.total) if self.total else width
        bar = "#" * filled + "-" * (width - filled)
        return f"{self.label}: [{bar}] {self.done}/{self.total} procs up, {self._status()}"

    def _repr_html_(self) -> str:
        return (f"<div><code>{html.escape(self.label)}</code> "
                f"<progress value='{self.done}' max='{self.total}'></progress> "
                f"{self.done}/{self.total} procs up, {html.escape(self._status())}</div>")
