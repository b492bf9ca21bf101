"""Transport: sockets, framing, serialization and authentication.

Layer 2 (the wire): imports only the basics; it knows nothing of actors, and hands large
and CUDA message parts to the data plane (`runtime.rdma`, above it) through `runtime._base.features`.
"""

__all__: list[str] = []
