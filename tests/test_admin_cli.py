"""`monarch-admin` against a real admin endpoint (in this process, fake runtime)."""

from __future__ import annotations

import os

import pytest

from monarch_widgets.admin_cli import main
from runtime.admin import AdminClient, AdminServer
from monarch_widgets.tui import AdminApp
from runtime.supervision.health import ActorState
from test_admin_endpoint import FakeRuntime  # tests/ is on sys.path under pytest

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def rundir(tmp_path, monkeypatch):
    d = tmp_path / "run"
    monkeypatch.setenv("MONARCH_RUNTIME_DIR", str(d))
    return d


def test_status_list_and_errors(rundir, capsys):
    assert main(["--status"]) == 1
    assert "no connection file of a running controller" in capsys.readouterr().err
    rt = FakeRuntime()
    srv = AdminServer(rt)  # writes into $MONARCH_RUNTIME_DIR
    try:
        assert srv.connection_file.parent == rundir
        assert main(["--list"]) == 0
        assert f"pid {os.getpid()}" in capsys.readouterr().out
        rt.health.update("trainers", 1, ActorState.FAILED,
                         last_error="boom")
        assert main(["--status"]) == 0
        out = capsys.readouterr().out
        assert "mesh trainers [gpus=2] on procs: failed" in out and "  o X" in out
        os.chmod(srv.connection_file, 0o640)
        assert main(["--status", "-f", str(srv.connection_file)]) == 1
        assert "expected 0600" in capsys.readouterr().err
    finally:
        srv.close()


def test_tui_over_the_real_endpoint(rundir):
    """The TUI driven through AdminClient -> AdminServer -> runtime: kill with confirmation."""
    import asyncio

    rt = FakeRuntime()
    srv = AdminServer(rt)
    client = AdminClient.from_connection_file(srv.connection_file, timeout=5)

    async def go():
        app = AdminApp(client, refresh_interval=0.2)
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(50):
                await pilot.pause(0.05)
                if ("proc", "p1") in app.tree_nodes:
                    break
            app.query_one("#tree").move_cursor(app.tree_nodes[("proc", "p1")])
            await pilot.pause(0.1)
            await pilot.press("k")
            await pilot.pause(0.1)
            await pilot.press("y")
            for _ in range(50):
                await pilot.pause(0.05)
                if rt.killed:
                    break
            assert rt.killed == ["p1"]
            await pilot.press("s")
            for _ in range(50):
                await pilot.pause(0.05)
                if "p1.py" in "\n".join(app.query_one("#stack").lines):
                    break
            assert "p1.py" in "\n".join(app.query_one("#stack").lines)
            assert app.query_one("#output").lines[-1] == "p1 line 4"

    try:
        asyncio.run(go())
    finally:
        client.close()
        srv.close()


def test_status_and_tui_show_only_the_users_meshes(rundir, capsys):
    """An internal mesh on the user's procs (a notebook's cell runner) appears in neither
    `monarch-admin --status` nor the TUI's tree; the user's mesh does."""
    import asyncio

    from runtime.supervision.health import ActorHealth

    rt = FakeRuntime()
    rt.health.add_mesh("trainers.cells", "trainers", {"gpus": 2}, [
        ActorHealth("trainers.cells", r, {"gpus": r}, ActorState.IDLE, proc_id=f"p{r}",
                    host="localhost", pid=1000 + r) for r in range(2)], internal=True)
    srv = AdminServer(rt)
    client = AdminClient.from_connection_file(srv.connection_file, timeout=5)
    try:
        assert main(["--status"]) == 0
        out = capsys.readouterr().out
        assert "mesh trainers [gpus=2]" in out and "cells" not in out, out

        async def go() -> list:
            app = AdminApp(client, refresh_interval=0.2)
            async with app.run_test(size=(120, 40)) as pilot:
                for _ in range(50):
                    await pilot.pause(0.05)
                    if ("actor", "trainers", 1) in app.tree_nodes:
                        break
                return list(app.tree_nodes)

        keys = asyncio.run(go())
        assert ("actor", "trainers", 0) in keys and ("actor", "trainers", 1) in keys, keys
        assert not [k for k in keys if "trainers.cells" in k], keys
    finally:
        client.close()
        srv.close()
