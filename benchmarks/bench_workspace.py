"""Time HostMesh.sync_workspace: a 50 MB workspace of 2,000 files to 3 hosts (a LocalJob:
three host agents on loopback TCP with CurveZMQ, each with its own copy), then a one-line
edit (with a reload in one live proc per host), then an unchanged tree.

    PYTHONPATH=. python benchmarks/bench_workspace.py [--hosts 3] [--files 2000] [--mb 50]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import runtime
from runtime import Workspace
from runtime.job import LocalJob


def make_tree(root: Path, files: int, total_mb: float) -> Path:
    """`files` files adding up to `total_mb` MB: modules in packages, and data files."""
    d = root / "benchws"
    size = int(total_mb * 1e6 / files)
    for i in range(files):
        pkg = d / f"pkg{i // 100}"
        pkg.mkdir(parents=True, exist_ok=True)
        if i % 100 == 0:
            (pkg / "__init__.py").write_text("")
        if i % 4 == 0:
            body = f"VALUE_{i} = {i}\n" + "# " + "x" * 78 + "\n"
            (pkg / f"mod{i}.py").write_text((body * (size // len(body) + 1))[:size])
        else:
            (pkg / f"blob{i}.bin").write_bytes(os.urandom(size))
    (d / "bench_edit.py").write_text("VALUE = 1\n")
    return d


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--mb", type=float, default=50.0)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-workspace-"))
    job = LocalJob(hosts=a.hosts, progress=False)
    try:
        ws = make_tree(tmp, a.files, a.mb)
        nbytes = sum(f.stat().st_size for f in ws.rglob("*") if f.is_file())
        nfiles = sum(1 for f in ws.rglob("*") if f.is_file())
        hosts = job.state().hosts
        procs = hosts.spawn_procs(per_host={"procs": 1})
        w = Workspace(dirs=[str(ws)])
        print(f"workspace: {nfiles} files, {nbytes / 1e6:.1f} MB; {a.hosts} hosts "
              f"(LocalJob, loopback), one live proc per host")
        t = time.perf_counter()
        r = hosts.sync_workspace(w)
        first = time.perf_counter() - t
        print(f"first sync:            {first * 1e3:8.1f} ms  "
              f"({r.sent_bytes / 1e6:.1f} MB sent in all)")
        (ws / "bench_edit.py").write_text("VALUE = 2\n")
        t = time.perf_counter()
        r = hosts.sync_workspace(w, auto_reload=True)
        edit = time.perf_counter() - t
        print(f"one-line edit, reload: {edit * 1e3:8.1f} ms  ({r.sent_bytes} bytes sent, "
              f"{sum(h.changed for h in r.hosts)} files changed, {len(r.reloads)} procs asked)")
        t = time.perf_counter()
        r = hosts.sync_workspace(w)
        same = time.perf_counter() - t
        print(f"unchanged tree:        {same * 1e3:8.1f} ms  ({r.sent_bytes} bytes sent)")
        procs.stop().get(timeout=30)
    finally:
        job.kill()
        runtime.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
