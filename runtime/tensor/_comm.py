"""The worker side of the tensor engine's collectives: torch.distributed process groups
made on first use per (group of procs, backend) and cached, and the reduce / send-receive
steps run on them. gloo for CPU tensors, NCCL for CUDA tensors.

Rendezvous: procs that all run on the controller's host meet through a `FileStore` in the
controller's private run directory, and gloo connects over loopback, so nothing listens
beyond 127.0.0.1. Procs on several hosts (allowed by `collectives_across_hosts`) meet
through a `TCPStore` the controller serves, as torch.distributed does (docs/tensors.md)."""

from __future__ import annotations

import datetime
import os
from typing import Any, Optional

import torch
import torch.distributed as dist

from ..config import config

__all__ = [
    "CollectiveError", "Groups", "agree", "reduce", "PACK_MAX_BYTES", "packable", "packed_reduce",
    "exchange", "Collectives",
]

_OPS = {"sum": "SUM", "avg": "SUM", "product": "PRODUCT", "min": "MIN", "max": "MAX"}


class CollectiveError(RuntimeError):
    """A collective could not run on this proc (another member failed, or its group)."""


def _timeout() -> datetime.timedelta:
    return datetime.timedelta(seconds=float(config.collective_timeout))


class Groups:
    """This proc's process groups by group id; a group whose collective failed stays
    failed (its id is never reused: the controller names a new one)."""

    def __init__(self, proc_id: str) -> None:
        self.proc_id = proc_id
        self.pgs: dict[str, Any] = {}
        self.failed: dict[str, str] = {}
        self._tcp: dict[tuple, Any] = {}

    def get(self, gid: str, members: tuple, rdv: tuple, backend: str) -> tuple[Any, int]:
        """(process group, this proc's rank in it), made on first use."""
        key = f"{gid}/{backend}"
        why = self.failed.get(key)
        if why is not None:
            raise CollectiveError(f"process group {gid} failed earlier: {why}")
        rank = members.index(self.proc_id)
        pg = self.pgs.get(key)
        if pg is None:
            pg = self.pgs[key] = self._make(key, rank, len(members), rdv, backend)
        return pg, rank

    def _store(self, key: str, n: int, rdv: tuple) -> Any:
        if rdv[0] == "file":
            path = os.path.join(rdv[1], key.replace("/", "-"))
            return dist.FileStore(path, n)
        host, port = rdv[1], rdv[2]
        base = self._tcp.get((host, port))
        if base is None:
            base = self._tcp[(host, port)] = dist.TCPStore(host, port, is_master=False,
                                                           timeout=_timeout())
        return dist.PrefixStore(key, base)

    def _make(self, key: str, rank: int, n: int, rdv: tuple, backend: str) -> Any:
        store = self._store(key, n, rdv)
        if backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = _timeout()
            return dist.ProcessGroupNCCL(store, rank, n, opts)
        # the pybind class with _devices/_timeout; torch's stub knows only its `Options`
        opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # stub omits it
        if rdv[0] == "file":
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        else:  # this proc's address on the route to the store: what the peers reach
            from .._meshes.host_mesh import local_ip_for

            opts._devices = [dist.ProcessGroupGloo.create_device(
                hostname=local_ip_for(rdv[1], rdv[2]))]
        opts._timeout = _timeout()
        return dist.ProcessGroupGloo(store, rank, n, opts)

    def fail(self, gid: str, backend: str, why: str) -> None:
        """Forget a group whose collective failed; later uses of its id fail at once."""
        key = f"{gid}/{backend}"
        self.pgs.pop(key, None)
        self.failed.setdefault(key, why)


