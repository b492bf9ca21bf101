"""The runnable examples run to completion and print what they promise."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(name: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("MONARCH_FAULT_POLICY", None)
    return subprocess.run([sys.executable, os.path.join(ROOT, "examples", name)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


@pytest.mark.timeout(150)
def test_quickstart_script():
    r = run_example("quickstart.py")
    assert r.returncode == 0, r.stderr
    assert "all : ValueMesh({'procs': 4}" in r.stdout
    assert "error: RuntimeError: this endpoint always fails" in r.stdout
    assert "still alive: " in r.stdout


@pytest.mark.timeout(150)
def test_supervision_example_recovers():
    r = run_example("supervision.py")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "killing worker pid" in r.stdout
    assert "[trainer 0] supervisor: mesh 'workers' rank(s) [1] failed: process killed by SIGKILL" \
        in r.stdout
    assert "trained 300 steps, restarts 1" in r.stdout
    assert "training finished on the respawned workers" in r.stdout


@pytest.mark.timeout(150)
def test_chaos_example_recovers_from_injected_failures():
    r = run_example("chaos.py")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "injecting actor failure: workers" in r.stderr  # a failure was injected...
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("trained ") and "injected failures handled: 0," not in last, last


@pytest.mark.timeout(150)
def test_tree_reduce_example_sums_on_the_way_up():
    r = run_example("tree_reduce.py")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "summed loss: 68.0\nsame as a plain fold: 68.0\n" in r.stdout
    assert "label counts: {'all': 16, 'even': 8, 'odd': 8}" in r.stdout


@pytest.mark.timeout(150)
def test_philosophers_example_feeds_everyone_and_stops():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "philosophers.py"),
                        "--seats", "3", "--seconds", "2"], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every philosopher ate: True" in r.stdout
    assert "Traceback" not in r.stderr


@pytest.mark.timeout(150)
def test_readme_example_prints_what_the_readme_says():
    """The README's 20 lines run as written (top-level await included), and the line its
    sliced call prints is the one the README explains."""
    import re

    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    src = re.search(r"## In 20 lines\n\n```python\n(.*?)```", readme, re.S).group(1)
    runner = ("import ast, asyncio, sys\n"
              "code = compile(sys.stdin.read(), '<README>', 'exec', "
              "flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)\n"
              "r = eval(code, {'__name__': '__main__'})\n"
              "if r is not None:\n    asyncio.run(r)\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("MONARCH_FAULT_POLICY", None)
    r = subprocess.run([sys.executable, "-c", runner], input=src, capture_output=True,
                       text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[counters 2] rank 0 is now 16" in r.stdout, r.stdout
    assert "The sliced call prints `[counters 2] rank 0 is now 16`: the prefix is the " \
           "actor's rank in\nits mesh, while `current_rank()` is its rank in the slice" in readme
