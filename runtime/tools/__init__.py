"""Monarch's `monarch.tools` names that programs import here: `tools.config.workspace`."""