def agree(pg: Any, ok: bool, device: torch.device) -> bool:
    """True if every member's input is ready (one small all-reduce, so that a member whose
    input failed does not leave the others waiting in the real collective)."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    opts = dist.AllreduceOptions()
    # pybind converts the RedOpType to a ReduceOp; torch's stub does not say so
    opts.reduceOp = dist.ReduceOp.MIN  # type: ignore[assignment]  # stub lacks the conversion
    pg.allreduce([flag], opts).wait()
    return bool(flag.item())


def reduce(pg: Any, n: int, x: torch.Tensor, reduction: str, scatter: bool,
           inplace: bool = False) -> torch.Tensor:
    """This proc's result of reducing `x` over the group: a new tensor, or `x` itself when
    `inplace` and the reduction can write into it."""
    if inplace and not scatter and reduction != "stack" and x.is_contiguous():
        opts = dist.AllreduceOptions()
        opts.reduceOp = getattr(dist.ReduceOp, _OPS[reduction])
        pg.allreduce([x], opts).wait()
        if reduction == "avg":
            x.div_(n)
        return x
    x = x.contiguous()
    if reduction == "stack":
        if scatter:  # all-to-all: row i of every member's input goes to member i
            out = torch.empty_like(x)
            pg.alltoall_base(out, x, [], [], dist.AllToAllOptions()).wait()
            return out
        outs = [torch.empty_like(x) for _ in range(n)]
        pg.allgather([outs], [x]).wait()
        return torch.stack(outs)
    op = getattr(dist.ReduceOp, _OPS[reduction])
    if scatter:
        out = torch.empty(x.shape[1:], dtype=x.dtype, device=x.device)
        ropts = dist.ReduceScatterOptions()
        ropts.reduceOp = op
        pg.reduce_scatter([out], [list(x.unbind(0))], ropts).wait()
    else:
        out = x.clone()
        aopts = dist.AllreduceOptions()
        aopts.reduceOp = op
        pg.allreduce([out], aopts).wait()
    if reduction == "avg":
        out.div_(n)
    return out


#: (flag value of a ready input, of a failed one) per reduction: the flag rides in one
#: extra element of a small reduction, so the members agree in the same collective
_FLAG = {"sum": (0, 1), "avg": (0, 1), "max": (0, 1), "min": (0, -1), "product": (1, 0),
         "stack": (1, 0)}
PACK_MAX_BYTES = 1 << 20


def packable(meta: tuple, reduction: str, scatter: bool) -> bool:
    """Whether a reduction is small enough to carry its readiness flag in the same message
    (one collective instead of an agreement plus the collective)."""
    shape, dtype = meta
    n = 1
    for s in shape:
        n *= s
    signed = dtype.is_floating_point or dtype in (torch.int8, torch.int16, torch.int32,
                                                   torch.int64)
    return (not scatter and signed and not dtype.is_complex
            and n * torch.empty((), dtype=dtype).element_size() <= PACK_MAX_BYTES)


def packed_reduce(pg: Any, n: int, x: Optional[torch.Tensor], meta: tuple, device: Any,
                  reduction: str) -> tuple[bool, torch.Tensor]:
    """(every member's input was ready, this proc's result) of a small reduction whose
    buffer carries one more element: each member's readiness flag."""
    shape, dtype = meta
    numel = 1
    for s in shape:
        numel *= s
    ok_v, bad_v = _FLAG[reduction]
    buf = torch.empty(numel + 1, dtype=dtype, device=device)
    if x is not None:
        buf[:numel].copy_(x.reshape(-1))
        buf[numel] = ok_v
    else:
        buf[:numel].zero_()
        buf[numel] = bad_v
    if reduction == "stack":
        outs = [torch.empty_like(buf) for _ in range(n)]
        pg.allgather([outs], [buf]).wait()
        ok = all(o[numel].item() == ok_v for o in outs)
        return ok, torch.stack([o[:numel].view(shape) for o in outs])
    opts = dist.AllreduceOptions()
    opts.reduceOp = getattr(dist.ReduceOp, _OPS[reduction])
    pg.allreduce([buf], opts).wait()
    ok = buf[numel].item() == ok_v
    out = buf[:numel].view(shape)
    if reduction == "avg":
        out.div_(n)
    return ok, out


def exchange(pg: Any, rank_of: dict, me: str, pairs: list, shard: Optional[torch.Tensor],
             meta: tuple, pids: Optional[dict] = None) -> Optional[torch.Tensor]:
    """Send this proc's shard to the procs it feeds and receive the shard it gets, as the
    (source proc, destination proc) `pairs` say; returns the received (or copied) tensor.
    With `pids` (every member on this host, CPU tensors), the receiver copies the bytes
    straight out of the sender's memory (process_vm_readv, the RDMA same-host path) and
    the group carries only the address and a done flag."""
    if pids is not None:
        return _exchange_vm(pg, rank_of, me, pairs, shard, meta, pids)
    shape, dtype, device = meta
    # gloo moves CPU memory: CUDA shards are staged through host memory on that backend
    staged = device.type == "cuda" and not isinstance(pg, _nccl_type())
    here = torch.device("cuda", torch.cuda.current_device()) if device.type == "cuda" \
        else torch.device("cpu")
    works = []
    got: Optional[torch.Tensor] = None
    for src, dst in pairs:
        if src == me and dst != me:
            assert shard is not None
            out = shard.contiguous().cpu() if staged else shard.contiguous()
            works.append(pg.send([out], rank_of[dst], 0))
    for src, dst in pairs:
        if dst == me:
            if src == me:
                assert shard is not None
                got = shard.clone()
            else:
                got = torch.empty(shape, dtype=dtype, device="cpu" if staged else here)
                works.append(pg.recv([got], rank_of[src], 0))
    for w in works:
        w.wait()
    if staged and got is not None and not got.is_cuda:
        got = got.to(here)
    return got


