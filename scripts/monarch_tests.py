"""Run Monarch's own test files against this runtime, with only their imports rewritten.

    python scripts/monarch_tests.py --monarch-src DIR [--files test_rdma.py ...] [--out report.md]

DIR is your own Monarch checkout (or any directory holding its `python/tests`, or that
`tests` folder itself). Each chosen file is copied into a temporary directory with its
`monarch` imports rewritten by the table below (also in the scripts it runs with `python -c`,
f-strings included; nothing else in it changes), run with
pytest one file at a time under a time limit, and counted: passed, failed, skipped (by the
test itself) and out of scope. A test is out of scope when it reaches Monarch's internals
(a name the rewrite cannot map: `monarch._src`, `_rust_bindings`, `monarch.tools`, ...),
runs on Monarch's in-process fake host, needs an RDMA NIC or a GPU, is `oss_skip` in
Monarch's own CI, or is named in OUT_OF_SCOPE. The figure is passed / (passed + failed).
docs/porting.md says how it was measured and what still fails.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent

# Monarch's actor, supervision, mesh, logging and RDMA test files.
DEFAULT_FILES = [
    "test_python_actors.py", "test_actor_error.py", "test_supervision_hierarchy.py",
    "test_concurrent_endpoints.py", "test_proc_mesh.py", "test_host_mesh.py",
    "test_actor_logging.py", "test_rdma.py", "test_rdma_action.py",
]

# The import rewrites. A public Monarch module maps to ours; a name ours lacks is stubbed.
PUBLIC_MODULES = {
    "monarch.actor": "runtime",
    "monarch.config": "runtime.config",
    "monarch.rdma": "runtime.rdma",
    "monarch.job": "runtime.job",
    "monarch.spmd": "runtime.spmd",
}
# Private Monarch modules: only the names Monarch also exports publicly (MONARCH_PUBLIC)
# are rewritten, to their public counterpart here; every other name is stubbed.
PRIVATE_MODULES = {
    "monarch._src.actor.actor_mesh": "runtime",
    "monarch._src.actor.host_mesh": "runtime",
    "monarch._src.actor.proc_mesh": "runtime",
    "monarch._src.actor.future": "runtime",
    "monarch._src.actor.endpoint": "runtime",
    "monarch._src.actor.bootstrap": "runtime",
    "monarch._src.job.job": "runtime.job",
    "monarch._src.job.process": "runtime.job",
    "monarch._rust_bindings.monarch_hyperactor.supervision": "runtime",
}
# `__all__` of monarch.actor and monarch.job (docs/monarch_public_names.txt, the list that
# docs/porting.md is checked against), Monarch's `ActorMesh` (public in its older releases),
# and the supervision error type Monarch raises to callers (`runtime.SupervisionError` here).
def _kept_public_names(*modules: str) -> frozenset:
    names, current = set(), None
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs",
                        "monarch_public_names.txt")
    with open(path) as f:
        for line in map(str.strip, f):
            if line.startswith("["):
                current = line[1:-1]
            elif line and not line.startswith("#") and ":" not in line and current in modules:
                names.add(line)
    return frozenset(names)


MONARCH_PUBLIC = _kept_public_names("monarch.actor", "monarch.job") | {"ActorMesh",
                                                                     "SupervisionError"}

# Monarch private names this runtime provides (Monarch's own examples and tests use them);
# reading any other private attribute (`hm._inner_host_mesh`) puts a test out of scope.
PRIVATE_PROVIDED = frozenset({"_from_coro", "_spawn_admin", "_explicit_response_port"})
# Tests out of scope for a reason the static rules cannot see.
OUT_OF_SCOPE = {
    "test_gil_stall": "holds the GIL through Monarch's Rust binding hold_gil_for_test",
}
# Tests too big for a small shared machine: run only with --heavy.
HEAVY = {
    "test_rdma_concurrent_2gb_writes_in_order": "holds about 20 GB at once (2 GB tensors in two "
    "procs, 6 GB of results and torch.allclose temporaries in the controller); run with --heavy",
}
# Monarch's helper modules that reach its internals: replaced by our own small version.
HELPER_SHIMS = {
    "proc_mesh_test_utils.py": (
        '"""Stand-in for Monarch\'s helper (its fixture reads the private '
        'actor_instance._children): each test stops its own meshes."""\n'
        "import pytest\n\n\n@pytest.fixture(autouse=True)\n"
        "def stop_all_proc_meshes():\n    yield\n"),
}
NOT_COPIED = {"conftest.py", "crash_recovery_plugin.py"}


