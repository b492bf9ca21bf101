"""The admin endpoint of a controller: a loopback, token-guarded JSON server and its client.

`serve(rt)` starts it on a daemon thread and writes a 0600 connection file;
`AdminClient.from_connection_file(path)` talks to it (the `monarch-admin` TUI does).

Layer 5 (on the core, beside actor and channel): imports `runtime._core` and the basics.
"""

from runtime.admin.client import AdminClient, AdminError
from runtime.admin.connection import (ConnectionFileError, ConnectionInfo,
                                      list_connection_files, newest_connection_file,
                                      read_connection_file, runtime_dir)
from runtime.admin.server import AdminServer, serve

__all__ = ["AdminClient", "AdminError", "AdminServer", "ConnectionFileError",
           "ConnectionInfo", "list_connection_files", "newest_connection_file",
           "read_connection_file", "runtime_dir", "serve"]