def _nccl_type() -> type:
    return getattr(dist, "ProcessGroupNCCL", type(None))


class Collectives:
    """Runs the engine's collective commands on one proc, against its shard table."""

    def __init__(self, proc_id: str, rank: int, refs: dict, failed: dict,
                 failure: Any) -> None:
        self.groups = Groups(proc_id)
        self.me, self.rank = proc_id, rank
        self.refs, self.failed, self.Failure = refs, failed, failure
        self.last_seq = 0

    def run(self, kind: str, in_ref: int, out_id: int, spec: dict) -> None:
        """("reduce" | "p2p", input ref, output ref, spec): see _collectives.py."""
        if kind == "p2p":
            if spec["seq"] <= self.last_seq:
                return  # this proc is on both meshes: the command came twice
            self.last_seq = spec["seq"]
            gid, members = spec["gid"], spec["members"]
        else:
            gid, members = next(g for g in spec["groups"] if self.me in g[1])
        label = spec["label"]
        x = self.refs.get(in_ref)
        mine = None if x is not None else self.failed.get(in_ref) or self.Failure(
            label, self.rank, f"input ref {in_ref} is not on this proc", "")
        if kind == "p2p" and not any(s == self.me for s, _ in spec["pairs"]):
            mine = None  # a pure receiver has no input to check
        backend = spec["backend"]
        dev = torch.device("cuda", torch.cuda.current_device()) if spec["cuda"] else \
            torch.device("cpu")
        flag_dev = dev if backend == "nccl" else torch.device("cpu")
        out: Optional[torch.Tensor] = None
        try:
            pg, rank = self.groups.get(gid, members, spec["rdv"], backend)
            if kind == "reduce" and packable(spec["meta"], spec["reduction"], spec["scatter"]):
                ok, out = packed_reduce(pg, len(members), x, spec["meta"], dev,
                                        spec["reduction"])
            else:
                ok = agree(pg, mine is None, flag_dev)
            if not ok:
                self._fail(kind, spec, out_id, mine or self.Failure(
                    label, self.rank, "an input of this collective failed on another proc of "
                    "its group", ""))
                return
            if out is not None:
                pass
            elif kind == "reduce":
                assert x is not None  # every member's input was ready (agree): ours too
                out = reduce(pg, len(members), x, spec["reduction"], spec["scatter"],
                             spec["into"] == in_ref)
            else:
                rank_of = {p: i for i, p in enumerate(members)}
                out = exchange(pg, rank_of, self.me, spec["pairs"], x, spec["meta"],
                               spec.get("pids"))
        except Exception as e:  # the proc lives on; the outputs fail, the group is dropped
            import traceback

            self.groups.fail(gid, backend, f"{type(e).__name__}: {e}")
            self._fail(kind, spec, out_id, self.Failure(
                label, self.rank, f"{type(e).__name__}: {e}", traceback.format_exc()))
            return
        if out is None:
            return
        self._store(kind, spec, out_id, out, spec.get("into"))

    def run_many(self, spec: dict) -> None:
        """A coalesced run of reductions over one group (see _coalescing.py): every input
        packed into one buffer, one collective, the results unpacked."""
        gid, members = next(g for g in spec["groups"] if self.me in g[1])
        items, label = spec["items"], spec["label"]
        dtype, red = spec["meta"][1], spec["reduction"]
        xs = [self.refs.get(it[0]) for it in items]
        mine = next((self.failed.get(it[0]) or self.Failure(
            label, self.rank, f"input ref {it[0]} is not on this proc", "")
            for it, x in zip(items, xs) if x is None), None)
        dev = torch.device("cuda", torch.cuda.current_device()) if spec["cuda"] else \
            torch.device("cpu")
        sizes = [int(torch.Size(it[3]).numel()) for it in items]
        total = sum(sizes)
        ok_v, bad_v = _FLAG[red]
        try:
            pg, _ = self.groups.get(gid, members, spec["rdv"], spec["backend"])
            buf = torch.zeros(total + 1, dtype=dtype, device=dev)
            if mine is None:
                # (every x is there when mine is None)
                torch.cat([x.reshape(-1) for x in xs if x is not None], out=buf[:total])
            buf[total] = ok_v if mine is None else bad_v
            opts = dist.AllreduceOptions()
            opts.reduceOp = getattr(dist.ReduceOp, _OPS[red])
            pg.allreduce([buf], opts).wait()
            ok = buf[total].item() == ok_v
        except Exception as e:
            import traceback

            self.groups.fail(gid, spec["backend"], f"{type(e).__name__}: {e}")
            mine = self.Failure(label, self.rank, f"{type(e).__name__}: {e}",
                                traceback.format_exc())
            ok = False
        if not ok:
            failure = mine or self.Failure(label, self.rank, "an input of this collective "
                                           "failed on another proc of its group", "")
            for it in items:
                self._fail("reduce", spec, it[1], failure)
            return
        if red == "avg":
            buf.div_(len(members))
        off = 0
        for it, n in zip(items, sizes):
            self._store("reduce", spec, it[1], buf[off:off + n].view(it[3]), it[2])
            off += n

    def _store(self, kind: str, spec: dict, out_id: int, out: torch.Tensor,
               into: Optional[int]) -> None:
        if into is not None:
            target = self.refs.get(into)
            if target is None:
                self._fail(kind, spec, out_id, self.failed.get(into) or self.Failure(
                    spec["label"], self.rank, f"out ref {into} is not on this proc", ""))
                return
            if out is not target:
                target.copy_(out)
            out = target
        self.refs[out_id] = out
        self.failed.pop(out_id, None)

    def _fail(self, kind: str, spec: dict, out_id: int, failure: Any) -> None:
        if kind == "p2p" and not any(d == self.me for _, d in spec["pairs"]):
            return  # no output lives here
        self.refs.pop(out_id, None)
        self.failed[out_id] = failure


