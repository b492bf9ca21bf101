"""RDMABuffer's exceptions: every failed transfer resolves its future with one of these."""

from __future__ import annotations

from ..errors import RuntimeErrorBase

__all__ = [
    "RDMAError", "RDMABufferError", "RDMASizeError", "RDMADTypeError", "RDMABufferDroppedError",
    "RDMAOwnerDiedError", "RDMATimeoutError", "RDMAAuthError", "RDMATransportError",
]


class RDMAError(RuntimeErrorBase):
    """Base class of every data-plane error."""


class RDMABufferError(RDMAError, ValueError):
    """The local tensor or memoryview cannot take part in a transfer (layout, dtype, size)."""


class RDMASizeError(RDMABufferError):
    """The local buffer and the remote range differ in size or fall outside the remote buffer."""


class RDMADTypeError(RDMABufferError, TypeError):
    """The local tensor's dtype differs from the remote buffer's (use `.view(torch.uint8)` for raw bytes)."""


class RDMABufferDroppedError(RDMAError):
    """The remote buffer was dropped by its owner (or by a `drop()` call); it is gone for good."""


class RDMAOwnerDiedError(RDMAError):
    """The process that owns the remote buffer has exited."""


class RDMATimeoutError(RDMAError, TimeoutError):
    """The transfer did not complete in time; the destination may hold partial data."""


class RDMAAuthError(RDMAError):
    """The data server and this process do not share a secret; nothing was transferred."""


class RDMATransportError(RDMAError):
    """A transport failed mid-transfer (connection reset, verbs completion error, ...)."""
