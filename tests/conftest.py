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
    "test_architecture_map.py", "test_config.py", "test_contracts.py", "test_dap_engine.py",
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
        return
    import random

    by_file: dict = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        # The network-namespace test cluster exists once per machine: the files that use it
        # (and the one that tears it down last) move as one block, in their usual order.
        unit = CLUSTER_FILES if path.startswith("tests/multihost/") or \
            path in _OWN_CLUSTER_FILES else path
        by_file.setdefault(unit, []).append(item)
    files = list(by_file)
    random.Random(seed).shuffle(files)
    items[:] = [item for f in files for item in by_file[f]]
    config.pluginmanager.get_plugin("terminalreporter").write_line(
        f"--shuffle-files {seed}: files in the order {', '.join(files[:6])}, ...")


CLUSTER_FILES = "tests/multihost/* + tests/test_debugging_multihost.py"
_OWN_CLUSTER_FILES = {"tests/test_debugging_multihost.py"}  # starts its own cluster


def pytest_terminal_summary(terminalreporter):
    if not _detections:
        return
    tr = terminalreporter
    tr.write_sep("-", "fault detection times (measured in this run)")
    for name, s in _detections:
        tr.write_line(f"{name:<48} {s * 1000:8.1f} ms")
    os.makedirs(os.path.join(ROOT, "test-artifacts"), exist_ok=True)
    with open(os.path.join(ROOT, "test-artifacts", "fault-detection.txt"), "w") as f:
        for name, s in _detections:
            f.write(f"{name}\t{s:.4f}\n")
