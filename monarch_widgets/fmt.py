"""Small formatting helpers shared by the text, HTML and terminal views."""

from __future__ import annotations

import time
from typing import Optional

__all__ = ["fmt_bytes", "fmt_duration", "fmt_cpu", "lease_text"]


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


def lease_text(keep: float, reattached: Optional[float] = None) -> str:
    """A kept mesh's lifetime in words ('' for a mesh that ends with its controller):
    'kept: lease ends 30m00s after its controller goes away; reattached at 12:00:03'."""
    if not keep:
        return ""
    text = f"kept: lease ends {fmt_duration(keep)} after its controller goes away"
    if reattached:
        text += f"; reattached at {time.strftime('%H:%M:%S', time.localtime(reattached))}"
    return text
