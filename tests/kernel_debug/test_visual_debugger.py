"""JupyterLab's Debugger panel on remote actors, at the protocol level: the Monarch kernel
driven with the Jupyter debug messages (control channel; events on IOPub) as the panel
sends them. A breakpoint set on the cell that defines an actor stops the endpoint on 3
ranks; the paused ranks are threads `mesh[rank] @ host` with their stack, scopes,
variables (arrays summarised), evaluate, next and continue; local code still debugs with
debugpy; with the panel off, the text pdb is unchanged."""

import socket

import pytest

from kernel_debug.dap import DapDriver
from kernel_debug.driver import KernelSession, kernel_module

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(kernel_module() != "monarch_kernel",
                                 reason="the panel needs the Monarch kernel")]

ACTOR_CELL = '''\
import numpy as np
from runtime import Actor, endpoint, current_rank


class Trainer(Actor):
    @endpoint
    def step(self, x):
        w = np.arange(6, dtype=np.float32).reshape(2, 3) * x
        r = current_rank().rank
        loss = float(w.sum()) + r
        loss = loss * 2
        return loss
'''
BP_LINE = 10  # loss = float(w.sum()) + r
LOCAL_CELL = '''\
def local_fn(a):
    b = a + 1
    return b * 3
'''


@pytest.fixture(scope="module")
def session():
    k = KernelSession()
    d = DapDriver(k.kc)
    yield k, d
    try:
        if d.connected:  # a second disconnect gets no answer: it would wait out its timeout
            d.request("disconnect", {"restart": False, "terminateDebuggee": True}, timeout=10)
    except Exception:
        pass
    k.close()


def remote(tid):
    return tid >= 1 << 52


def test_kernel_advertises_the_debugger(session):
    k, _ = session
    k.kc.kernel_info()
    reply = k.kc.get_shell_msg(timeout=30)
    assert "debugger" in reply["content"]["supported_features"]
    assert reply["content"]["debugger"] is True
    from monarch_kernel.install import kernel_dict

    assert kernel_dict()["metadata"]["debugger"] is True


def test_breakpoint_in_actor_cell_stops_three_ranks(session):
    k, d = session
    d.ok("initialize", {"clientID": "test", "adapterID": "python", "pathFormat": "path",
                        "linesStartAt1": True, "columnsStartAt1": True})
    d.ok("attach", {})
    info = d.ok("debugInfo")
    assert info["isStarted"] and info["hashMethod"] == "Murmur2"
    path = d.ok("dumpCell", {"code": ACTOR_CELL})["sourcePath"]
    assert path.startswith(info["tmpFilePrefix"])
    bps = d.ok("setBreakpoints", {"source": {"path": path},
                                  "breakpoints": [{"line": BP_LINE}], "sourceModified": False})
    assert bps["breakpoints"][0]["verified"]
    d.ok("configurationDone")
    assert d.run(ACTOR_CELL)["status"] == "ok"
    # a mesh spawned after the breakpoint was set; the call waits in the cell
    start = len(d.events)
    cell = d.execute('from runtime import this_host\n'
                     'procs = this_host().spawn_procs(per_host={"procs": 3}, name="vprocs")\n'
                     'trainers = procs.spawn("trainers", Trainer)\n'
                     'print("losses", sorted(trainers.step.call(2).get().values()))')
    ev = d.stopped(start, timeout=60)["body"]
    assert remote(ev["threadId"]) and ev["reason"] == "breakpoint" and \
        not ev["allThreadsStopped"]
    # all three ranks are listed as threads (the others queue behind the focused one)
    for _ in range(100):
        threads = [t for t in d.ok("threads")["threads"] if remote(t["id"])]
        if len(threads) == 3:
            break
    host = socket.gethostname()
    assert sorted(t["name"] for t in threads) == [f"trainers[{i}] @ {host}" for i in range(3)]
    assert d.ok("debugInfo")["stoppedThreads"][0] == ev["threadId"]
    seen = {}
    tid = ev["threadId"]
    for n in range(3):
        frames = d.ok("stackTrace", {"threadId": tid})["stackFrames"]
        top = frames[0]
        assert top["source"]["path"] == path and top["line"] == BP_LINE, frames
        assert top["name"].startswith("step · trainers[")
        rank = int(top["name"].split("[")[1].split("]")[0])
        scopes = d.ok("scopes", {"frameId": top["id"]})["scopes"]
        assert [s["name"] for s in scopes] == ["Locals", "Globals"]
        vs = {v["name"]: v for v in d.ok(
            "variables", {"variablesReference": scopes[0]["variablesReference"]})["variables"]}
        assert vs["x"]["value"] == "2" and vs["r"]["value"] == str(rank)
        assert vs["w"]["value"].startswith("ndarray(shape=(2, 3), dtype=float32) [0, 2, 4")
        kids = {v["name"]: v["value"] for v in d.ok(
            "variables", {"variablesReference": vs["w"]["variablesReference"]})["variables"]}
        assert kids["shape"] == "(2, 3)" and kids["dtype"] == "float32"
        rich = d.ok("richInspectVariables", {"variableName": "w", "frameId": top["id"]})
        assert rich["data"]["text/plain"].startswith("ndarray(shape=(2, 3)")
        assert d.ok("evaluate", {"expression": "float(w.sum()) + r", "frameId": top["id"],
                                 "context": "repl"})["result"] == str(30.0 + rank)
        if n == 0:  # step one line, then read the new local
            mark = len(d.events)
            d.ok("next", {"threadId": tid})
            e = d.stopped(mark)["body"]
            assert e["threadId"] == tid and e["reason"] == "step"
            top = d.ok("stackTrace", {"threadId": tid})["stackFrames"][0]
            assert top["line"] == BP_LINE + 1
            assert d.ok("evaluate", {"expression": "loss", "frameId": top["id"]})[
                "result"] == str(30.0 + rank)
        seen[rank] = tid
        mark = len(d.events)
        assert d.ok("continue", {"threadId": tid})["allThreadsContinued"] is False
        d.wait_event(lambda e: e.get("event") == "continued" and
                     e["body"]["threadId"] == tid, start=mark)
        if n < 2:
            tid = d.stopped(mark)["body"]["threadId"]
            assert tid not in seen.values()
    assert sorted(seen) == [0, 1, 2]
    assert d.wait_reply(cell)["status"] == "ok"
    assert "losses [60.0, 62.0, 64.0]" in d.stream
    assert [t for t in d.ok("threads")["threads"] if remote(t["id"])] == []


