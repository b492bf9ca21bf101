"""The data plane: RDMABuffer and its transports (ibverbs, same-host process_vm, TCP data sockets).

Bulk bytes never travel over control messages: each process that exports a buffer runs a
small data server on its own thread and sockets.

Layer 3 (the data plane): imports the basics and `runtime.transport` (its data sockets'
accept loop) only. The transport, below it, reaches it through `runtime._base.features`
("rdma.buffer", "rdma.read_ipc", "rdma.close_ipc", wired in `runtime/__init__.py`).
"""

from typing import Any

from .buffer import (RDMAAction, RDMABuffer, RDMAOwner, get_rdma_backend, is_ibverbs_available,
                     is_rdma_available)
from .errors import (RDMAAuthError, RDMABufferDroppedError, RDMABufferError, RDMADTypeError,
                     RDMAError, RDMAOwnerDiedError, RDMASizeError, RDMATimeoutError,
                     RDMATransportError)


def _read_ipc(buf: RDMABuffer, out: Any, timeout: float) -> None:
    """Pull a CUDA-IPC exported buffer into the tensor `out` (runtime.transport.cuda_tensors)."""
    from . import client
    from .memory import span_of

    client.transfer(buf._h, span_of(out, what="received CUDA tensor", need_writable=True),
                    0, False, timeout)


def _close_ipc(buf: RDMABuffer) -> None:
    """Close our mapping of a one-shot CUDA-IPC buffer (runtime.transport.cuda_tensors)."""
    from . import client

    client.close_ipc(buf._h)


__all__ = [
    "RDMAAction", "RDMABuffer", "RDMAOwner", "get_rdma_backend", "is_ibverbs_available",
    "is_rdma_available", "RDMAError",
    "RDMABufferError", "RDMASizeError", "RDMADTypeError", "RDMABufferDroppedError",
    "RDMAOwnerDiedError", "RDMATimeoutError", "RDMAAuthError", "RDMATransportError",
]
