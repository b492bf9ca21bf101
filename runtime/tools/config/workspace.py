"""Monarch's `monarch.tools.config.workspace`: `Workspace(dirs=[...])` (runtime/workspace.py)."""

from ...workspace import Workspace

__all__ = ["Workspace"]
