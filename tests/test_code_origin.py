"""Code keeps its origin across the wire: a class or function defined in a script's
`__main__` (or a notebook cell) travels by value, and its remote tracebacks, the remote pdb
and the no-stdin breakpoint error still name the real file and show its source lines,
whatever the installed cloudpickle writes into the code objects it pickles."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from runtime.errors import with_source_lines

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent('''
    from runtime import Actor, ActorError, endpoint, this_host


    def helper(x):
        def inner(y):
            return 1 / y
        return inner(x)


    class Origin(Actor):
        @endpoint
        def direct(self):
            raise ValueError("raised in the method")

        @endpoint
        def nested(self):
            return helper(0)

        @endpoint
        def by_lambda(self):
            f = lambda v: v["missing"]
            return f({})

        @endpoint
        def stop_here(self):
            breakpoint()
            return 1


    if __name__ == "__main__":
        procs = this_host().spawn_procs(per_host={"procs": 1}, name="origin")
        try:
            actor = procs.spawn("origin", Origin)
            for name in ["direct", "nested", "by_lambda", "stop_here"]:
                try:
                    getattr(actor, name).call_one().get(timeout=30)
                    print(f"== {name}: no error")
                except ActorError as e:
                    print(f"== {name}")
                    print(e)
        finally:
            procs.stop().get(timeout=30)
        print("== end")
''')


def section(out: str, name: str) -> str:
    return out.split(f"== {name}\n", 1)[1].split("\n== ", 1)[0]


@pytest.mark.timeout(120)
def test_script_main_tracebacks_and_breakpoints_name_the_script(tmp_path):
    script = tmp_path / "origin_script.py"
    script.write_text(SCRIPT)
    src = SCRIPT.splitlines()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
               MONARCH_DEBUG_POLICY="fail")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=100, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL)
    out = r.stdout
    assert r.returncode == 0 and "== end" in out, out + r.stderr
    assert "<dynamic-code>" not in out + r.stderr

    def frame(fn: str, code: str) -> str:
        line = next(i for i, s in enumerate(src, 1) if s.strip() == code)
        return f'  File "{script}", line {line}, in {fn}\n    {code}\n'

    direct = section(out, "direct")
    assert frame("direct", 'raise ValueError("raised in the method")') in direct
    nested = section(out, "nested")
    for fn, code in [("nested", "return helper(0)"), ("helper", "return inner(x)"),
                     ("inner", "return 1 / y")]:
        assert frame(fn, code) in nested, nested
    lam = section(out, "by_lambda")
    assert frame("by_lambda", "return f({})") in lam
    assert frame("<lambda>", 'f = lambda v: v["missing"]') in lam, lam
    stop = section(out, "stop_here")
    line = next(i for i, s in enumerate(src, 1) if s.strip() == "breakpoint()")
    assert f"BreakpointWithoutDebugger: breakpoint at {script}:{line + 1}" in stop, stop
    assert frame("stop_here", "return 1") in stop
    # the traceback ends at the user's line: no debugger machinery (bdb, pdb) below it
    assert "bdb.py" not in stop and "pdb.py" not in stop, stop


def test_with_source_lines_fills_only_missing_lines():
    lines = {("/cell/5.py", 3): "    return 1 / y\n", ("/lib/x.py", 9): "    x()\n"}
    tb = ('Traceback (most recent call last):\n'
          '  File "/lib/x.py", line 9, in f\n'
          '    already_here()\n'
          '  File "/cell/5.py", line 3, in inner\n'
          '  File "/gone.py", line 1, in g\n'
          'ZeroDivisionError: division by zero\n')
    got = with_source_lines(tb, lambda f, n: lines.get((f, n), ""))
    assert got == ('Traceback (most recent call last):\n'
                   '  File "/lib/x.py", line 9, in f\n'
                   '    already_here()\n'
                   '  File "/cell/5.py", line 3, in inner\n'
                   '    return 1 / y\n'
                   '  File "/gone.py", line 1, in g\n'
                   'ZeroDivisionError: division by zero\n')
    assert with_source_lines("") == "" and with_source_lines("no frames") == "no frames"
