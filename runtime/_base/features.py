"""Features a lower layer calls at run time but must not import (layer 1, basics: imports
nothing of runtime).

The layers (docs/architecture.md) import only downwards. A few calls go the other way at
run time: the transport hands large buffers to the data plane (`rdma`), the core installs
the debugger and the admin endpoint, a proc installs the debugger, `ProcMesh.activate()`
and `.rref()` enter the tensor engine, `context().proc` builds a mesh, supervision's
fail-fast shuts the runtime down. Each is a named function here, provided by the root
package (`runtime/__init__.py`, which wires the layers together and imports the upper
parts only when a provided function is first called, so import costs stay as they were).
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["provide", "call"]

_provided: dict[str, Callable[..., Any]] = {}


def provide(name: str, fn: Callable[..., Any]) -> None:
    """Make `fn` the implementation of feature `name` (replacing any earlier one)."""
    if not callable(fn):
        raise TypeError(f"feature {name!r} must be callable, got {fn!r}")
    _provided[name] = fn


def call(name: str, *args: Any, **kwargs: Any) -> Any:
    """Call feature `name`; a clear error if nothing provided it (runtime not imported)."""
    try:
        fn = _provided[name]
    except KeyError:
        raise RuntimeError(f"runtime feature {name!r} is not provided: import runtime "
                           f"(the package wires its layers together)") from None
    return fn(*args, **kwargs)
