"""scripts/monarch_tests.py: the import rewrite and the scope rule (pure, no processes)."""
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "monarch_tests", Path(__file__).resolve().parent.parent / "scripts" / "monarch_tests.py")
mt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mt)

OURS = {("runtime", n) for n in ("Actor", "endpoint", "this_host", "ProcMesh", "SupervisionError")}
OURS |= {("runtime.config", "configured"), ("runtime.rdma", "RDMABuffer")}


def has(module: str, name: str) -> bool:
    return (module, name) in OURS


SRC = '''from __future__ import annotations
import os
import monarch.actor
from monarch.actor import (
    Actor,
    endpoint,
    hosts_from_config,
)
from monarch.config import configured
from monarch._src.actor.host_mesh import this_host, fake_in_process_host
from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError
from monarch._rust_bindings.monarch_hyperactor.shape import Shape as S


def helper():
    return S(1)


class A(Actor):
    @endpoint
    def f(self, x: S) -> int:  # annotations do not count
        return 1


def test_plain():
    this_host()
    A


def test_internal():
    helper()


def test_fixture(helper):
    pass


def test_in_body():
    from monarch.rdma import RDMABuffer
    RDMABuffer


def test_private(hm):
    assert hm._inner_host_mesh is None


def test_not_private(hm):
    os._exit if hm._from_coro else None
'''


def test_rewrite_maps_public_names_and_stubs_the_rest():
    out, stubs = mt.rewrite_imports(SRC, has)
    lines = out.splitlines()
    assert lines[0] == "from __future__ import annotations"
    assert lines[1] == "from _monarch_harness import _OutOfScope"
    assert "import runtime as _runtime, types as _types; monarch = _types.SimpleNamespace(actor=_runtime)" in out
    assert "from runtime import Actor, endpoint; hosts_from_config = _OutOfScope('monarch.actor.hosts_from_config')" in out
    assert "from runtime.config import configured" in out
    # a private module: only what Monarch also exports publicly, and we have, is mapped
    assert "from runtime import this_host; fake_in_process_host = _OutOfScope(" in out
    assert "from runtime import SupervisionError" in out
    assert "S = _OutOfScope('monarch._rust_bindings.monarch_hyperactor.shape.Shape')" in out
    assert "    from runtime.rdma import RDMABuffer" in out  # nested imports too
    assert stubs == {"hosts_from_config": "monarch.actor.hosts_from_config",
                     "fake_in_process_host": "monarch._src.actor.host_mesh.fake_in_process_host",
                     "S": "monarch._rust_bindings.monarch_hyperactor.shape.Shape"}
    assert len(out.splitlines()) == len(SRC.splitlines()) + 1  # lines keep their numbers (+1 header)
    assert "monarch." not in out.replace("monarch = _types", "").split("_OutOfScope(")[0]
    compile(out, "x.py", "exec")


def test_scope_follows_helpers_and_fixtures_not_annotations():
    _, stubs = mt.rewrite_imports(SRC, has)
    s = mt.scope(SRC, stubs)
    assert set(s["tests"]) == {"test_internal", "test_fixture", "test_private"}
    assert s["tests"]["test_private"] == "reads Monarch's private attribute ._inner_host_mesh"
    assert "Shape" in s["tests"]["test_internal"] and "via helper" in s["tests"]["test_internal"]
    assert s["tainted"] == ["helper", "test_fixture", "test_internal", "test_private"]


def test_report_figure_is_passed_over_run():
    from collections import Counter
    row = {"file": "t.py", "counts": Counter(passed=19, failed=1, out=3), "seconds": 1.0,
           "timed_out": False, "left_processes": 0, "failed": {"t.py::x": "call: boom"},
           "skipped": {}, "out": Counter({"needs a GPU": 3})}
    text = mt.report([row])
    assert "**19 passed of 20 in-scope tests run (95.0%)**" in text
    assert "- `t.py::x`: call: boom" in text and "- 3 x needs a GPU" in text


def test_scripts_in_strings_are_rewritten_too():
    src = 'import sys\nW = """\\\nimport monarch.actor\nfrom monarch.actor import Actor, Nope\nprint(1)\n"""\n'
    out, stubs = mt.rewrite_imports(src, has)
    assert stubs == {}  # the file itself imports nothing from monarch
    ns: dict = {}
    exec(compile(out, "x.py", "exec"), ns)
    assert ns["W"] == ("from _monarch_harness import _OutOfScope; import runtime as _runtime, types as _types; "
                       "monarch = _types.SimpleNamespace(actor=_runtime)\nfrom runtime import Actor; "
                       "Nope = _OutOfScope('monarch.actor.Nope')\nprint(1)\n")


def test_imports_in_fstring_scripts_are_rewritten_when_every_name_maps():
    """Monarch starts workers with `python -c f"...from monarch.actor import X; X({addr})"`:
    the import is rewritten inside the f-string; one with a stubbed name is left as is."""
    src = ('a = 1\nW = ("import sys; from monarch.actor import Actor; "\n'
           '     f"Actor({a!r})")\nV = f"from monarch.actor import Nope; {a}"\n')
    out, stubs = mt.rewrite_imports(src, has)
    assert stubs == {}
    ns: dict = {}
    exec(compile(out, "x.py", "exec"), ns)
    assert ns["W"] == "import sys; from runtime import Actor; Actor(1)"
    assert ns["V"] == "from monarch.actor import Nope; 1"