def _has_name(module: str, name: str) -> bool:
    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False


def _rewrite_from(node: ast.ImportFrom, has_name: Callable[[str, str], bool]) -> tuple[list[str], dict[str, str]]:
    """The statements replacing one `from monarch... import ...`, and the names stubbed."""
    mod = node.module or ""
    target = PUBLIC_MODULES.get(mod) or PRIVATE_MODULES.get(mod)
    mapped, stubs = [], {}
    for a in node.names:
        local = a.asname or a.name
        ok = (target is not None and (mod in PUBLIC_MODULES or a.name in MONARCH_PUBLIC)
              and has_name(target, a.name))
        if ok:
            mapped.append(a.name if local == a.name else f"{a.name} as {local}")
        else:
            stubs[local] = f"{mod}.{a.name}"
    out = [f"from {target} import {', '.join(mapped)}"] if mapped else []
    out += [f"{local} = _OutOfScope({origin!r})" for local, origin in stubs.items()]
    return out, stubs


def _rewrite_import(node: ast.Import) -> tuple[list[str], dict[str, str]]:
    """The statements replacing `import monarch...`, and the names stubbed."""
    out, stubs = [], {}
    for a in node.names:
        if a.name == "monarch.actor" and a.asname is None:
            out.append("import runtime as _runtime, types as _types; "
                       "monarch = _types.SimpleNamespace(actor=_runtime)")
        elif a.name == "monarch":
            out.append(f"import runtime as {a.asname or 'monarch'}")
        elif a.name in PUBLIC_MODULES and a.asname:
            out.append(f"import {PUBLIC_MODULES[a.name]} as {a.asname}")
        elif a.name.split(".")[0] == "monarch":
            local = a.asname or "monarch"
            stubs[local] = a.name
            out.append(f"{local} = _OutOfScope({a.name!r})")
        else:
            out.append(f"import {a.name}" + (f" as {a.asname}" if a.asname else ""))
    return out, stubs


