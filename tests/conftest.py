"""Shared fixtures: a fault policy that never exits pytest, and a check that tests leave
no process of ours behind."""

from __future__ import annotations

import functools
import os
import sys

os.environ.setdefault("MONARCH_FAULT_POLICY", "raise")
# admin connection files of test controllers go to a throwaway directory, not ~/.local
import atexit  # noqa: E402
import glob  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

if "MONARCH_RUNTIME_DIR" not in os.environ:
    os.environ["MONARCH_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="monarch-test-rt-")
    atexit.register(shutil.rmtree, os.environ["MONARCH_RUNTIME_DIR"], True)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # a parallel run (scripts/test.sh: pytest-xdist): each worker its own runtime root, as
    # the tests count and sweep what is under it (tests/test_soak.py, tests/test_rundir.py)
    os.environ["MONARCH_RUNTIME_DIR"] = os.path.join(os.environ["MONARCH_RUNTIME_DIR"],
                                                     os.environ["PYTEST_XDIST_WORKER"])
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import psutil  # noqa: E402
import pytest  # noqa: E402


def _our_children() -> list[psutil.Process]:
    try:
        return [p for p in psutil.Process().children(recursive=True)
                if p.status() != psutil.STATUS_ZOMBIE]
    except psutil.Error:
        return []


@pytest.fixture(scope="session", autouse=True)
def no_orphans_at_end():
    """After the whole session, no process started by the tests may survive."""
    cells_before = set(glob.glob(os.path.join(tempfile.gettempdir(), "ipykernel_*")))
    yield
    # ipykernel's copies of debugged cells, of kernels the tests killed (a kernel that
    # exits removes its own: monarch_kernel/kernel.py)
    for d in set(glob.glob(os.path.join(tempfile.gettempdir(), "ipykernel_*"))) - cells_before:
        pid = d.rsplit("_", 1)[-1]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(d, ignore_errors=True)
    import runtime

    runtime.shutdown(timeout=3.0)
    left = []
    for _ in range(50):
        left = _our_children()
        if not left:
            break
        psutil.wait_procs(left, timeout=0.1)
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    # ipc directories of test controllers killed under a long MONARCH_RUNTIME_DIR went to
    # the short socket root (runtime/rundir.py): remove those whose creator is gone
    from runtime import rundir

    rundir.sweep(rundir.short_root())
    try:
        rundir.short_root().rmdir()  # only if empty
    except OSError:
        pass
    assert not left, f"processes left running after the tests: {[(p.pid, p.name()) for p in left]}"


_detections: list[tuple[str, float]] = []


@pytest.fixture
def failures(monkeypatch):
    """The failures that reach `runtime.unhandled_fault_hook` during the test, recorded
    instead of the root's policy (the test provokes them on purpose)."""
    import runtime

    seen: list = []
    monkeypatch.setattr(runtime, "unhandled_fault_hook", seen.append)
    return seen


@pytest.fixture(scope="module")
def runtime_ends_with_the_module():
    """For a module whose tests open gateway links: a link lives as long as this process's
    runtime (`hosts.shutdown()` keeps it), and while one is open an RDMA read of another
    host's buffer is refused as crossing a gateway, in whichever file runs next in this
    process. The runtime ends with the module; the next test starts a fresh one."""
    yield
    import runtime

    runtime.shutdown()


@pytest.fixture
def record_detection():
    """Record how long a fault took to be detected; printed at the end of the run."""
    def rec(name: str, seconds: float) -> None:
        _detections.append((name, seconds))
    return rec


def pytest_addoption(parser):
    parser.addoption("--shuffle-files", metavar="SEED", default=None,
                     help="run the test files in an order shuffled with SEED (each file's "
                          "tests keep their order): finds state one file leaves to another")


#: test files that start no process: `pytest -m pure` runs them (seconds); the
#: `pure_starts_nothing` fixture fails a test marked pure that starts one
PURE_FILES = frozenset({
    "test_architecture_map.py", "test_clocks.py", "test_config.py", "test_contracts.py",
    "test_dap_engine.py",
    "test_debugging_pure.py", "test_log_aggregation.py", "test_malformed_input.py",
    "test_monarch_future.py", "test_porting_table.py", "test_rdma_protocol.py",
    "test_shapes.py", "test_stream.py", "test_tensor_groups.py", "test_transport.py",
    "test_widgets_state.py", "kernel/test_args.py", "kernel/test_completion_pure.py",
    "kernel/test_pure.py",
})
_DIR_MARKS = {"kernel": "kernel", "kernel_debug": "kernel", "browser": "browser",
              "multihost": "multihost"}


@functools.lru_cache(maxsize=None)
def _kinds(path: str) -> tuple[str, ...]:
    """The markers of the tests in one file: `pure` or `procs`, and by where it lives and
    its name `kernel`, `browser`, `multihost`, `gpu`."""
    rel = os.path.relpath(path, os.path.join(ROOT, "tests"))
    kinds = ["pure" if rel in PURE_FILES else "procs"]
    top = rel.split(os.sep)[0]
    if top in _DIR_MARKS:
        kinds.append(_DIR_MARKS[top])
    if "cuda" in rel or "gpu" in rel:
        kinds.append("gpu")
    return tuple(kinds)


@pytest.fixture(autouse=True)
def pure_starts_nothing(request):
    """A test marked `pure` starts no process (checked: its children before and after)."""
    if request.node.get_closest_marker("pure") is None:
        yield
        return
    before = {p.pid for p in _our_children()}
    yield
    new = [p for p in _our_children() if p.pid not in before]
    assert not new, f"a pure test started processes: {[(p.pid, p.name()) for p in new]}"


def pytest_collection_modifyitems(config, items):
    for item in items:
        for mark in _kinds(str(item.path)):
            item.add_marker(mark)
    seed = config.getoption("--shuffle-files")
    if seed is None:
        if hasattr(config, "workerinput"):  # a worker of a parallel run: see _LONG_FIRST
            rank = {u: i for i, u in enumerate(_LONG_FIRST)}
            items.sort(key=lambda item: rank.get(unit_of(item.nodeid), len(rank)))
        return
    import random

    by_file: dict = {}
    for item in items:
        by_file.setdefault(unit_of(item.nodeid), []).append(item)
    files = list(by_file)
    random.Random(seed).shuffle(files)
    items[:] = [item for f in files for item in by_file[f]]
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"--shuffle-files {seed}: files in the order {', '.join(files[:6])}, ...")


