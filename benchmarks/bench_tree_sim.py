"""Simulated hosts: the cast tree's costs at 1,024-8,192 host agents, on one machine.

Each host agent is an in-process stand-in running the agents' real relay code
(`runtime.host.casts.CastRelay`, `runtime.host.gather.ReplyGather`, `runtime.transport.casttree`,
`runtime.transport.framing`) on a queue instead of sockets; each of its procs is a stand-in
that answers a call at once with a small reply, as a proc does (framed, to its agent, with
the batch id). The controller's side is what `Messenger.cast` does (the tree of the mesh's
agents, one FANOUT per child) and what the caller does with each REPLY_BATCH (parse it, split
it, set each rank's value). Every message is encoded and decoded as on the wire; nothing
crosses a socket or a process, so the figures are the CPU each side spends, not latency.

For each size it prints, for the tree (`--fanout`, default 16, Monarch's) and for the star
(fan-out = the number of hosts: one FANOUT per agent, today's cast without a tree): the depth,
the messages the controller sends and receives per cast, the controller's CPU per cast
(median), and the busiest relay's CPU per cast (the stand-in that spent the most). The
reference row is the 16-host one of the same run.

    PYTHONPATH=. python benchmarks/bench_tree_sim.py [--hosts 16,1024,4096,8192] [--procs 1]
        [--fanout 16] [--actors N: call a slice of N procs spread over the hosts]
"""
from __future__ import annotations

import argparse
import collections
import gc
import os
import statistics
import sys
import time
from typing import Any

from runtime.host.casts import CastRelay
from runtime.host.gather import ReplyGather
from runtime.transport import casttree, framing
from runtime.transport.framing import Header, Kind

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ref_common import progress  # noqa: E402

TOKEN = b"t" * 32
CTL = "sim://controller"


class Net:
    """The stand-ins and the queue of messages between them (one thread: every handler's
    time is CPU time, charged to the stand-in that ran it)."""

    def __init__(self, hosts: int, procs: int) -> None:
        self.queue: collections.deque = collections.deque()
        self.agents: dict[str, tuple[CastRelay, ReplyGather]] = {}
        self.cpu: collections.Counter = collections.Counter()  # address -> seconds
        self.to_ctl: list = []
        self.proc_rank: dict[str, int] = {}
        self.base = [f"sim://h{i}" for i in range(hosts)]
        self.want: dict[str, list] = {}
        for i, addr in enumerate(self.base):
            ids = [f"p{i}.{j}" for j in range(procs)]
            self.want[addr] = ids
            for j, p in enumerate(ids):
                self.proc_rank[p] = i * procs + j
            gather = ReplyGather(addr, self.send, TOKEN)
            relay = CastRelay(self, TOKEN, addr, "/sim", gather, "")
            self.agents[addr] = (relay, gather)

    # the loop interface CastRelay and ReplyGather use ---------------------------------------
    def send(self, addr: str, frames: list, port: int = 0) -> None:
        self.queue.append((addr, [bytes(f) for f in frames]))

    def run(self) -> None:
        """Deliver every queued message (and what it causes) to its stand-in."""
        q = self.queue
        while q:
            addr, frames = q.popleft()
            if addr == CTL:
                self.to_ctl.append(frames)
                continue
            t0 = time.perf_counter()
            if addr.startswith("ipc:///sim/"):  # a proc: answer the call at once
                agent = self._answer(addr[len("ipc:///sim/"):], frames)
            else:
                agent = addr
                h, body, bufs = framing.parse(frames, TOKEN)
                relay, gather = self.agents[addr]
                if h.kind == Kind.FANOUT:
                    relay.on_fanout(h, body, bufs)
                elif h.kind == Kind.REPLY_BATCH:
                    gather.on_batch(h, body, bufs)
                elif h.kind == Kind.REPLY:
                    gather.on_reply(h, body, bufs)
            self.cpu[agent] += time.perf_counter() - t0

    def _answer(self, proc: str, frames: list) -> str:
        h, _body, _ = framing.parse(frames, TOKEN)
        agent = h.reply
        rank = self.proc_rank[proc]
        r = Header(Kind.REPLY, src=proc, port=h.port, rank=rank,
                   extra={"g": framing.extra_get(h, "g")})
        self.send(agent, framing.build(TOKEN, r, rank.to_bytes(4, "little")))
        return agent


