"""Parsing of rank selectors such as `ranks(procs=0:4)`, `ranks(1,3)`, `ranks(2:)`.

Pure logic: a selector is parsed once and then matched against a rank and its coordinates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional, Union

__all__ = ["Spec", "SelectorError", "RankSelector", "parse_selector", "split_selector"]

Spec = Union[int, slice, tuple]  # one index, a slice, or a tuple of ints


class SelectorError(ValueError):
    """A rank selector that cannot be parsed."""


@dataclass(frozen=True)
class RankSelector:
    """Selects ranks by global rank (`flat`) and/or by named coordinates (`dims`)."""

    flat: tuple = ()  # specs on the global rank, any of which may match
    dims: dict = field(default_factory=dict)  # dim name -> spec
    everything: bool = False

    def matches(self, rank: int, coords: Optional[dict] = None) -> bool:
        if self.everything:
            return True
        if self.flat and not any(_match(s, rank) for s in self.flat):
            return False
        coords = coords or {}
        for dim, spec in self.dims.items():
            if dim not in coords or not _match(spec, int(coords[dim])):
                return False
        return True


def _match(spec: Spec, value: int) -> bool:
    if isinstance(spec, int):
        return value == spec
    if isinstance(spec, tuple):
        return value in spec
    start = 0 if spec.start is None else spec.start
    stop = spec.stop
    step = 1 if spec.step is None else spec.step
    if value < start or (stop is not None and value >= stop):
        return False
    return (value - start) % step == 0


_INT = r"-?\d+"


def _parse_spec(text: str) -> Spec:
    t = text.strip()
    if re.fullmatch(_INT, t):
        return int(t)
    if t.startswith("[") and t.endswith("]") or t.startswith("{") and t.endswith("}"):
        parts = [p.strip() for p in t[1:-1].split(",") if p.strip()]
        if not parts or not all(re.fullmatch(_INT, p) for p in parts):
            raise SelectorError(f"bad rank list {text!r}: expected e.g. [0,2,5]")
        return tuple(int(p) for p in parts)
    m = re.fullmatch(rf"({_INT})?\s*:\s*({_INT})?(?:\s*:\s*({_INT}))?", t)
    if m:
        a, b, c = (int(x) if x is not None else None for x in m.groups())
        if c == 0:
            raise SelectorError(f"bad slice {text!r}: step cannot be 0")
        return slice(a, b, c)
    raise SelectorError(f"bad rank spec {text!r}: expected N, A:B, A:B:S or [N,M,...]")


def _split_args(body: str) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in body:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [p for p in (x.strip() for x in out) if p]


def parse_selector(text: str) -> RankSelector:
    """Parse `ranks(...)`, `all` or `*`; raises SelectorError naming the problem."""
    t = text.strip()
    if t in ("*", "all", "ranks()", "ranks(*)"):
        return RankSelector(everything=True)
    m = re.fullmatch(r"ranks\((.*)\)", t, flags=re.S)
    if not m:
        raise SelectorError(
            f"bad selector {text!r}: expected ranks(N), ranks(A:B), ranks(dim=A:B, ...), "
            "ranks([N,M]) or all")
    flat: list = []
    dims: dict = {}
    for arg in _split_args(m.group(1)):
        if "=" in arg:
            name, _, spec = arg.partition("=")
            name = name.strip()
            if not name.isidentifier():
                raise SelectorError(f"bad dimension name {name!r} in {text!r}")
            dims[name] = _parse_spec(spec)
        else:
            if dims:
                raise SelectorError(f"positional rank after named ones in {text!r}")
            flat.append(_parse_spec(arg))
    if not flat and not dims:
        return RankSelector(everything=True)
    return RankSelector(flat=tuple(flat), dims=dims)


def split_selector(text: str) -> tuple[str, str]:
    """Split `ranks(...) rest` (or `all rest`) into the selector and the rest of the line."""
    t = text.lstrip()
    if t.startswith("ranks("):
        depth = 0
        for i, ch in enumerate(t):
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth == 0:
                    return t[:i + 1], t[i + 1:].strip()
        raise SelectorError(f"unbalanced parentheses in {text!r}")
    head, _, rest = t.partition(" ")
    if head in ("all", "*"):
        return head, rest.strip()
    raise SelectorError(f"expected a selector such as ranks(procs=0:4) or all, got {text!r}")
