"""Pure logic of the debugger: rank selectors and meta-command parsing."""

import pytest

from runtime.debugging import settings
from runtime.debugging.commands import CommandError, parse_command
from runtime.debugging.selectors import SelectorError, parse_selector, split_selector


def test_selector_flat_and_slices():
    sel = parse_selector("ranks(1:3)")
    assert [r for r in range(5) if sel.matches(r)] == [1, 2]
    sel = parse_selector("ranks(0, 4)")
    assert [r for r in range(6) if sel.matches(r)] == [0, 4]
    sel = parse_selector("ranks([1,3])")
    assert [r for r in range(6) if sel.matches(r)] == [1, 3]
    sel = parse_selector("ranks(::2)")
    assert [r for r in range(6) if sel.matches(r)] == [0, 2, 4]
    assert all(parse_selector("all").matches(r) for r in range(3))


def test_selector_named_dims():
    sel = parse_selector("ranks(procs=0:2)")
    assert sel.matches(7, {"procs": 1})
    assert not sel.matches(7, {"procs": 2})
    assert not sel.matches(0, {"hosts": 0})  # the dimension must exist
    sel = parse_selector("ranks(hosts=1, procs=[0,3])")
    assert sel.matches(0, {"hosts": 1, "procs": 3})
    assert not sel.matches(0, {"hosts": 0, "procs": 3})


@pytest.mark.parametrize("bad", ["ranks(a:b)", "rank(1)", "ranks(1::0)", "ranks(x=1, 2)",
                                 "ranks(1-=2)"])
def test_selector_errors_name_the_problem(bad):
    with pytest.raises(SelectorError) as e:
        parse_selector(bad)
    assert "ranks" in str(e.value) or "spec" in str(e.value) or "slice" in str(e.value)


def test_split_selector():
    assert split_selector("ranks(procs=0:4) p x + 1") == ("ranks(procs=0:4)", "p x + 1")
    assert split_selector("all bt") == ("all", "bt")
    with pytest.raises(SelectorError):
        split_selector("ranks(1 p x")


def test_parse_commands():
    assert parse_command("list").name == "list"
    c = parse_command("attach trainers 3")
    assert (c.name, c.mesh, c.rank) == ("attach", "trainers", 3)
    c = parse_command("attach 2")
    assert (c.mesh, c.rank) == (None, 2)
    c = parse_command("cast ranks(procs=0:4) p loss")
    assert (c.name, c.mesh, c.selector, c.text) == ("cast", None, "ranks(procs=0:4)", "p loss")
    c = parse_command("cast trainers all w")
    assert (c.mesh, c.selector, c.text) == ("trainers", "all", "w")
    c = parse_command("--postmortem trainers 1")
    assert (c.name, c.mesh, c.rank) == ("postmortem", "trainers", 1)
    assert parse_command("").name == "attach"
    assert parse_command("timeout 5").text == "5"


@pytest.mark.parametrize("bad,needle", [("frobnicate", "unknown debugger command"),
                                        ("cast ranks(0)", "no pdb command"),
                                        ("cast p x", "selector"),
                                        ("attach 1 2", "two ranks"),
                                        ("continue now", "no arguments")])
def test_command_errors(bad, needle):
    with pytest.raises(CommandError) as e:
        parse_command(bad)
    assert needle in str(e.value)


def test_settings(monkeypatch):
    settings.reset()
    monkeypatch.setenv("MONARCH_DEBUG_POLICY", "continue")
    monkeypatch.setenv("MONARCH_DEBUG_TIMEOUT", "7")
    assert settings.policy() == "continue" and settings.timeout() == 7.0
    settings.set_policy("fail")
    settings.set_timeout(2)
    assert settings.policy() == "fail" and settings.timeout() == 2.0
    with pytest.raises(ValueError, match="policy must be one of"):
        settings.set_policy("ignore")
    with pytest.raises(ValueError, match="> 0"):
        settings.set_timeout(0)
    settings.reset()
    monkeypatch.delenv("MONARCH_DEBUG_POLICY")
    assert settings.policy() == "fail"


def test_mesh_debug_magic_usage_and_errors(capsys):
    from monarch_kernel.debugger import debug_magic

    debug_magic("frobnicate", None)
    err = capsys.readouterr().err
    assert "unknown debugger command 'frobnicate'" in err and "%mesh debug list" in err
    debug_magic("list", None)
    out = capsys.readouterr()
    assert "no paused actors" in out.out + out.err
    debug_magic("policy sometimes", None)
    out = capsys.readouterr()
    assert "debug policy must be one of" in out.out + out.err
    debug_magic("help", None)
    assert "%mesh debug --postmortem" in capsys.readouterr().out


def test_attach_button_only_prompts_inside_a_cell_with_stdin():
    from monarch_kernel.debugger import _in_execute_request

    class Shell:
        kernel = object()

        def __init__(self, parent):
            self.parent = parent

        def get_parent(self):
            return self.parent

    assert _in_execute_request(Shell({"msg_type": "execute_request",
                                      "content": {"allow_stdin": True}}))
    assert not _in_execute_request(Shell({"msg_type": "execute_request",
                                          "content": {"allow_stdin": False}}))
    assert not _in_execute_request(Shell({"msg_type": "comm_msg", "content": {}}))
    assert not _in_execute_request(Shell({}))
