"""`%mesh debug ...` reaches the debugger through the kernel's %mesh magic."""

import pytest


@pytest.mark.timeout(60)
def test_mesh_debug_is_dispatched_to_the_debugger(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance()
    try:
        ip.run_line_magic("load_ext", "monarch_kernel")
        ip.run_line_magic("mesh", "debug help")
        out = capsys.readouterr().out
        assert "%mesh debug" in out and "cast" in out, out
        ip.run_line_magic("mesh", "debug policy continue")
        from runtime.debugging import settings

        assert settings.policy() == "continue"
        ip.run_line_magic("mesh", "debug policy fail")
        assert settings.policy() == "fail"
        ip.run_line_magic("mesh", "--help")
        assert "debug" in capsys.readouterr().out
    finally:
        ip.run_line_magic("unload_ext", "monarch_kernel")
        InteractiveShell.clear_instance()