def rewrite_imports(source: str, has_name: Callable[[str, str], bool] = _has_name,
                    header: bool = True) -> tuple[str, dict[str, str]]:
    """Rewrite a Monarch test file's `monarch` imports to this runtime's, also inside string
    constants that are whole scripts (run with `python -c`); return the new source (the
    same lines, plus one header line when names are stubbed) and the stubbed names
    ({local name: Monarch's dotted name})."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits, stubs = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (
                node.module or "").split(".")[0] == "monarch":
            new, s = _rewrite_from(node, has_name)
        elif isinstance(node, ast.Import) and any(a.name.split(".")[0] == "monarch" for a in node.names):
            new, s = _rewrite_import(node)
        else:
            continue
        stubs.update(s)
        edits.append((node.lineno, node.end_lineno, node.col_offset, new or ["pass"]))
    for start, end, col, new in sorted(edits, reverse=True):
        indent = lines[start - 1][:col]
        text = indent + "; ".join(new) + "\n" + "\n" * (end - start)
        lines[start - 1:end] = [text]
    out = _rewrite_scripts("".join(lines), has_name)
    if stubs and header:  # after a leading `from __future__` import, which must come first
        head = "from _monarch_harness import _OutOfScope\n"
        fut = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
        if fut:
            i = sum(len(x) for x in out.splitlines(keepends=True)[:fut[-1].end_lineno])
            out = out[:i] + head + out[i:]
        else:
            out = head + out
    return out, stubs


def _rewrite_scripts(source: str, has_name: Callable[[str, str], bool]) -> str:
    """Rewrite the imports of string constants that parse as scripts importing monarch."""
    edits = []
    tree = ast.parse(source)
    in_fstrings = {id(c) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)
                   for c in n.values}  # parts of an f-string: _rewrite_fstring_scripts
    for node in ast.walk(tree):
        if id(node) in in_fstrings or not (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and ("import monarch" in node.value or "from monarch" in node.value)):
            continue
        try:
            ast.parse(node.value)
        except SyntaxError:
            continue
        text, stubs = rewrite_imports(node.value, has_name, header=False)
        if stubs:
            text = "from _monarch_harness import _OutOfScope; " + text
        edits.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, text))
    lines = source.splitlines(keepends=True)
    for l0, c0, l1, c1, text in sorted(edits, reverse=True):
        a = sum(len(x.encode()) for x in lines[:l0 - 1]) + c0  # ast offsets count UTF-8 bytes
        b = sum(len(x.encode()) for x in lines[:l1 - 1]) + c1
        raw = "".join(lines).encode()
        lines = (raw[:a] + repr(text).encode() + raw[b:]).decode().splitlines(keepends=True)
    return _rewrite_fstring_scripts("".join(lines), has_name)


_FROM_IMPORT = re.compile(r"from (monarch(?:\.\w+)*) import (\w+(?:[ \t]*,[ \t]*\w+)*)")


def _rewrite_fstring_scripts(source: str, has_name: Callable[[str, str], bool]) -> str:
    """Rewrite `from monarch... import NAMES` inside f-strings (a `python -c` script built
    with the address in it) when every name maps; one that would be stubbed is left as is."""
    edits = []
    for node in ast.walk(ast.parse(source)):
        seg = ast.get_source_segment(source, node) if isinstance(node, ast.JoinedStr) else None
        if not seg or "from monarch" not in seg:
            continue

        def sub(m: re.Match) -> str:
            new, stubs = _rewrite_from(ast.parse(m.group(0)).body[0], has_name)
            return m.group(0) if stubs else new[0]

        edits.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset,
                      _FROM_IMPORT.sub(sub, seg)))
    lines = source.splitlines(keepends=True)
    for l0, c0, l1, c1, text in sorted(edits, reverse=True):
        a = sum(len(x.encode()) for x in lines[:l0 - 1]) + c0  # ast offsets count UTF-8 bytes
        b = sum(len(x.encode()) for x in lines[:l1 - 1]) + c1
        raw = "".join(lines).encode()
        lines = (raw[:a] + text.encode() + raw[b:]).decode().splitlines(keepends=True)
    return "".join(lines)


def _refs(node: ast.AST, modules: frozenset[str] = frozenset()) -> set[str]:
    """Names a definition reads, leaving out type annotations and pytest.mark.parametrize
    arguments (those are judged per parameter, when collected); a private attribute read
    on anything but self, cls or an imported module (`os._exit`) counts as `._name`."""
    names: set[str] = set()

    def visit(n: ast.AST) -> None:
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "parametrize":
            return
        if (isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")
                and n.attr not in PRIVATE_PROVIDED
                and not (isinstance(n.value, ast.Name) and n.value.id in {"self", "cls", *modules})):
            names.add("." + n.attr)
        if isinstance(n, ast.Name):
            names.add(n.id)
        elif isinstance(n, ast.arg):
            names.add(n.arg)  # a fixture is named by a test's parameter
        for field, c in ast.iter_fields(n):
            if field in ("annotation", "returns"):
                continue
            for x in c if isinstance(c, list) else [c]:
                if isinstance(x, ast.AST):
                    visit(x)
    visit(node)
    return names


def scope(source: str, stubs: dict[str, str], heavy: bool = False) -> dict:
    """Which module-level definitions reach a stubbed name ({name: why}), and which tests do."""
    tree = ast.parse(source)
    defs = {n.name: n for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    modules = frozenset((a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                        if isinstance(n, ast.Import) for a in n.names) - {"monarch"}
    refs = {name: _refs(node, modules) for name, node in defs.items()}
    why = {k: f"uses {v}" for k, v in stubs.items()}
    why.update({r: f"reads Monarch's private attribute {r}" for rs in refs.values() for r in rs
                if r.startswith(".")})
    changed = True
    while changed:
        changed = False
        for name, node in defs.items():
            if name in why:
                continue
            hit = sorted(refs[name] & set(why))
            if hit:
                direct = hit[0] in stubs or hit[0].startswith(".")
                why[name] = why[hit[0]] + ("" if direct else f" (via {hit[0]})")
                changed = True
    tests = {}
    for name, node in defs.items():
        if name.startswith("test") and name in why:
            tests[name] = why[name]
        if isinstance(node, ast.ClassDef):
            for m in node.body:
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name.startswith("test"):
                    hit = sorted(_refs(m, modules) & set(why))
                    if hit:
                        tests[m.name] = why[hit[0]]
    tests.update({k: v for k, v in OUT_OF_SCOPE.items() if k in defs})
    if not heavy:
        tests.update({k: v for k, v in HEAVY.items() if k in defs})
    return {"tainted": sorted(n for n in set(why) - set(stubs) if not n.startswith(".")),
            "tests": tests}


HARNESS_MODULE = '''
class _OutOfScope:
    """A Monarch-internal name: importable and permissive, so the file loads; tests using it are out of scope."""
    def __init__(self, origin): self._origin = origin
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _OutOfScope(self._origin + "." + name)
    def __call__(self, *a, **k): return _OutOfScope(self._origin + "()")
    def __getitem__(self, k): return self
    def __mro_entries__(self, bases): return (object,)
    def __repr__(self): return f"<out of scope: {self._origin}>"
'''

CONFTEST = '''
import asyncio, inspect, json, os
import pytest
from _monarch_harness import _OutOfScope

SCOPE = json.load(open(os.path.join(os.path.dirname(__file__), "_scope.json")))


def pytest_configure(config):
    for m in ("oss_skip", "asyncio", "timeout_s"):
        config.addinivalue_line("markers", m + ": Monarch marker")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Monarch runs async tests with pytest-asyncio (asyncio_mode=auto); this does the same."""
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        args = {k: pyfuncitem.funcargs[k] for k in pyfuncitem._fixtureinfo.argnames}
        asyncio.run(pyfuncitem.obj(**args))
        return True


