"""Monarch's `monarch.tools.config`: the `Workspace` of `HostMesh.sync_workspace`."""

from ...workspace import Workspace

__all__ = ["Workspace"]
