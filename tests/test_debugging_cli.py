"""`monarch-debug`: the console over the admin requests (debug.*), against real paused
actors. The admin transport is replaced by an in-process fake with the same interface
(server.register(name, handler), client.call(op, args, wait=)); when runtime.admin is
present the real endpoint is exercised too."""

import threading
import time

import pytest

import runtime
from runtime import Actor, endpoint, this_host
from runtime.debugging import admin, cli, settings
from _util import wait_until

pytestmark = pytest.mark.timeout(90)


class Worker(Actor):
    @endpoint
    def work(self, x):
        y = x + 1
        breakpoint()
        return y * 10


class FakeServer:
    def __init__(self):
        self.handlers = {}

    def register(self, name, fn):
        self.handlers[name] = fn


class FakeClient:
    """Same contract as runtime.admin.AdminClient.call (errors as '<op> failed: ...')."""

    def __init__(self, server):
        self.server = server

    def call(self, op, args=None, *, wait=None):
        try:
            return self.server.handlers[op](**(args or {}))
        except Exception as e:
            raise RuntimeError(f"{op} failed: {type(e).__name__}: {e}") from None


@pytest.fixture(scope="module")
def procs():
    p = this_host().spawn_procs(per_host={"procs": 2}, name="cliprocs")
    yield p
    runtime.shutdown()


def _wait_sessions(n):
    reg = runtime.debugging.get_registry()
    wait_until(lambda: len(reg.paused()) >= n, 20, what=reg.sessions, every=0.02)


def _call_in_thread(fut):
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("v", fut.get(30)), daemon=True)
    t.start()
    return t, box


def _client():
    server = FakeServer()
    admin.register(server)
    assert {"debug.list", "debug.attach", "debug.send", "debug.cast",
            "debug.continue", "debug.detach", "debug.wait"} <= set(server.handlers)
    return FakeClient(server)


def test_console_list_attach_step_and_continue(procs):
    settings.reset()
    m = procs.spawn("cliw", Worker)
    t, box = _call_in_thread(m.work.call(1))
    _wait_sessions(2)
    lines = iter(["list", "attach cliw 1", "p y", "n", "c", "p y * 2", "%detach",
                  (1.0, "list"), "quit"])
    out = []

    def type_line(prompt):
        out.append(prompt)
        item = next(lines)
        if isinstance(item, tuple):  # give the released actor time to report it runs
            time.sleep(item[0])
            item = item[1]
        return item

    rc = cli.repl(_client(), input_fn=type_line,
                  print_fn=lambda *a, **k: out.append(" ".join(map(str, a)) + k.get("end", "\n")))
    t.join(30)
    text = "".join(out)
    assert rc == 0
    assert "cliw rank 0 (procs=0) work() [breakpoint, paused]" in text
    assert "cliw rank 1 (procs=1) work() [breakpoint, paused]" in text
    assert "--- breakpoint: mesh 'cliw' rank 1" in text
    assert "(Pdb cliw:1) 2\n" in text  # p y
    assert "-> return y * 10" in text
    assert "--- cliw rank 1 continued ---" in text
    # the console moved on to the other paused rank; %detach lets it continue
    assert "--- breakpoint: mesh 'cliw' rank 0" in text and "(Pdb cliw:0) 4\n" in text
    assert "--- detached from cliw rank 0: it continues ---" in text
    assert "no paused actors" in text
    assert list(box["v"].values()) == [20, 20]
    m.stop().get(10)


def test_one_shot_cast_and_continue(procs):
    m = procs.spawn("clic", Worker)
    t, box = _call_in_thread(m.work.call(5))
    _wait_sessions(2)
    client = _client()
    out = []
    pr = lambda *a, **k: out.append(" ".join(map(str, a)) + k.get("end", "\n"))  # noqa: E731
    cli.repl(client, print_fn=pr, commands=["cast", "ranks(procs=1)", "p", "y", "+", "100"])
    text = "".join(out)
    assert "--- clic rank 1 ---" in text and "106\n" in text and "clic rank 0 ---" not in text
    out.clear()
    cli.repl(client, print_fn=pr, commands=["continue"])
    assert "2 paused actors continue" in "".join(out)
    t.join(30)
    assert list(box["v"].values()) == [60, 60]
    m.stop().get(10)


def test_errors_are_clear(procs):
    out = []
    pr = lambda *a, **k: out.append(" ".join(map(str, a)))  # noqa: E731
    cli.repl(_client(), print_fn=pr, commands=["attach", "7"])
    cli.repl(_client(), print_fn=pr, commands=["frobnicate"])
    assert "no paused actor with rank 7" in out[0]
    assert "unknown debugger command 'frobnicate'" in out[1]


def test_real_admin_endpoint(procs):
    adm = pytest.importorskip("runtime.admin")
    server = adm.AdminServer(runtime.get_runtime(), write_file=False)
    try:
        admin.register(server)
        with adm.AdminClient(server.address, server.token) as client:
            m = procs.spawn("clia", Worker)
            t, box = _call_in_thread(m.work.call(2))
            _wait_sessions(2)
            out = []
            pr = lambda *a, **k: out.append(" ".join(map(str, a)) + k.get("end", "\n"))  # noqa
            cli.repl(client, print_fn=pr, commands=["cast", "all", "p", "y"])
            assert "".join(out).count("3\n") == 2
            cli.repl(client, print_fn=pr, commands=["continue"])
            t.join(30)
            assert list(box["v"].values()) == [30, 30]
            m.stop().get(10)
    finally:
        server.close()


def test_monarch_debug_command_against_this_controller(procs):
    """The real `monarch-debug` process, attached through the admin connection file."""
    import os
    import subprocess
    import sys

    adm = pytest.importorskip("runtime.admin")
    srv = adm.serve(runtime.get_runtime())
    assert "debug.list" in srv.requests()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    cmd = [sys.executable, "-m", "runtime.debugging.cli", "-f", str(srv.connection_file)]
    m = procs.spawn("clip", Worker)
    t, box = _call_in_thread(m.work.call(3))
    _wait_sessions(2)
    one = subprocess.run(cmd + ["list"], capture_output=True, text=True, env=env, timeout=60)
    assert "clip rank 1 (procs=1) work() [breakpoint, paused]" in one.stdout, one.stderr
    session = subprocess.run(cmd, input="attach clip 1\np y\nc\np y * 3\n%detach\nquit\n",
                             capture_output=True, text=True, env=env, timeout=60)
    out = session.stdout
    assert "--- breakpoint: mesh 'clip' rank 1" in out, session.stderr
    assert "(Pdb clip:1) 4\n" in out and "--- clip rank 1 continued ---" in out
    assert "(Pdb clip:0) 12\n" in out and "detached from clip rank 0" in out
    t.join(30)
    assert list(box["v"].values()) == [40, 40]
    m.stop().get(10)