def _why_out(item):
    s = SCOPE.get(item.path.name, {"tests": {}, "tainted": []})
    if item.originalname in s["tests"]:
        return s["tests"][item.originalname]
    if item.get_closest_marker("oss_skip"):
        return "oss_skip in Monarch's own CI"
    cs = getattr(item, "callspec", None)
    if cs is not None:
        for v in cs.params.values():
            if isinstance(v, _OutOfScope) or getattr(v, "__name__", None) in s["tainted"]:
                return "parameter %s reaches Monarch internals (in-process fake host)" % getattr(v, "__name__", v)
        if "rdma_disable_ibverbs=False" in cs.id:
            return "needs an RDMA NIC (ibverbs)"
        if "cuda" in cs.id:
            return "needs a GPU"
    for m in item.iter_markers("skipif"):
        if "cuda" in str(m.kwargs.get("reason", "")).lower():
            return "needs a GPU"
    return None


def pytest_collection_modifyitems(items):
    for item in items:
        why = _why_out(item)
        if why:
            # first, so that it wins over the test's own skipif marks
            item.add_marker(pytest.mark.skipif(True, reason="out of scope: " + why), append=False)


def pytest_runtest_logreport(report):
    msg = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        msg = report.longrepr[2]
    elif report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        msg = crash.message if crash else str(report.longrepr)[-500:]
    with open(os.environ["MONARCH_TESTS_RESULTS"], "a") as f:
        f.write(json.dumps({"id": report.nodeid, "when": report.when,
                            "outcome": report.outcome, "msg": msg[:4000]}) + "\\n")
