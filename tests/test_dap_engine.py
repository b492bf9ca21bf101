"""The paused actor's answers to the Debugger panel, without processes: value summaries
(tensors and arrays by shape, dtype, device and a few values, never whole), expandable
children, scopes, evaluate, and stale references; a real thread paused in a RemotePdb-like
stack is not needed: a fake channel over this thread's frames stands in."""

import sys

import numpy as np
import pytest

from runtime.debugging import dap_engine
from runtime.debugging.dap_engine import answer, summarize


class _FakePdb:
    def __init__(self, frame):
        self.stack = [(frame.f_back, frame.f_back.f_lineno), (frame, frame.f_lineno)]
        self.curindex = 1
        self.curframe_locals = frame.f_locals


class _FakeChan:
    def __init__(self, frame):
        self.pdb = _FakePdb(frame)
        self.refs = {}


def _here():
    big = np.zeros((1000, 1000), dtype=np.float32)
    info = {"lr": 0.1, "tags": ["a", "b"]}
    n = 7
    return _FakeChan(sys._getframe())


def test_summaries_are_bounded():
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    text, tname = summarize(t)
    assert text == "tensor(shape=(3, 4), dtype=float32, device=cpu) [0, 1, 2, 3, 4, 5, ...]"
    assert tname == "Tensor"
    assert summarize(torch.ones(2, dtype=torch.bfloat16))[0].endswith("[1, 1]")
    assert summarize(torch.empty(2, 2, device="meta"))[0] == \
        "tensor(shape=(2, 2), dtype=float32, device=meta)"
    text, _ = summarize(np.zeros((1000, 1000)))
    assert text.startswith("ndarray(shape=(1000, 1000), dtype=float64) [0, 0") and len(text) < 120
    assert len(summarize("x" * 10000)[0]) < 200
    assert len(summarize(list(range(10000)))[0]) < 200

    class Broken:
        def __repr__(self):
            raise RuntimeError("no")

    assert summarize(Broken())[0].startswith("<Broken")  # a broken __repr__ is survived


def test_stack_scopes_variables_evaluate():
    chan = _here()
    st = answer(chan, "stackTrace", {})
    assert st["ok"] and st["body"]["frames"][0]["name"] == "_here"
    sc = answer(chan, "scopes", {"frame": 1})["body"]["scopes"]
    assert [s["name"] for s in sc] == ["Locals", "Globals"]
    vs = {v["name"]: v for v in answer(chan, "variables", {
        "ref": sc[0]["variablesReference"]})["body"]["variables"]}
    assert vs["n"] == {"name": "n", "value": "7", "type": "int", "variablesReference": 0}
    assert vs["big"]["value"].startswith("ndarray(shape=(1000, 1000), dtype=float32)")
    kids = {v["name"]: v["value"] for v in answer(chan, "variables", {
        "ref": vs["big"]["variablesReference"]})["body"]["variables"]}
    assert kids["shape"] == "(1000, 1000)" and kids["dtype"] == "float32"
    info = answer(chan, "variables", {"ref": vs["info"]["variablesReference"]})["body"]
    assert [v["name"] for v in info["variables"]] == ["lr", "tags"]
    glob = {v["name"] for v in answer(chan, "variables", {
        "ref": sc[1]["variablesReference"]})["body"]["variables"]}
    assert "_here" in glob and "np" not in glob  # modules and dunders left out
    assert answer(chan, "evaluate", {"expression": "n * 6"})["body"]["result"] == "42"
    assert answer(chan, "evaluate", {"expression": "print(n + 1)"})["body"]["result"] == "8"
    bad = answer(chan, "evaluate", {"expression": "nope"})
    assert not bad["ok"] and "NameError" in bad["message"]
    chan.refs.clear()  # the actor ran on
    stale = answer(chan, "variables", {"ref": vs["info"]["variablesReference"]})
    assert not stale["ok"] and "stale" in stale["message"]
    assert not answer(chan, "pause", {})["ok"]
    assert dap_engine.MAX_CHILDREN >= 100
