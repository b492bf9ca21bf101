"""The code of the kernel that runs on procs: a `%%mesh` cell's runner actor (`cell_runner`),
how a cell executes in a proc's namespace (`cell_exec`), completion and inspection against
that namespace (`complete`), and the hardening of parso's cache that both sides share
(`parso_cache`).

Imports runtime's public API and nothing else of monarch_kernel (the
`kernel-remote-standalone` contract in pyproject.toml): a proc never loads the kernel side.
"""

__all__: list[str] = []
