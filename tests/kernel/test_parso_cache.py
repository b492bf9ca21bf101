"""A truncated pickle in parso's cache (a process stopped while jedi wrote it, or two
writers at once) must not empty Tab completion in every later session."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = """
import sys
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.completer import provisionalcompleter
if sys.argv[1] == "harden":
    from monarch_kernel.remote.parso_cache import harden
    assert harden()
sh = InteractiveShell.instance()
with provisionalcompleter():
    print(sorted(c.text for c in sh.Completer.completions("zi", 2)))
"""


def complete_zi(cache_home, mode: str) -> str:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_home), PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                       timeout=90, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.timeout(200)
def test_a_truncated_parso_pickle_is_a_cache_miss(tmp_path):
    assert "'zip'" in complete_zi(tmp_path, "harden")  # fills the cache
    pickles = list(tmp_path.rglob("*.pkl"))
    assert pickles, "jedi wrote no parso cache"
    for p in pickles:  # as a process killed mid-write leaves them
        data = p.read_bytes()
        p.write_bytes(data[:len(data) // 2])
    assert "'zip'" in complete_zi(tmp_path, "harden")
    # the broken entries were replaced by whole ones, written without leftovers
    for p in tmp_path.rglob("*"):
        assert not p.name.endswith(".tmp"), p
    rewritten = [p for p in pickles if p.exists()]
    assert rewritten
    for p in rewritten:
        with open(p, "rb") as f:
            pickle.load(f)
