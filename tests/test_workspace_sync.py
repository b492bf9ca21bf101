"""HostMesh.sync_workspace and live reload with two local hosts (LocalJob: two host agents on
loopback TCP, each with its own workspace directory), through the public API."""
from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from pathlib import Path

import pytest

import runtime
from runtime import Workspace, WorkspaceSyncError, WorkspaceTooLarge
from runtime.job import LocalJob
from runtime.workspace import scan

from tests._workspace_actors import Probe

pytestmark = pytest.mark.timeout(120)

TRAINER = '''
import os
from runtime import Actor, endpoint
from {mod}_dep import SCALE

VALUE = {value}

class Counter(Actor):
    def __init__(self):
        self.n = 0

    @endpoint
    def bump(self):
        self.n += 1
        return (VALUE * SCALE, self.n, os.getpid())
'''


@pytest.fixture(scope="module")
def job():
    j = LocalJob(hosts=2, progress=False)
    try:
        yield j, j.state().hosts
    finally:
        j.kill()


@pytest.fixture
def proj(tmp_path, request):
    """A workspace directory `proj` with modules `<mod>` and `<mod>_dep`; the controller
    imports `<mod>` from it (the procs only from their host's synced copy)."""
    mod = "trainer_" + request.node.name.replace("test_", "")[:20]
    d = tmp_path / "proj"
    d.mkdir()
    (d / f"{mod}_dep.py").write_text("SCALE = 1\n")
    (d / f"{mod}.py").write_text(TRAINER.format(mod=mod, value=1))
    sys.path.insert(0, str(d))
    try:
        yield d, mod
    finally:
        sys.path.remove(str(d))
        for m in (mod, f"{mod}_dep", f"{mod}_hold"):
            sys.modules.pop(m, None)


HOLDER = '''
import asyncio
from runtime import Actor, concurrent_endpoint, endpoint

VALUE = {value}

class Holder(Actor):
    def __init__(self):
        self.gate = None

    @concurrent_endpoint
    async def hold(self):
        self.gate = asyncio.Event()
        before = VALUE
        await self.gate.wait()  # suspended here, in the middle of the call
        return before, VALUE

    @endpoint
    def holding(self):
        return self.gate is not None and not self.gate.is_set()

    @endpoint
    def release(self):
        self.gate.set()

    @endpoint
    def value(self):
        return VALUE
'''


