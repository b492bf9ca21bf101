"""A host agent and its zygote never wait on each other (docs/transport.md, "The I/O thread
runs only the runtime"): the agent's requests to the zygote never block its I/O thread, so
hundreds of procs asked for at once, exiting as fast as they start, are all reported and
the agent keeps serving."""

from __future__ import annotations

import os

import pytest

from _util import wait_until
import runtime
from runtime import SupervisionError, this_host

pytestmark = pytest.mark.timeout(240)

N = 300  # the agent of 288cb1b stopped for good after about 180 such requests


def exit_at_once() -> None:
    os._exit(3)


def test_hundreds_of_procs_exiting_at_once_are_all_reported():
    host = this_host()
    pm = host.spawn_procs(per_host={"procs": N}, name="burst", bootstrap=exit_at_once)
    with pytest.raises(SupervisionError) as e:
        pm.initialized.get(timeout=180)
    assert "exit" in str(e.value) or "code 3" in str(e.value), str(e.value)[:500]
    rt = runtime.get_runtime()
    # each exit reported: no proc of the burst is left in the live table
    wait_until(lambda: not [p for p in list(rt.procs.values()) if p.mesh == "burst"],
               timeout=120, what="procs of the burst never reported", every=0.1)
    pm.stop().get(timeout=60)
    # the agent still serves: a new mesh on it starts and answers
    ok = host.spawn_procs(per_host={"procs": 2}, name="after-burst")
    try:
        ok.initialized.get(timeout=60)
        assert len(ok.procs) == 2 and all(p.pid > 0 for p in ok.procs)
    finally:
        ok.stop().get(timeout=30)
