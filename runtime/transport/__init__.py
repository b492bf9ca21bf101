"""Transport: sockets, framing, serialization and authentication."""