def one_cast(net: Net, tree: casttree.Tree, port: int) -> tuple[float, int, int]:
    """A call + gather to every proc: (controller CPU s, messages sent, messages received)."""
    call = framing.encode_header(Header(Kind.CALL, src=CTL, actor="a", method="ping",
                                        reply=CTL, port=port))
    t0 = time.perf_counter()
    sent = 0
    for agent, procs, sub in tree.roots:  # what Messenger.cast sends
        extra: dict[str, Any] = {"header": call, "procs": procs, "gather": True}
        if sub:
            extra["sub"] = sub
        net.send(agent, framing.build(TOKEN, Header(Kind.FANOUT, src=CTL, extra=extra), b"x"))
        sent += 1
    ctl = time.perf_counter() - t0
    net.to_ctl.clear()
    net.run()
    t0 = time.perf_counter()
    values: dict[int, int] = {}
    for frames in net.to_ctl:  # what the caller does with each batch
        h, body, bufs = framing.parse(frames, TOKEN)
        for rh, rbody, _ in framing.split_reply_batch(h, body, bufs):
            values[rh.rank] = int.from_bytes(rbody, "little")
    ctl += time.perf_counter() - t0
    expect = {net.proc_rank[p] for node in tree.roots for p in casttree.procs_of(node)}
    assert sorted(values) == sorted(expect) and all(k == v for k, v in values.items()), \
        "a rank did not answer exactly once"
    return ctl, sent, len(net.to_ctl)


def measure(hosts: int, procs: int, fanout: int, iters: int, actors: int) -> dict:
    net = Net(hosts, procs)
    want = net.want
    if actors and actors < hosts * procs:  # a slice: `actors` procs spread over the hosts
        step = hosts * procs / actors
        picked = {f"p{int(k * step) // procs}.{int(k * step) % procs}" for k in range(actors)}
        want = {a: [p for p in ps if p in picked] for a, ps in want.items()}
        want = {a: ps for a, ps in want.items() if ps}
    t0 = time.perf_counter()
    tree = casttree.build(net.base, want, fanout)
    build = time.perf_counter() - t0
    ctl, relay = [], []
    for i in range(iters + 2):
        net.cpu.clear()
        gc.collect()
        gc.disable()  # 8,192 stand-ins in one process: a collection is this harness's cost
        try:
            c, sent, received = one_cast(net, tree, i + 1)
        finally:
            gc.enable()
        if i >= 2:  # warm
            ctl.append(c)
            relay.append(max(net.cpu.values()))
    return {"depth": tree.depth, "sent": sent, "received": received, "build": build,
            "ctl": statistics.median(ctl), "relay": statistics.median(relay)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="16,1024,4096,8192")
    ap.add_argument("--procs", type=int, default=1, help="procs per host")
    ap.add_argument("--fanout", type=int, default=16)
    ap.add_argument("--iters", type=int, default=9)
    ap.add_argument("--actors", type=int, default=0,
                    help="call a slice of this many procs spread over the hosts (0: all)")
    a = ap.parse_args()
    sizes = [int(x) for x in a.hosts.split(",")]
    rows = []
    for n in sizes:
        for label, fo in (("tree", a.fanout), ("star", max(n, 2))):
            progress(f"{n} hosts, {label} (fan-out {fo})")
            rows.append((n, label, fo, measure(n, a.procs, fo, a.iters, a.actors)))
    ref = next((r[3]["ctl"] for r in rows if r[1] == "tree"), 1.0)
    what = f"a slice of {a.actors} procs spread over the hosts" if a.actors else "every proc"
    print(f"simulated hosts: {a.procs} proc(s) each, one call + gather to {what}; "
          f"median of {a.iters} casts")
    print(f"{'hosts':>6} {'actors':>7} {'cast':>5} {'fan-out':>8} {'depth':>6} "
          f"{'ctl sent/cast':>14} {'ctl received/cast':>18} {'ctl CPU ms/cast':>16} "
          f"{'x ref':>6} {'busiest relay CPU ms/cast':>26} {'tree build ms':>14}")
    for n, label, fo, m in rows:
        called = min(a.actors, n * a.procs) if a.actors else n * a.procs
        print(f"{n:>6} {called:>7} {label:>5} {fo:>8} {m['depth']:>6} {m['sent']:>14} "
              f"{m['received']:>18} {m['ctl'] * 1e3:>16.2f} {m['ctl'] / ref:>6.2f} "
              f"{m['relay'] * 1e3:>26.2f} {m['build'] * 1e3:>14.2f}")
    print("ref = the tree row of the smallest size. ctl CPU: encoding the casts and decoding "
          "the batches (the caller's per-rank bookkeeping in a real call is not in it); "
          "busiest relay: the stand-in that spent the most on one cast (its relaying, its "
          "gathering, its procs' stand-in answers). tree build: once per mesh (kept).")


if __name__ == "__main__":
    main()