def test_breakpoint_moved_and_cleared_live(session):
    k, d = session
    path = d.ok("dumpCell", {"code": ACTOR_CELL})["sourcePath"]
    d.ok("setBreakpoints", {"source": {"path": path}, "breakpoints": [{"line": BP_LINE + 1}]})
    start = len(d.events)
    cell = d.execute("print('one', trainers.slice(procs=1).step.call_one(1).get())")
    tid = d.stopped(start, timeout=60)["body"]["threadId"]
    assert d.ok("stackTrace", {"threadId": tid})["stackFrames"][0]["line"] == BP_LINE + 1
    d.ok("setBreakpoints", {"source": {"path": path}, "breakpoints": []})
    d.ok("continue", {"threadId": tid})
    assert d.wait_reply(cell)["status"] == "ok" and "one 30.0" in d.stream
    assert d.run("print('two', trainers.slice(procs=1).step.call_one(1).get())")[
        "status"] == "ok"
    assert "two 30.0" in d.stream


def test_local_code_still_debugs_with_debugpy(session):
    k, d = session
    path = d.ok("dumpCell", {"code": LOCAL_CELL})["sourcePath"]
    d.ok("setBreakpoints", {"source": {"path": path}, "breakpoints": [{"line": 2}]})
    assert d.run(LOCAL_CELL)["status"] == "ok"
    start = len(d.events)
    cell = d.execute("print('local', local_fn(4))")
    ev = d.stopped(start, timeout=60)["body"]
    assert not remote(ev["threadId"])
    top = d.ok("stackTrace", {"threadId": ev["threadId"]})["stackFrames"][0]
    assert top["source"]["path"] == path and top["line"] == 2
    scopes = d.ok("scopes", {"frameId": top["id"]})["scopes"]
    vs = {v["name"]: v["value"] for v in d.ok(
        "variables", {"variablesReference": scopes[0]["variablesReference"]})["variables"]}
    assert vs["a"] == "4"
    d.ok("setBreakpoints", {"source": {"path": path}, "breakpoints": []})
    d.ok("continue", {"threadId": ev["threadId"]})
    assert d.wait_reply(cell)["status"] == "ok" and "local 15" in d.stream


