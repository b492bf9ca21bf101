"""Actors for tests/test_workspace_sync.py whose code does not come from the workspace."""
from __future__ import annotations

import importlib
import os
import sys

from runtime import Actor, endpoint


class Probe(Actor):
    """Imports workspace modules in its proc and reports what it finds."""

    @endpoint
    def value(self, module: str, attr: str) -> object:
        """`module.attr` as the proc imports it now (an ImportError's text if it cannot)."""
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError as e:
            return f"ImportError: {e}"

    @endpoint
    def where(self, module: str) -> tuple:
        """(pid, the module's file) in this proc."""
        mod = sys.modules.get(module) or importlib.import_module(module)
        return os.getpid(), mod.__file__