CLUSTER_FILES = "tests/multihost/* + tests/test_debugging_multihost.py"
_OWN_CLUSTER_FILES = {"tests/test_debugging_multihost.py"}  # starts its own cluster


def unit_of(nodeid: str) -> str:
    """The unit a test moves in (shuffled, or handed to a worker of a parallel run): its
    file. The network-namespace test cluster exists once per machine: the files that use it
    (tests/multihost/, whose fixture tears it down after the last, then one that starts its
    own) are one unit, in their usual order."""
    path = nodeid.split("::")[0]
    if path.startswith("tests/multihost/") or path in _OWN_CLUSTER_FILES:
        return CLUSTER_FILES
    return path


#: In a parallel run (`pytest -n 3`, scripts/test.sh) each unit goes whole to one worker
#: (its module fixtures start once), the longest first so that none is left for the end
#: while the other workers idle; the other units (none over 20 s) follow in their usual
#: order. Seconds of one unit in a `-n 3` run on the 2-core machine (the sum of all units
#: was 1,125 s there: 375 s a worker).
_LONG_FIRST = (
    CLUSTER_FILES,                       # 204 s
    "tests/kernel/test_notebooks.py",    # 78 s
    "tests/test_soak.py",                # 68 s
    "tests/test_attach_loopback.py",     # 49 s
    "tests/test_cast_tree.py",           # 39 s
    "tests/test_rdma.py",                # 32 s
    "tests/test_cli.py",                 # 27 s
    "tests/kernel/test_first_day.py",    # 24 s
    "tests/faults/test_faults.py",       # 21 s
    "tests/browser/test_kept_restart_browser.py",  # 21 s
    "tests/test_agent_zygote.py",        # 21 s
    "tests/kernel/test_extension.py",    # 20 s
    "tests/browser/test_dashboard_browser.py",  # 20 s
    "tests/browser/test_visual_debugger_browser.py",  # 19 s
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist hands each worker whole units (`unit_of`), in collection order (unless
    another `--dist` than the default was asked for)."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False  # keep _LONG_FIRST's order
    return UnitScheduling(config, log)


#: sections of the summary that workers of a parallel run measured ({title: lines}): the
#: multihost cluster's (tests/multihost/conftest.py prints it itself in a serial run)
_worker_sections: dict[str, list[str]] = {}


def pytest_sessionfinish(session):
    out = getattr(session.config, "workeroutput", None)
    if out is not None:  # a worker of a parallel run: its controller prints the summary
        out["monarch_detections"] = [list(d) for d in _detections]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """A worker of a parallel run ended: keep what it measured for the summary."""
    out = getattr(node, "workeroutput", None) or {}
    _detections.extend((name, s) for name, s in out.get("monarch_detections", ()))
    for title, lines in out.get("monarch_sections", {}).items():
        _worker_sections.setdefault(title, []).extend(lines)


def pytest_terminal_summary(terminalreporter):
    tr = terminalreporter
    for title, lines in _worker_sections.items():
        tr.section(title)
        for line in lines:
            tr.write_line(line)
    if not _detections:
        return
    tr.write_sep("-", "fault detection times (measured in this run)")
    for name, s in _detections:
        tr.write_line(f"{name:<48} {s * 1000:8.1f} ms")
    os.makedirs(os.path.join(ROOT, "test-artifacts"), exist_ok=True)
    with open(os.path.join(ROOT, "test-artifacts", "fault-detection.txt"), "w") as f:
        for name, s in _detections:
            f.write(f"{name}\t{s:.4f}\n")