def _until(cond, timeout: float = 30.0, what: str = "") -> None:
    """Poll `cond` until it holds; fail (not hang) after `timeout`."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


def _in_background(fn):
    """Run fn() on a thread: (the thread, {"result" or "error": ...})."""
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _holders(hosts, d, mod):
    (d / f"{mod}_hold.py").write_text(HOLDER.format(value=1))
    hosts.sync_workspace(Workspace(dirs=[str(d)]))
    procs = hosts.spawn_procs(per_host={"procs": 1})
    h = procs.spawn("h", importlib.import_module(f"{mod}_hold").Holder)
    held = h.hold.call()
    _until(lambda: all(h.holding.call().get(timeout=30).values()), what="hold() awaits")
    (d / f"{mod}_hold.py").write_text(HOLDER.format(value=2))
    return procs, h, held


def _said(procs, text: str) -> bool:
    rt = runtime.get_runtime()
    return all(any(text in ln for ln in rt.output_tail(p.proc_id)) for p in procs.procs)


def _edit(d: Path, mod: str, value: int, extra: str = "") -> None:
    (d / f"{mod}.py").write_text(TRAINER.format(mod=mod, value=value) + extra)


def _counter(hosts, mod):
    import importlib

    cls = importlib.import_module(mod).Counter
    procs = hosts.spawn_procs(per_host={"procs": 1})
    return procs, procs.spawn("c", cls)


def _bumps(mesh) -> list:
    return [v for _, v in sorted(mesh.bump.call().get(timeout=30).items(),
                                 key=lambda kv: kv[0].rank)]


def test_edit_sync_reload_live_procs_keep_state_and_new_procs_see_it(job, proj):
    _, hosts = job
    d, mod = proj
    first = hosts.sync_workspace(Workspace(dirs=[str(d)]))
    roots = [h.root for h in first.hosts]
    assert len(set(roots)) == 2 and all(roots), "each host has its own copy"
    procs, c = _counter(hosts, mod)
    before = _bumps(c)
    assert [v[:2] for v in before] == [(1, 1), (1, 1)]
    _edit(d, mod, 2, extra='''
    @endpoint
    def count(self):
        return self.n
''')
    seen = []
    res = hosts.sync_workspace(Workspace(dirs=[str(d)]), auto_reload=True,
                               progress=lambda *a: seen.append(a))
    assert {r.proc_id for r in res.reloads} >= {p.proc_id for p in procs.procs}
    assert all(mod in r.reloaded for r in res.reloads if r.mesh == procs.name)
    assert all(h.sent_files == 1 and h.changed == 1 for h in res.hosts)
    assert {s[0] for s in seen} == {h.host for h in res.hosts} and seen[-1][1] == 1
    after = _bumps(c)
    assert [v[:2] for v in after] == [(2, 2), (2, 2)], "new code, state kept"
    assert [v[2] for v in after] == [v[2] for v in before], "the same live procs"
    assert sorted(c.count.call().get(timeout=30).values()) == [2, 2], "a new endpoint"
    procs2, c2 = _counter(hosts, mod)
    assert [v[:2] for v in _bumps(c2)] == [(2, 1), (2, 1)], "a proc spawned afterwards"
    files = sorted(f for _, (_, f) in procs2.spawn("p", Probe).where.call(mod).get(
        timeout=30).items())
    assert [os.path.dirname(f) for f in files] == sorted(f"{r}/current/proj" for r in roots)
    procs.stop().get(timeout=30)
    procs2.stop().get(timeout=30)


def test_dependency_reloads_first_and_added_deleted_same_size_mtime(job, proj):
    _, hosts = job
    d, mod = proj
    hosts.sync_workspace(Workspace(dirs=[str(d)]))
    procs, c = _counter(hosts, mod)
    probe = procs.spawn("p", Probe)
    assert [v[0] for v in _bumps(c)] == [1, 1]
    dep = d / f"{mod}_dep.py"
    st = dep.stat()
    dep.write_text("SCALE = 7\n")  # same size, then the same mtime as before
    os.utime(dep, ns=(st.st_atime_ns, st.st_mtime_ns))
    (d / "added_mod.py").write_text("X = 'added'\n")
    res = hosts.sync_workspace(Workspace(dirs=[str(d)]), auto_reload=True)
    r = next(r for r in res.reloads if r.mesh == procs.name)
    assert r.reloaded.index(f"{mod}_dep") < r.reloaded.index(mod), "dependency first"
    assert [v[0] for v in _bumps(c)] == [7, 7]
    assert list(probe.value.call("added_mod", "X").get(timeout=30).values()) == ["added"] * 2
    (d / "added_mod.py").unlink()
    res = hosts.sync_workspace(Workspace(dirs=[str(d)]), auto_reload=True)
    assert all(h.deleted == 1 for h in res.hosts)
    gone = list(probe.value.call("added_mod", "X").get(timeout=30).values())
    assert all(v.startswith("ImportError") for v in gone), gone
    procs.stop().get(timeout=30)


def test_syntax_error_is_reported_per_host_and_procs_keep_serving(job, proj):
    _, hosts = job
    d, mod = proj
    hosts.sync_workspace(Workspace(dirs=[str(d)]))
    procs, c = _counter(hosts, mod)
    _bumps(c)
    (d / f"{mod}.py").write_text(TRAINER.format(mod=mod, value=5) + "\ndef broken(:\n")
    with pytest.raises(WorkspaceSyncError) as ei:
        hosts.sync_workspace(Workspace(dirs=[str(d)]), auto_reload=True)
    text = str(ei.value)
    for h in ei.value.result.hosts:
        assert f"host {h.host} ({h.address}) proc {procs.name}" in text
    assert f"reloading {mod} failed" in text and "SyntaxError" in text
    assert [v[:2] for v in _bumps(c)] == [(1, 2), (1, 2)], "old code, still serving"
    _edit(d, mod, 3)  # fixed: the next sync reloads it
    hosts.sync_workspace(Workspace(dirs=[str(d)]), auto_reload=True)
    assert [v[:2] for v in _bumps(c)] == [(3, 3), (3, 3)]
    procs.stop().get(timeout=30)


def test_unchanged_second_sync_sends_no_contents(job, proj):
    _, hosts = job
    d, _ = proj
    (d / "big.bin").write_bytes(os.urandom(300_000))
    first = hosts.sync_workspace(Workspace(dirs=[str(d)]))
    assert all(h.sent_bytes >= 300_000 for h in first.hosts)
    again = hosts.sync_workspace(Workspace(dirs=[str(d)]), auto_reload=True)
    assert [(h.sent_files, h.sent_bytes, h.changed) for h in again.hosts] == [(0, 0, 0)] * 2
    (d / "copy.bin").write_bytes((d / "big.bin").read_bytes())  # same content, new name
    third = hosts.sync_workspace(Workspace(dirs=[str(d)]))
    assert [(h.sent_files, h.changed) for h in third.hosts] == [(0, 1)] * 2


def test_excluded_paths_are_not_synced_and_the_cap_names_the_largest(job, proj, tmp_path):
    _, hosts = job
    d, mod = proj
    for p in (".git/HEAD", "__pycache__/x.pyc", "venv/pyvenv.cfg", "venv/lib/a.py",
              "data/set.csv", "sub/model.ckpt", "sub/keep.py", "notes.tmp"):
        (d / p).parent.mkdir(parents=True, exist_ok=True)
        (d / p).write_text("x")
    (d / ".gitignore").write_text("data/\n*.ckpt\n")
    (d / "sub" / ".gitignore").write_text("*.tmp\n")
    (d / "sub" / "local.tmp").write_text("x")
    rels = set(scan(Workspace(dirs=[str(d)]), 1 << 30).files)
    assert rels == {f"proj/{p}" for p in (".gitignore", "sub/.gitignore", "sub/keep.py",
                                          "notes.tmp", f"{mod}.py", f"{mod}_dep.py")}
    res = hosts.sync_workspace(Workspace(dirs=[str(d)]))
    root = Path(res.hosts[0].root) / "current" / "proj"
    assert (root / "sub" / "keep.py").exists() and not (root / "data").exists()
    assert not (root / ".git").exists() and not (root / "venv").exists()
    assert os.stat(res.hosts[0].root).st_mode & 0o777 == 0o700
    (d / "weights.pt").write_bytes(b"\0" * 2_000_000)
    with runtime.configured(workspace_max_bytes=1_000_000):
        with pytest.raises(WorkspaceTooLarge, match=r"weights\.pt \(2\.0 MB\)"):
            hosts.sync_workspace(Workspace(dirs=[str(d)]))


def test_notebook_class_redefined_and_reloaded_keeps_state(job):
    _, hosts = job
    from runtime import Actor, endpoint

    def make(k: int):  # a local class: sent by value, as a notebook cell's is
        class Acc(Actor):
            def __init__(self):
                self.total = 0

            @endpoint
            def add(self, x):
                self.total += k * x
                return self.total
        return Acc

    procs = hosts.spawn_procs(per_host={"procs": 1})
    acc = procs.spawn("acc", make(1))
    assert list(acc.add.call(5).get(timeout=30).values()) == [5, 5]
    new = make(10)
    assert list(acc.add.call(1).get(timeout=30).values()) == [6, 6], "not until reloaded"
    runtime.reload_actor_class(acc, new)
    assert list(acc.add.call(1).get(timeout=30).values()) == [16, 16]
    procs.stop().get(timeout=30)


def test_reload_waits_for_a_concurrent_call_suspended_in_an_await(job, proj):
    """A reload happens between calls: one that is suspended in an await finishes on the
    old code first (the reload waits for it, saying so, and handles the messages that
    arrive meanwhile: here the one the call awaits)."""
    _, hosts = job
    d, mod = proj
    procs, h, held = _holders(hosts, d, mod)
    t, out = _in_background(lambda: hosts.sync_workspace(Workspace(dirs=[str(d)]),
                                                          auto_reload=True))
    _until(lambda: _said(procs, "reload waits for h["), what="the reload waits for hold()")
    h.release.call().get(timeout=30)  # a message while the reload waits
    t.join(timeout=120)
    assert not t.is_alive() and "error" not in out, out
    assert sorted(held.get(timeout=30).values()) == [(1, 1), (1, 1)], "all old code"
    mine = [r for r in out["result"].reloads if r.mesh == procs.name]
    assert [r.waited for r in mine] == [{f"h[{r.rank}]": ["hold"]} for r in mine]
    assert all(f"{mod}_hold" in r.reloaded and not r.busy for r in mine)
    assert "waited for h[0]'s calls in progress (hold())" in str(out["result"])
    assert list(h.value.call().get(timeout=30).values()) == [2, 2]
    procs.stop().get(timeout=30)


def test_reload_skips_a_proc_whose_concurrent_call_outlasts_the_timeout(job, proj):
    _, hosts = job
    d, mod = proj
    procs, h, held = _holders(hosts, d, mod)
    with pytest.raises(WorkspaceSyncError) as ei:
        hosts.sync_workspace(Workspace(dirs=[str(d)]), auto_reload=True, timeout=1.0)
    assert "nothing reloaded, actors busy past the timeout: h[0] (calls in progress: " \
           "hold())" in str(ei.value)
    assert all(not r.reloaded for r in ei.value.result.reloads if r.mesh == procs.name)
    h.release.call().get(timeout=30)
    assert sorted(held.get(timeout=30).values()) == [(1, 1), (1, 1)]
    assert list(h.value.call().get(timeout=30).values()) == [1, 1], "old code kept"
    hosts.sync_workspace(Workspace(dirs=[str(d)]), auto_reload=True)  # the next sync
    assert list(h.value.call().get(timeout=30).values()) == [2, 2]
    procs.stop().get(timeout=30)


def test_class_reload_waits_for_a_concurrent_call_suspended_in_an_await(job):
    _, hosts = job
    import asyncio

    from runtime import Actor, concurrent_endpoint, endpoint

    def make(k: int):  # a local class: sent by value, as a notebook cell's is
        class Waiter(Actor):
            def __init__(self):
                self.gate = None

            def k(self):
                return k

            @concurrent_endpoint
            async def hold(self):
                self.gate = asyncio.Event()
                before = self.k()
                await self.gate.wait()
                return before, self.k()

            @endpoint
            def holding(self):
                return self.gate is not None and not self.gate.is_set()

            @endpoint
            def release(self):
                self.gate.set()
        return Waiter

    procs = hosts.spawn_procs(per_host={"procs": 1})
    w = procs.spawn("w", make(1))
    held = w.hold.call()
    _until(lambda: all(w.holding.call().get(timeout=30).values()), what="hold() awaits")
    t, out = _in_background(lambda: runtime.reload_actor_class(w, make(2)))
    _until(lambda: _said(procs, "reload waits for w["), what="the swap waits for hold()")
    w.release.call().get(timeout=30)
    t.join(timeout=60)
    assert not t.is_alive() and "error" not in out, out
    assert sorted(held.get(timeout=30).values()) == [(1, 1), (1, 1)], "all old class"
    held = w.hold.call()
    _until(lambda: all(w.holding.call().get(timeout=30).values()), what="hold() awaits")
    with pytest.raises(RuntimeError, match=r"w\[0\].*keeps its old class: w\[0\] \(calls in "
                                           r"progress: hold\(\)\)"):
        runtime.reload_actor_class(w, make(3), timeout=1.0)
    w.release.call().get(timeout=30)
    assert sorted(held.get(timeout=30).values()) == [(2, 2), (2, 2)]
    procs.stop().get(timeout=30)


def test_a_reload_error_on_many_procs_is_reported_once():
    """SyncResult folds a failure that happened alike in several procs (pure)."""
    from runtime import HostSync, ProcReload, SyncResult

    tb = "Traceback (most recent call last):\n  ...\nSyntaxError: invalid syntax\n"
    res = SyncResult([HostSync("vm", "A")], reloads=[
        ProcReload("vm", "A", f"p{r}", "trainers", r, failed={"mod": tb}) for r in range(8)])
    errors = res.errors()
    assert errors == ["host vm (A) proc trainers[0-7]: reloading mod failed (old code kept):\n"
                      + tb]
    assert "reloaded in" not in str(res)
