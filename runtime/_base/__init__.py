"""Process-wide plumbing below every layer: the running actor's context (`context`), the
registry of upward calls (`features`), process names and exit descriptions (`process`).

Layer 1 (basics): imports nothing of runtime."""

__all__: list[str] = []
