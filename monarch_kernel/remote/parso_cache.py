"""Make parso's on-disk cache safe to share between processes.

jedi (behind IPython's Tab completion) keeps parsed modules as pickles under
`~/.cache/parso`. parso writes each pickle in place and reads a half-written or truncated
one as an `EOFError` that empties IPython's completions for good, in every later session of
the same environment. With a notebook's kernel and the procs of a `%%mesh` cell completing at
once, and procs stopped at any moment, that happens. `harden()` makes a broken pickle a
cache miss (and removes it) and writes pickles atomically (a temporary file, then a rename).
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
from typing import Any

__all__ = ["harden"]

log = logging.getLogger("monarch_kernel")
_lock = threading.Lock()
_done = False


def harden() -> bool:
    """Patch parso's cache once per process; False when parso (or the functions this relies
    on, in parso 0.8) is not there, in which case nothing changes."""
    global _done
    with _lock:
        if _done:
            return True
        try:
            from parso import cache
        except ImportError:
            return False
        load = getattr(cache, "_load_from_file_system", None)
        save = getattr(cache, "_save_to_file_system", None)
        hashed = getattr(cache, "_get_hashed_path", None)
        if load is None or save is None or hashed is None:
            return False

        def tolerant_load(hashed_grammar: Any, path: Any, p_time: Any,
                          cache_path: Any = None) -> Any:
            try:
                return load(hashed_grammar, path, p_time, cache_path=cache_path)
            except Exception as e:  # noqa: BLE001 - truncated or foreign pickle: a miss
                bad = hashed(hashed_grammar, path, cache_path=cache_path)
                log.debug("parso cache entry %s unreadable (%s): removed", bad, e)
                try:
                    os.remove(bad)
                except OSError:
                    pass
                return None

        def atomic_save(hashed_grammar: Any, path: Any, item: Any,
                        cache_path: Any = None) -> None:
            final = hashed(hashed_grammar, path, cache_path=cache_path)
            tmp = f"{final}.{os.getpid()}.{threading.get_ident()}.tmp"
            try:
                with open(tmp, "wb") as f:
                    pickle.dump(item, f, pickle.HIGHEST_PROTOCOL)
                os.replace(tmp, final)
            except BaseException:
                try:
                    os.remove(tmp)
                except OSError:
                    pass
                raise

        cache._load_from_file_system = tolerant_load
        cache._save_to_file_system = atomic_save
        _done = True
        return True
