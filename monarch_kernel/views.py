"""`%mesh status|stop|attach|admin` without a kernel session, as `monarch_kernel.views`:
the views' subcommands and their grammar live with the views (`monarch_widgets.views`,
which `%load_ext monarch_widgets` registers); this name stays for code that imports it."""

from __future__ import annotations

from monarch_widgets.views import Text, handle, register_magic, run

__all__ = ["Text", "handle", "run", "register_magic"]