'''


def prepare(src: Path, files: list[str], work: Path, heavy: bool = False) -> None:
    """Copy the chosen test files and Monarch's helper modules into work, imports rewritten."""
    scopes = {}
    for p in sorted(src.glob("*.py")):
        if p.name in NOT_COPIED or (p.name.startswith("test_") and p.name not in files):
            continue
        if p.name in HELPER_SHIMS:
            (work / p.name).write_text(HELPER_SHIMS[p.name])
            continue
        text, stubs = rewrite_imports(p.read_text())
        (work / p.name).write_text(text)
        if p.name in files:
            scopes[p.name] = scope(p.read_text(), stubs, heavy)
    (work / "_monarch_harness.py").write_text(HARNESS_MODULE)
    (work / "conftest.py").write_text(CONFTEST)
    (work / "_scope.json").write_text(json.dumps(scopes, indent=1))
    (work / "pytest.ini").write_text("[pytest]\n")


def _sweep(run_id: str) -> int:
    """Kill (by pid) every process still carrying this run's marker; return how many."""
    import psutil
    n = 0
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get("MONARCH_TESTS_RUN") == run_id:
                p.kill()
                n += 1
        except (psutil.Error, OSError):
            pass
    return n


def run_file(work: Path, name: str, timeout: float, per_test: int,
             logs: Path | None = None) -> dict:
    """Run one file with pytest (its output to logs/NAME.log when logs is given); return
    its counts, failures and out-of-scope reasons."""
    results = work / f"{name}.jsonl"
    run_id = uuid.uuid4().hex
    tmp = work / "tmp"  # what the tests leave in their temporary folders goes with work
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, MONARCH_TESTS_RESULTS=str(results), MONARCH_TESTS_RUN=run_id,
               PYTHONPATH=os.pathsep.join([str(work), str(REPO)]), TMPDIR=str(tmp),
               # ca="trust_all_connections" makes this user's key: here, not in ~/.cache
               MONARCH_USER_KEY_FILE=str(work / "user-key" / "user.key"))
    cmd = [sys.executable, "-m", "pytest", name, "-q", "-rfE", "-p", "no:randomly", "-p", "no:cacheprovider",
           "-c", "pytest.ini", f"--timeout={per_test}"]
    t0 = time.monotonic()
    out = open(logs / f"{name}.log", "w") if logs else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    left = _sweep(run_id)
    if logs:
        out.close()
    outcome: dict[str, tuple[str, str]] = {}
    for line in results.read_text().splitlines() if results.exists() else []:
        r = json.loads(line)
        prev = outcome.get(r["id"], ("passed", ""))
        if r["outcome"] == "failed" and prev[0] != "failed":
            outcome[r["id"]] = ("failed", f"{r['when']}: {r['msg']}")
        elif r["outcome"] == "skipped":
            msg = r["msg"].removeprefix("Skipped: ")
            outcome[r["id"]] = ("out" if msg.startswith("out of scope: ") else "skipped", msg)
        elif r["id"] not in outcome:
            outcome[r["id"]] = prev
    counts = Counter(k for k, _ in outcome.values())
    return {"file": name, "counts": counts, "seconds": time.monotonic() - t0,
            "timed_out": timed_out, "left_processes": left,
            "failed": {i: m for i, (k, m) in outcome.items() if k == "failed"},
            "skipped": {i: m for i, (k, m) in outcome.items() if k == "skipped"},
            "out": Counter(m.removeprefix("out of scope: ") for k, m in outcome.values() if k == "out")}


def _summary(msg: str) -> str:
    """A failure in one line: its first, and for a test run in a subprocess the error it raised."""
    lines = [x.strip() for x in msg.splitlines() if x.strip()]
    if not lines:
        return ""
    first = lines[0][:300]
    if "Subprocess traceback" in msg and lines[-1] != lines[0]:
        first += " ... " + lines[-1][:300]
    return first


def report(rows: list[dict]) -> str:
    """The markdown table, totals, the figure, and what failed and why."""
    out = ["| Monarch test file | passed | failed | skipped | out of scope | s |", "|---|---|---|---|---|---|"]
    tot = Counter()
    for r in rows:
        c = r["counts"]
        tot.update(c)
        note = " (timed out)" if r["timed_out"] else ""
        out.append(f"| `{r['file']}`{note} | {c['passed']} | {c['failed']} | {c['skipped']} | {c['out']} "
                   f"| {r['seconds']:.0f} |")
    ran = tot["passed"] + tot["failed"]
    pct = 100.0 * tot["passed"] / ran if ran else 0.0
    out.append(f"| **total** | **{tot['passed']}** | **{tot['failed']}** | {tot['skipped']} | {tot['out']} | |")
    out += ["", f"**{tot['passed']} passed of {ran} in-scope tests run ({pct:.1f}%)**", "", "Failed:"]
    out += [f"- `{i}`: {_summary(m)}" for r in rows for i, m in r["failed"].items()]
    out += ["", "Skipped by the test itself:"]
    out += [f"- `{i}`: {m}"[:300] for r in rows for i, m in r["skipped"].items()]
    out += ["", "Out of scope (count, reason):"]
    reasons = Counter()
    for r in rows:
        reasons.update(r["out"])
    out += [f"- {n} x {why}" for why, n in reasons.most_common()]
    left = sum(r["left_processes"] for r in rows)
    out += ["", f"Processes left behind by the runs and killed: {left}"]
    return "\n".join(out) + "\n"


def main() -> None:
    """Parse arguments, run the files one at a time, print (and optionally write) the report."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--monarch-src", required=True, type=Path)
    ap.add_argument("--files", nargs="*", default=DEFAULT_FILES)
    ap.add_argument("--out", type=Path, help="write the report here")
    ap.add_argument("--logs", type=Path, help="a folder for each file's pytest output")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per file")
    ap.add_argument("--per-test-timeout", type=int, default=300)
    ap.add_argument("--heavy", action="store_true", help="also run HEAVY tests (memory)")
    args = ap.parse_args()
    src = args.monarch_src
    for cand in (src / "python" / "tests", src / "tests", src):
        if (cand / "test_python_actors.py").exists():
            src = cand
            break
    work = Path(tempfile.mkdtemp(prefix="monarch_tests_"))
    try:
        prepare(src, args.files, work, args.heavy)
        rows = []
        for name in args.files:
            if args.logs:
                args.logs.mkdir(parents=True, exist_ok=True)
            rows.append(run_file(work, name, args.timeout, args.per_test_timeout, args.logs))
            c = rows[-1]["counts"]
            print(f"{name}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped, "
                  f"{c['out']} out of scope ({rows[-1]['seconds']:.0f} s)", flush=True)
        text = report(rows)
        print(text)
        if args.out:
            args.out.write_text(text)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
