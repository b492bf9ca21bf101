"""The type checker passes on all of runtime (`files` of `[tool.mypy]` in pyproject.toml:
its layers, rdma, job, tensor and the root's modules; mypy is pinned in the lock); and it
catches a misspelt state."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the cache lives with the other test artifacts (ignored by git): a re-run is fast
CACHE = ROOT / "test-artifacts" / "mypy-cache"

pytestmark = pytest.mark.timeout(300)


def mypy(*args: str) -> subprocess.CompletedProcess:
    pytest.importorskip("mypy", reason="mypy is in the `test` extra (pip install -e .[test])")
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(CACHE),
                           "--show-error-codes", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=280,
                          env={**os.environ, "MYPY_FORCE_COLOR": "0", "MYPYPATH": str(ROOT)})


def test_mypy_is_clean_on_runtime():
    out = mypy()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success" in out.stdout, out.stdout


TYPOS = '''
from runtime._core.records import ProcRecord
from runtime.debugging.registry import Session
from runtime.proc._actor_instance import ActorInstance
from runtime.transport.stream import Outbound


def typos(rec: ProcRecord, out: Outbound, a: ActorInstance, s: Session) -> None:
    rec.state = "runing"
    a.set_state("bussy")
    s.state = "stopped"
    print(out.state == "opened")
    print(rec.state == "running", out.state != "broken", s.state == "ended")
'''


def test_a_misspelt_state_is_a_type_error(tmp_path):
    """States are Literal types: assigning, passing or comparing (strict_equality) a string
    that is not one of the values is an error; the right spellings are not."""
    (tmp_path / "typos.py").write_text(TYPOS)
    out = mypy(str(tmp_path / "typos.py"))
    errors = re.findall(r"typos\.py:(\d+): error: .*\[([\w-]+)\]", out.stdout)
    assert errors == [("9", "assignment"), ("10", "arg-type"), ("11", "assignment"),
                      ("12", "comparison-overlap")], out.stdout + out.stderr


def test_an_actors_status_is_what_the_health_model_knows():
    """What a proc's heartbeats report of an actor is a value of the health model's state."""
    from typing import get_args

    from runtime.proc._actor_instance import ActorStatus
    from runtime.supervision.health import ActorState

    assert set(get_args(ActorStatus)) == {s.value for s in ActorState}


def test_a_debug_sessions_state_from_the_wire_is_checked():
    from runtime.debugging.registry import session_state

    assert [session_state(v) for v in ("paused", "running", "ended")] == [
        "paused", "running", "ended"]
    with pytest.raises(ValueError, match="not a debug session's state: 'stoped'"):
        session_state("stoped")


PAYLOADS = '''
from runtime.transport.payloads import FanoutExtra, RelayLostExtra, SpawnSpec


def payloads(inner: bytes) -> None:
    ok: FanoutExtra = {"header": inner, "procs": ["p0"], "gather": True}
    typo: FanoutExtra = {"header": inner, "proc": ["p0"]}
    wrong: FanoutExtra = {"header": inner, "procs": "p0"}
    missing: RelayLostExtra = {"relays": ["tcp://a:1"]}
    spec: SpawnSpec = {"procs": [], "owner": "tcp://c:1"}
    print(ok, typo, wrong, missing, spec)
'''


def test_a_misspelt_payload_key_is_a_type_error(tmp_path):
    """The cast tree's messages are built as TypedDicts (runtime/transport/payloads.py): a
    misspelt key, a value of the wrong type and a missing required key are errors."""
    (tmp_path / "payloads.py").write_text(PAYLOADS)
    out = mypy(str(tmp_path / "payloads.py"))
    errors = re.findall(r"payloads\.py:(\d+): error: .*\[([\w-]+)\]", out.stdout)
    assert [e[0] for e in errors] == ["7", "8", "9"], out.stdout + out.stderr
    assert {e[1] for e in errors} <= {"typeddict-unknown-key", "typeddict-item", "dict-item"}
