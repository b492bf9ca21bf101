"""Monarch's `monarch.tools` names that programs import here: `tools.config.workspace`."""

__all__: list[str] = []
