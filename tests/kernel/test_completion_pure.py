"""The pure parts of mesh-aware completion: splitting a %%mesh cell, completing and
inspecting against a namespace (what a proc's CellCompleter runs), no procs needed."""

from __future__ import annotations

from monarch_kernel.completion import split_mesh_cell
from monarch_kernel.remote.complete import complete_in, inspect_in


class Sneaky:
    """Its property must never run while completing."""

    def __init__(self) -> None:
        self.ran = 0
        self.size = 3

    @property
    def expensive(self) -> int:
        self.ran += 1
        print("side effect!")
        return 1


def test_split_mesh_cell():
    assert split_mesh_cell("x = 1\n%%mesh procs\nx") is None
    assert split_mesh_cell("%%meshy procs\nx") is None
    c = split_mesh_cell("\n  \n%%mesh procs --ranks procs=1\nbody")
    assert c is not None and c.line == " procs --ranks procs=1"
    assert c.header_start == 4 and c.body_start == len("\n  \n%%mesh procs --ranks procs=1\n")
    # No newline yet: the whole cell is the header, there is no body position.
    c = split_mesh_cell("%%mesh pro")
    assert c is not None and c.body_start > len("%%mesh pro")


def test_complete_in_uses_the_namespace_and_runs_nothing(capsys):
    obj = Sneaky()
    ns = {"remote_only": 1, "obj": obj}
    code = "s = '😀é'\nobj."
    out = complete_in(ns, code, len(code), jedi_budget=0)
    texts = [code[:it["start"]] + it["text"] for it in out["items"]]
    assert code + "size" in texts and code + "expensive" in texts
    assert len({it["start"] for it in out["items"]}) == 1  # one shared start
    out = complete_in(ns, "remote_", 7, jedi_budget=0)
    assert [it["text"] for it in out["items"]] == ["remote_only"]
    assert obj.ran == 0
    assert capsys.readouterr() == ("", "")


def test_complete_in_with_jedi_has_no_duplicates():
    code = "x = 5\nx.bit_l"
    out = complete_in({"x": 5}, code, len(code), jedi_budget=30.0)
    texts = [it["text"] for it in out["items"]]
    assert texts.count(".bit_length") + texts.count("bit_length") == 1, texts
    out = complete_in({}, "import o", 8, jedi_budget=30.0)
    assert "os" in [it["text"] for it in out["items"]] and not out["partial"]


def test_inspect_in_finds_signature_and_docstring_without_running_properties():
    obj = Sneaky()

    def train(lr: float, steps: int = 1) -> None:
        """Train for a while."""

    ns = {"obj": obj, "train": train}
    out = inspect_in(ns, "x = 1\ntrain(0.1)", 9)
    text = out["data"]["text/plain"]  # (annotations are strings in this module)
    assert out["found"] and "train(lr: 'float', steps: 'int' = 1)" in text, text
    assert "Train for a while." in text
    out = inspect_in(ns, "obj.expensive", 13)
    assert out["found"] and obj.ran == 0
    assert inspect_in(ns, "nothing_here", 5)["found"] is False


def test_torch_submodules_complete_through_module_getattr():
    torch = __import__("pytest").importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = torch.nn.Linear(3, 3)

    code = "net.encoder.weight.gr"
    out = complete_in({"net": Net()}, code, len(code), jedi_budget=0)
    assert "grad" in [it["text"] for it in out["items"]], out
