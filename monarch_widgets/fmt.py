"""Small formatting helpers shared by the text, HTML and terminal views."""

from __future__ import annotations

from typing import Optional


def fmt_bytes(n: Optional[int]) -> str:
    """1536 -> '1.5K'; None -> '-'."""
    if n is None:
        return "-"
    x = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(x) < 1024 or unit == "T":
            return f"{x:.0f}{unit}" if unit == "B" else f"{x:.1f}{unit}"
        x /= 1024
    return f"{x:.1f}T"


def fmt_duration(seconds: float) -> str:
    """65 -> '1m05s'; 3 -> '3.0s'."""
    s = max(0.0, float(seconds))
    if s < 60:
        return f"{s:.1f}s"
    m, s = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


def fmt_cpu(p: Optional[float]) -> str:
    return "-" if p is None else f"{p:.0f}%"