def _exchange_vm(pg: Any, rank_of: dict, me: str, pairs: list, shard: Optional[torch.Tensor],
                 meta: tuple, pids: dict) -> Optional[torch.Tensor]:
    from ..rdma import vm
    from ..rdma.client import run_pieces, split_pieces

    shape, dtype, device = meta
    src_t = shard.contiguous() if shard is not None else None
    got: Optional[torch.Tensor] = None
    sends = [(s, d) for s, d in pairs if s == me and d != me]
    works = []
    if sends:  # tell each receiver where the bytes are, then wait until it has them
        assert src_t is not None  # a sender's input was ready (agree)
        head = torch.tensor([src_t.data_ptr(), src_t.numel() * src_t.element_size()],
                            dtype=torch.int64)
        works = [pg.send([head], rank_of[d], 1) for _, d in sends]
    for s, d in pairs:
        if d != me:
            continue
        if s == me:
            assert shard is not None
            got = shard.clone()
            continue
        head = torch.empty(2, dtype=torch.int64)
        pg.recv([head], rank_of[s], 1).wait()
        addr, nbytes = int(head[0]), int(head[1])
        got = torch.empty(shape, dtype=dtype)
        base = got.data_ptr()
        status = torch.tensor([1], dtype=torch.int64)
        try:
            if nbytes:
                run_pieces(split_pieces(nbytes, int(config.rdma_vm_threads)),
                          lambda off, n: vm.copy(pids[s], base + off, addr + off, n,
                                                 write=False))
        except OSError:  # not allowed here (ptrace policy): the sender sends the bytes
            status[0] = 0
        pg.send([status], rank_of[s], 2).wait()
        if not status[0]:
            pg.recv([got], rank_of[s], 3).wait()
    for w in works:
        w.wait()
    for _, d in sends:
        status = torch.empty(1, dtype=torch.int64)
        pg.recv([status], rank_of[d], 2).wait()
        if not status[0]:
            pg.send([src_t], rank_of[d], 3).wait()
    return got