STEP_CELL = """\
class T3(Actor):
    @endpoint
    def f(self, x):
        breakpoint()
        y = helper(x)
        return y


def helper(v):
    w = v * 3
    return w
"""


def test_breakpoint_call_goes_to_the_panel_with_step_in_and_out(session):
    k, d = session
    assert d.run(STEP_CELL)["status"] == "ok"
    start = len(d.events)
    cell = d.execute("t3 = procs.slice(procs=0).spawn('t3', T3)\nprint('t3', t3.f.call_one(4).get())")
    tid = d.stopped(start, timeout=60)["body"]["threadId"]  # breakpoint(): the panel, no prompt
    top = d.ok("stackTrace", {"threadId": tid})["stackFrames"][0]
    assert top["line"] == 5 and top["name"].startswith("f · t3[0]")
    mark = len(d.events)
    d.ok("stepIn", {"threadId": tid})  # into helper()
    d.stopped(mark)
    for _ in range(2):  # the def line (pdb's --Call--), then w = v * 3
        mark = len(d.events)
        d.ok("next", {"threadId": tid})
        d.stopped(mark)
    frames = d.ok("stackTrace", {"threadId": tid})["stackFrames"]
    assert [f["name"].split(" ")[0] for f in frames[:2]] == ["helper", "f"]
    assert frames[0]["line"] == 11
    assert d.ok("evaluate", {"expression": "w", "frameId": frames[0]["id"]})["result"] == "12"
    assert d.ok("evaluate", {"expression": "x", "frameId": frames[1]["id"]})["result"] == "4"
    mark = len(d.events)
    d.ok("stepOut", {"threadId": tid})
    d.stopped(mark)
    top = d.ok("stackTrace", {"threadId": tid})["stackFrames"][0]
    assert top["name"].startswith("f · ") and top["line"] == 6  # after the call
    assert d.ok("evaluate", {"expression": "y", "frameId": top["id"]})["result"] == "12"
    r = d.ok("evaluate", {"expression": "%ranks", "frameId": top["id"]})["result"]
    assert r.startswith("t3[0] @ ")
    d.ok("continue", {"threadId": tid})
    assert d.wait_reply(cell)["status"] == "ok" and "t3 12" in d.stream


def test_pause_on_exceptions_applies_to_remote_endpoints(session):
    k, d = session
    d.ok("setExceptionBreakpoints", {"filters": ["uncaught"]})
    assert d.run("class T4(Actor):\n    @endpoint\n    def boom(self, x):\n"
                 "        secret = x * 3\n        raise ValueError(f'bad {x}')\n\n\n"
                 "t4 = procs.slice(procs=1).spawn('t4', T4)")["status"] == "ok"
    start = len(d.events)
    cell = d.execute("t4.boom.call_one(5).get()")
    ev = d.stopped(start, timeout=60)["body"]
    assert ev["reason"] == "exception" and remote(ev["threadId"])
    top = d.ok("stackTrace", {"threadId": ev["threadId"]})["stackFrames"][0]
    assert top["name"].startswith("boom · t4[0]") and top["line"] == 5
    assert d.ok("evaluate", {"expression": "secret", "frameId": top["id"]})["result"] == "15"
    d.ok("continue", {"threadId": ev["threadId"]})
    reply = d.wait_reply(cell)
    assert reply["status"] == "error" and "bad 5" in reply["evalue"]
    d.ok("setExceptionBreakpoints", {"filters": []})


def test_panel_off_gives_breakpoint_back_to_the_text_pdb(session):
    k, d = session
    d.ok("disconnect", {"restart": False, "terminateDebuggee": False})
    assert d.run("from runtime.debugging import line_breakpoints\n"
                 "print('table', line_breakpoints())")["status"] == "ok"
    assert "table {}" in d.stream
    # breakpoint() now opens the text prompt in the cell (stdin allowed), as without panel
    r = k.run("class T2(Actor):\n    @endpoint\n    def f(self, x):\n        breakpoint()\n"
              "        return x + 1\n"
              "t2 = procs.slice(procs=0).spawn('t2', T2)\nt2.f.call_one(5).get()",
              ["p x", "c"])
    assert r.ok, r.transcript
    assert "(Pdb t2:0) p x\n5\n" in r.transcript and r.results == ["6"]
