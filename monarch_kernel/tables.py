"""Small display objects for the magics: a table and rendered text, each with a plain-text
form (terminals, headless runs) and an HTML form (JupyterLab); and the procs' start-up
progress bar, which is tqdm's."""

from __future__ import annotations

import html
from typing import Any, Optional, Sequence

__all__ = ["Table", "Rendered", "PROC_BAR_FORMAT", "progress_bar"]


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


#: The text of a proc start-up bar: "allocating t {'procs': 4}:  50%|#####     | 2/4 procs up, starting"
PROC_BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} procs up{postfix}"


def progress_bar(desc: str, total: int, *, shell: Any = None, disable: bool = False,
                 postfix: str = "") -> Any:
    """A tqdm bar counting procs up (`bar.update(n)`, `bar.set_postfix_str(s)`, then
    `bar.close()`, which leaves the final line).

    In a Jupyter kernel (`shell.kernel` set) it is tqdm's notebook widget, shown through a
    display handle whose text form is refreshed when the bar closes, so frontends without
    widgets (nbclient, a saved notebook) keep the final line. Elsewhere (a terminal, an
    IPython without a kernel, no ipywidgets) it is plain tqdm on stderr."""
    if getattr(shell, "kernel", None) is not None and not disable:
        try:
            return _kernel_bar_class()(total=total, desc=desc, bar_format=PROC_BAR_FORMAT,
                                       postfix=postfix or None, leave=True)
        except ImportError:  # no ipywidgets: the text bar
            pass
    import sys

    from tqdm import tqdm

    return tqdm(total=total, desc=desc, bar_format=PROC_BAR_FORMAT, postfix=postfix or None,
                leave=True, disable=disable, file=sys.stderr)


_KERNEL_BAR: Any = None


def _kernel_bar_class() -> Any:
    global _KERNEL_BAR
    if _KERNEL_BAR is None:
        from IPython.display import display
        from tqdm.notebook import tqdm_notebook

        class KernelBar(tqdm_notebook):
            """tqdm's notebook bar, displayed with a display id so closing it also updates
            its text/plain form (what frontends without widgets show)."""

            def __init__(self, *args: Any, **kw: Any) -> None:
                self._handle = None
                super().__init__(*args, display=False, **kw)
                if not self.disable:
                    self._handle = display(self.container, display_id=True)

            def close(self) -> None:
                was_open = not self.disable
                super().close()
                if was_open and self._handle is not None:
                    self._handle.update(self.container)

        _KERNEL_BAR = KernelBar
    return _KERNEL_BAR
