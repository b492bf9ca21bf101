"""The data plane: RDMABuffer and its transports (ibverbs, same-host process_vm, TCP data sockets).

Bulk bytes never travel over control messages: each process that exports a buffer runs a
small data server on its own thread and sockets.

Layer 3 (the data plane): imports the basics and `runtime.transport` (its data sockets'
accept loop) only. The transport, below it, reaches it through `runtime._base.features`
("rdma.buffer", "rdma.read_ipc", "rdma.close_ipc", wired in `runtime/__init__.py`).
"""

from .buffer import (RDMAAction, RDMABuffer, RDMAOwner, get_rdma_backend, is_ibverbs_available,
                     is_rdma_available)
from .errors import (RDMAAuthError, RDMABufferDroppedError, RDMABufferError, RDMADTypeError,
                     RDMAError, RDMAOwnerDiedError, RDMASizeError, RDMATimeoutError,
                     RDMATransportError)


__all__ = [
    "RDMAAction", "RDMABuffer", "RDMAOwner", "get_rdma_backend", "is_ibverbs_available",
    "is_rdma_available", "RDMAError",
    "RDMABufferError", "RDMASizeError", "RDMADTypeError", "RDMABufferDroppedError",
    "RDMAOwnerDiedError", "RDMATimeoutError", "RDMAAuthError", "RDMATransportError",
]
