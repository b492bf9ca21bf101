"""`%mesh chaos` in a plain IPython shell (in this process): random procs of the named mesh
are SIGKILLed at an interval while calls go on, one line per kill, every kill reported as a
failure; a mesh the user did not name is refused."""

from __future__ import annotations

import re
import time

import pytest
from IPython.core.error import UsageError
from _kernel_helpers import ipython_with_extension
from IPython.utils.capture import capture_output

import runtime
from _util import wait_until

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def ip():
    with ipython_with_extension() as shell:
        yield shell


def test_chaos_kills_under_calls_and_every_kill_is_reported(ip, monkeypatch, tmp_path):
    failures: list = []
    monkeypatch.setattr(runtime, "unhandled_fault_hook", failures.append)
    ip.user_ns["h"] = runtime.this_host()
    ip.run_line_magic("mesh", "alloc cp --hosts h --per-host procs=4 --no-progress")
    ip.user_ns["d"] = str(tmp_path)  # Logged's files: pytest's tmp_path, not left in /tmp
    ip.run_cell("from _chaos import Logged")
    ip.run_line_magic("mesh", "spawn cp Logged --as w d")
    w = ip.user_ns["w"]
    w.initialized.get(timeout=30)
    answered, failed = 0, 0
    with capture_output() as cap:
        ip.run_line_magic("mesh", "chaos cp --kill-every 0.5s --for 3s")
        deadline = time.monotonic() + 20
        while "chaos ended" not in cap.stdout and time.monotonic() < deadline:
            for r in range(4):  # the notebook keeps working: calls to every rank
                try:
                    w.slice(procs=r).step.call_one(0, r).get(timeout=15)
                    answered += 1
                except runtime.SupervisionError:
                    failed += 1
    out = cap.stdout
    assert "killing a random proc of 'cp' every 0.5 s for 3 s" in out, out
    killed = [int(r) for r in re.findall(r"killed rank (\d+) \(host .*, pid \d+\) with SIGKILL",
                                         out)]
    assert len(killed) >= 2 and len(set(killed)) == len(killed), out
    assert re.search(r"chaos ended \((--for reached|no live proc left)\): "
                     rf"{len(killed)} proc\(s\) killed", out), out
    assert answered > 0 and failed > 0, (answered, failed)
    # every kill reported: at the root, and to a call on the killed rank
    wait_until(lambda: {r for f in failures if f.mesh == "w" for r in f.ranks} >= set(killed),
               timeout=15, what=f"failures of ranks {killed}: {[str(f) for f in failures]}")
    for f in failures:
        assert f.signal == 9, str(f)
    for r in killed:
        with pytest.raises(runtime.SupervisionError, match="SIGKILL"):
            w.slice(procs=r).step.call_one(0, -1).get(timeout=15)
    for r in set(range(4)) - set(killed):  # ranks it spared still answer
        assert w.slice(procs=r).step.call_one(0, r).get(timeout=15)[:2] == (0, r)
    ip.run_line_magic("mesh", "stop cp")


def test_chaos_refuses_what_the_user_did_not_name(ip):
    ip.user_ns["h"] = runtime.this_host()
    with pytest.raises(UsageError, match="no live proc mesh 'nosuch'"):
        ip.run_line_magic("mesh", "chaos nosuch --kill-every 1s")
    ip.user_ns["x"] = 3
    with pytest.raises(UsageError, match="not a ProcMesh or ActorMesh"):
        ip.run_line_magic("mesh", "chaos x --kill-every 1s")
    with pytest.raises(UsageError, match="--kill-every"):
        ip.run_line_magic("mesh", "chaos h")
    ip.run_line_magic("mesh", "alloc cq --hosts h --per-host procs=1 --no-progress")
    with capture_output() as cap:
        ip.run_line_magic("mesh", "chaos cq --kill-every 30s")
        with pytest.raises(UsageError, match="already running on 'cq'"):
            ip.run_line_magic("mesh", "chaos cq --kill-every 1s")
        ip.run_line_magic("mesh", "chaos cq --stop")
    assert "chaos ended (stopped): 0 proc(s) killed" in cap.stdout, cap.stdout
    ip.run_line_magic("mesh", "stop cq")
