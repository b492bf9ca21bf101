"""`bench_gateway.py` on the namespaced test cluster (root only): two agents on mh2 and mh3
attached directly, two on mh1 and mh2 behind the gateway that mh1's agent runs, so every
message crosses the test bridge between network namespaces. Brings the cluster up and tears
it down (tests/multihost/mhcluster.py); refuses to run while another run holds it.

    PYTHONPATH=. python benchmarks/bench_gateway_cluster.py [--iters 200]
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))


def main() -> None:
    from multihost.agents import Agents
    from multihost.mhcluster import Cluster, unavailable

    reason = unavailable()
    if reason:
        sys.exit(f"the namespaced cluster cannot run: {reason}")
    iters = sys.argv[sys.argv.index("--iters") + 1] if "--iters" in sys.argv else "200"
    c = Cluster(n=3)
    c.up()
    tmp = Path(tempfile.mkdtemp())
    tmp.chmod(0o700)
    started = []
    try:
        keys = [tmp / "direct.key", tmp / "gated.key"]
        for k in keys:
            subprocess.run([sys.executable, "-m", "runtime.transport.auth", "keygen", str(k)],
                           check=True, capture_output=True)
        d, g = Agents(c, keys[0], tmp), Agents(c, keys[1], tmp)
        started = [d, g]
        direct = [d.start(n) for n in c.nodes[1:]]
        gw_node = c.nodes[0]
        gated = [g.start(gw_node, extra=("--gateway", f"tcp://{c.addr(gw_node)}:0")),
                 g.start(c.nodes[1])]
        sys.argv = ["bench_gateway.py", "--iters", iters, "--direct", ",".join(direct),
                    "--gated", ",".join(gated), "--gateway", g.info[gw_node]["gateway"],
                    "--key-file", str(keys[0]), "--gated-key-file", str(keys[1])]
        import bench_gateway

        bench_gateway.main()
    finally:
        for a in started:
            a.stop()
        c.down(check=False)
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"cluster left behind: {c.leftovers() or 'nothing'}", file=sys.stderr)
    sys.stdout.flush()
    os._exit(0)  # the runtime's own exit waits for agents that are gone with the cluster


if __name__ == "__main__":
    main()
