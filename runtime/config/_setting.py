"""One setting's declaration (`Setting`): its name, type, default and doc, and how its
environment text and Python values are parsed and checked; `runtime.config` declares them.

Layer 1 (basics): imports nothing of runtime.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["TYPES", "parse_seconds", "Setting"]

TYPES = ("bool", "int", "float", "str", "path")
_TRUE = ("1", "true", "yes")
_FALSE = ("0", "false", "no")
_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "sec": 1.0, "s": 1.0, "min": 60.0, "m": 60.0,
          "h": 3600.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ns|us|ms|sec|s|min|m|h)\s*")


def parse_seconds(text: str) -> float:
    """Seconds from '2.5', '500ms', '30s', '5m', '1h 30m' (Monarch's humantime durations)."""
    try:
        value = float(text)
    except ValueError:
        text = text.strip()
        pos, value = 0, 0.0
        while pos < len(text):
            m = _DURATION.match(text, pos)
            if m is None:
                raise ValueError(f"not a duration: {text!r}") from None
            value += float(m.group(1)) * _UNITS[m.group(2)]
            pos = m.end()
        if not text:
            raise ValueError("empty duration") from None
    if math.isnan(value):
        raise ValueError("nan")
    return value


def _parse_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        f = float(text)  # '2e9' was accepted before: integral floats still are
        if not f.is_integer():
            raise ValueError(f"not an integer: {text!r}") from None
        return int(f)


@dataclass(frozen=True)
class Setting:
    """One user-facing setting: how it is named, typed, defaulted, documented and read."""

    name: str
    env: str
    type: str
    default: Any
    doc: str
    live: bool = False  # read from the environment at every read, not once at import
    choices: tuple[str, ...] = ()  # str settings: the allowed (lower-case) values
    minimum: Optional[float] = None
    strict: bool = False  # the value must be > minimum (else >= minimum)
    seconds: bool = False  # float settings: also accept durations such as '500ms'
    monarch: str = ""  # Monarch's configure() name for the same thing, if any
    secret: bool = False  # never shown by repr()

    def expected(self) -> str:
        """What a valid value looks like, for error messages."""
        if self.type == "bool":
            return "one of 0/1/true/false/yes/no"
        if self.choices:
            return "one of " + ", ".join(self.choices)
        what = {"int": "an integer", "float": "a number"}.get(self.type, "a string")
        if self.minimum is not None:
            what += f" {'>' if self.strict else '>='} {self.minimum:g}"
        if self.seconds:
            what += " (seconds, or a duration such as '500ms')"
        return what

    def parse(self, raw: Optional[str]) -> Any:
        """The value of environment text `raw`; unset or blank means the default."""
        if raw is None or not raw.strip():
            return self.default
        text = raw if self.type == "path" else raw.strip()
        try:
            if self.type == "bool":
                low = text.lower()
                if low not in _TRUE + _FALSE:
                    raise ValueError(low)
                return low in _TRUE
            if self.type == "int":
                value: Any = _parse_int(text)
            elif self.type == "float":
                value = parse_seconds(text) if self.seconds else float(text)
                if math.isnan(value):
                    raise ValueError("nan")
            else:
                value = text.lower() if self.choices else text
            self._check(value)
        except ValueError:
            raise ValueError(f"{self.env}={raw!r}: expected {self.expected()}") from None
        return value

    def coerce(self, value: Any, where: str) -> Any:
        """`value` given from Python, checked and normalised (TypeError/ValueError otherwise)."""
        t = self.type
        if t == "path" and (value is None or isinstance(value, (str, os.PathLike))):
            return None if value is None else (os.fspath(value) or None)
        ok = {"bool": isinstance(value, bool),
              "int": isinstance(value, int) and not isinstance(value, bool),
              "float": isinstance(value, (int, float)) and not isinstance(value, bool)
              or (self.seconds and isinstance(value, str)),
              "str": isinstance(value, str)}.get(t, False)
        if not ok:
            want = {"path": "a path (str or os.PathLike) or None"}.get(t, t)
            if self.seconds:
                want = "a number of seconds or a duration string such as '30s'"
            raise TypeError(f"{where}: setting {self.name!r} takes {want}, "
                            f"got {type(value).__name__} {value!r}")
        try:
            if t == "float":
                value = parse_seconds(value) if isinstance(value, str) else float(value)
            elif t == "str" and self.choices:
                value = value.strip().lower()
            self._check(value)
        except ValueError:
            raise ValueError(f"{where}: {self.name}={value!r}: expected {self.expected()}") \
                from None
        return value

    def _check(self, value: Any) -> None:
        if self.choices and value not in self.choices:
            raise ValueError(value)
        if self.minimum is not None and not (value > self.minimum if self.strict
                                             else value >= self.minimum):
            raise ValueError(value)

    def to_text(self, value: Any) -> str:
        """`value` as environment text that parse() reads back to the same value."""
        if value is None:
            return ""
        if self.type == "bool":
            return "1" if value else "0"
        return repr(value) if self.type == "float" else str(value)
