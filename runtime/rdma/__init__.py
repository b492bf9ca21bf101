"""The data plane: RDMABuffer and its transports (ibverbs, same-host process_vm, TCP data sockets).

Bulk bytes never travel over control messages: each process that exports a buffer runs a
small data server on its own thread and sockets."""

from .buffer import RDMAAction, RDMABuffer, RDMAOwner, get_rdma_backend, is_rdma_available
from .errors import (RDMAAuthError, RDMABufferDroppedError, RDMABufferError, RDMADTypeError,
                     RDMAError, RDMAOwnerDiedError, RDMASizeError, RDMATimeoutError,
                     RDMATransportError)

__all__ = [
    "RDMAAction", "RDMABuffer", "RDMAOwner", "get_rdma_backend", "is_rdma_available", "RDMAError",
    "RDMABufferError", "RDMASizeError", "RDMADTypeError", "RDMABufferDroppedError",
    "RDMAOwnerDiedError", "RDMATimeoutError", "RDMAAuthError", "RDMATransportError",
]
