"""The tensor engine's worker: one actor per proc that runs the controller's op stream in
order, keeping the proc's shards in a ref -> tensor table.

Everything of the engine that runs on a proc is here: the worker, its half of remote
functions (`run_call`, `call_value`: the controller's half is `_remote`) and a mesh tensor
passed to an actor (`local_shard`)."""

from __future__ import annotations

import importlib
import logging
import os
import pickle
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ..actor import Actor, context, endpoint
from ..proc import add_heartbeat_field
from ..transport.serialization import unpickling_paused

__all__ = ["SHARD_WAIT_S", "Ref", "Failure", "RemoteTensorError", "resolve_op", "resolve_path",
           "Worker", "fail_outputs", "local_shard", "run_call", "call_value"]

#: the tensor-engine worker of this proc (a proc belongs to one root mesh: one worker)
_WORKER: "Worker | None" = None
_WORKER_UP = threading.Event()  # set once _WORKER is: an actor's call may overtake its spawn
SHARD_WAIT_S = 60.0
log = logging.getLogger("runtime.tensor._remote")  # remote functions' failures (run_call)


class Ref:
    """A placeholder for a mesh tensor inside a command: its ref id."""

    __slots__ = ("id",)

    def __init__(self, id: int) -> None:
        self.id = id

    def __reduce__(self) -> Any:
        return (Ref, (self.id,))


@dataclass
class Failure:
    """Why a shard could not be computed: the op that failed, where, and its traceback."""

    op: str
    rank: int
    error: str
    traceback: str


class RemoteTensorError(RuntimeError):
    """A mesh tensor could not be computed on a proc: names the op that failed there, the
    rank, and the remote traceback. Tensors computed from it fail with the same error."""

    def __init__(self, failure: Failure) -> None:
        self.op, self.rank = failure.op, failure.rank
        self.error, self.remote_traceback = failure.error, failure.traceback
        tb = f"\nremote traceback:\n{failure.traceback}" if failure.traceback else ""
        super().__init__(f"{failure.op} failed on rank {failure.rank}: {failure.error}{tb}")


_OPS: dict[str, Any] = {}


def resolve_op(name: str) -> Any:
    """The torch op for a name such as 'aten::add.Tensor' (cached): for a plain
    OpOverload, the builtin its `__call__` calls (one Python frame less per op)."""
    op = _OPS.get(name)
    if op is None:
        ns, _, rest = name.partition("::")
        base, _, overload = rest.partition(".")
        op = getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
        if type(op) is getattr(torch._ops, "OpOverload", None):
            op = getattr(op, "_op", op)  # torch's private builtin; the overload if it moves
        _OPS[name] = op
    return op


_NESTED = (list, tuple)


def _resolve(seq: Any, value: Any) -> Any:
    """`seq` (a list or tuple of op arguments) with `value` applied to its leaves; the
    op stream's own structures only nest lists and tuples (faster than a pytree walk)."""
    out = []
    for x in seq:
        t = type(x)
        out.append(t(_resolve(x, value)) if t is list or t is tuple else value(x))
    return tuple(out) if type(seq) is tuple else out


def _flat_args(args: tuple, refs: dict) -> Any:
    """`args` with Refs replaced by their shards when none is nested in a list or tuple and
    every shard is here; None otherwise (the general path resolves, or fails the op)."""
    out = []
    for x in args:
        t = type(x)
        if t is Ref:
            v = refs.get(x.id)
            if v is None:
                return None
            out.append(v)
        elif t is list or t is tuple:
            return None
        else:
            out.append(x)
    return out


class Worker(Actor):
    """Executes commands in the order they arrive; an op that raises marks its outputs (and
    everything computed from them) failed instead of failing the actor."""

    def __init__(self) -> None:
        self.refs: dict[int, torch.Tensor] = {}
        self.failed: dict[int, Failure] = {}
        self.rank = context().actor_instance.rank.rank
        self.ops_run = 0
        self.ran = threading.Condition()
        global _WORKER
        _WORKER = self
        _WORKER_UP.set()
        add_heartbeat_field("tensor_bytes", self.held_bytes)
        torch.manual_seed(int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1))

    @endpoint
    def run(self, commands: Any) -> None:
        """Run a batch of commands: ("op", name, args, kwargs, out_ids) or ("free", ids),
        ...; a list, or its pickle (a batch of plain commands: runtime/tensor/_engine.py)."""
        if type(commands) is bytes:
            commands = pickle.loads(commands)
        for cmd in commands:
            if cmd[0] == "op":
                self._op(cmd[1], cmd[2], cmd[3], cmd[4])
            elif cmd[0] == "free":
                for i in cmd[1]:
                    self.refs.pop(i, None)
                    self.failed.pop(i, None)
            elif cmd[0] == "fail":
                self._fail(cmd[1], cmd[2])
            elif cmd[0] == "seed":
                torch.manual_seed(cmd[1] + (self.rank if cmd[2] else 0))
            elif cmd[0] == "coll":
                if cmd[1] == "reduce_many":
                    self._collectives().run_many(cmd[4])
                else:
                    self._collectives().run(cmd[1], cmd[2], cmd[3], cmd[4])
            elif cmd[0] == "alias":
                self._alias(cmd[1], cmd[2])
            elif cmd[0] == "rank":
                self.refs[cmd[1]] = torch.tensor(cmd[2][context().proc_id])
            elif cmd[0] == "call":  # a remote function (runtime.remote)
                run_call(self, cmd)
        with self.ran:
            self.ran.notify_all()

    def _collectives(self) -> Any:
        """The collective runner of this proc (its process groups), made on first use."""
        c = self.__dict__.get("_coll")
        if c is None:
            from ._comm import Collectives

            c = self._coll = Collectives(context().proc_id, self.rank, self.refs,
                                         self.failed, Failure)
        return c

    def _alias(self, src: int, dst: int) -> None:
        """`dst` names the same tensor as `src` (slice_mesh: a view of a mesh tensor)."""
        t = self.refs.get(src)
        if t is not None:
            self.refs[dst] = t
        else:
            self.failed[dst] = self.failed.get(src) or Failure(
                "slice_mesh", self.rank, f"input ref {src} is not on this proc", "")

    def shard(self, ref: int, timeout: float) -> Any:
        """This proc's tensor for `ref`, waiting for the op that makes it (another actor's
        call may overtake the engine's commands); a Failure if it failed."""
        deadline = time.monotonic() + timeout
        with self.ran:
            while True:
                t = self.refs.get(ref)
                if t is not None:
                    return t
                f = self.failed.get(ref)
                if f is not None:
                    return f
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"mesh tensor ref {ref} did not appear on this proc "
                                       f"within {timeout} s (was it freed before the call "
                                       "was handled?)")
                self.ran.wait(left)

    def _op(self, name: str, args: tuple, kwargs: dict, out_ids: list) -> None:
        self.ops_run += 1
        refs = self.refs
        vals = None if kwargs else _flat_args(args, refs)
        if vals is not None:  # the common case: refs to shards present, and plain values
            args = vals
        else:
            bad: list[Failure] = []
            args, kwargs = self._resolve_all(name, args, kwargs, bad)
            if bad:
                self._fail(out_ids, bad[0])
                return
        try:
            out = (_OPS.get(name) or resolve_op(name))(*args, **kwargs)
        except Exception as e:  # the proc lives on; the outputs are failed
            self._fail(out_ids, Failure(name, self.rank, f"{type(e).__name__}: {e}",
                                        traceback.format_exc()))
            return
        if isinstance(out, torch.Tensor):
            leaves = [out]
        else:
            leaves = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
        failed = self.failed
        for i, t in zip(out_ids, leaves):
            if i is not None:
                refs[i] = t
                if failed:
                    failed.pop(i, None)

    def _resolve_all(self, name: str, args: tuple, kwargs: dict, bad: list) -> tuple:
        """(args, kwargs) with Refs replaced by shards; a missing shard appends its Failure
        to `bad` (the op's outputs then fail with it)."""
        refs, failed = self.refs, self.failed

        def value(x: Any) -> Any:
            if type(x) is Ref:
                t = refs.get(x.id)
                if t is None:
                    bad.append(failed.get(x.id) or Failure(
                        name, self.rank, f"input ref {x.id} is not on this proc", ""))
                return t
            return x

        args = _resolve(args, value)
        if kwargs:
            kwargs = {k: _resolve(v, value) if type(v) in _NESTED else value(v)
                      for k, v in kwargs.items()}
        return args, kwargs

    def _fail(self, out_ids: list, failure: Failure) -> None:
        for i in out_ids:
            if i is not None:
                self.refs.pop(i, None)
                self.failed[i] = failure

    @endpoint
    def call_value(self, spec: tuple, args: Any, kwargs: Any, name: str) -> tuple:
        """Run a remote function here: ("ok", its value) or ("failed", Failure)."""
        return call_value(self, spec, args, kwargs, name)

    @endpoint
    def fetch(self, ref: int) -> tuple:
        """("ok", a CPU copy of the shard) or ("failed", Failure)."""
        t = self.refs.get(ref)
        if t is None:
            f = self.failed.get(ref) or Failure("fetch", self.rank, f"ref {ref} is unknown", "")
            return ("failed", f)
        return ("ok", t.detach().to("cpu", copy=True).contiguous())

    @endpoint
    def state(self, ref: int) -> str:
        """'ready', 'failed: <op>' or 'unknown' for `ref` on this proc (after the ops before)."""
        if ref in self.refs:
            return "ready"
        f = self.failed.get(ref)
        return f"failed: {f.op}" if f is not None else "unknown"

    def held_bytes(self) -> int:
        """The bytes the live shards hold (storages shared by views counted once); any
        thread: the heartbeat reports it for the dashboard's proc table."""
        seen: set = set()
        nbytes = 0
        for t in list(self.refs.values()):  # a copy: the worker thread may change refs
            s = t.untyped_storage()
            key = (s.data_ptr(), t.device)
            if key not in seen:
                seen.add(key)
                nbytes += s.nbytes()
        return nbytes

    @endpoint
    def stats(self) -> dict:
        """Live and failed shard counts, the bytes the live shards hold, ops run."""
        return {"live": len(self.refs), "failed": len(self.failed), "bytes": self.held_bytes(),
                "ops": self.ops_run, "rank": self.rank}


def fail_outputs(worker: Worker, out_ids: list, failure: Failure) -> None:
    """Mark the outputs `out_ids` of a command on `worker` failed with `failure` (their
    shards dropped). A function beside the class, not a public method: a public method of an
    Actor is one `as_endpoint` can call."""
    worker._fail(out_ids, failure)


def local_shard(ref: int, proc_ids: tuple) -> Any:
    """Unpickling a mesh tensor in an actor's call: this proc's shard of it (a tensor)."""
    ctx = context()
    if ctx is None or ctx.proc_id not in proc_ids:
        where = ctx.proc_id if ctx is not None else "this process"
        raise RuntimeError(f"a runtime.Tensor passed to an actor arrives as its local shard "
                           f"only on the procs of its mesh; {where} is not one of them")
    # The engine's worker on this proc is spawned by the mesh's first activate(); a call to
    # another actor of the proc may be handled before the worker's __init__ has run.
    with unpickling_paused():  # the worker unpickles its commands meanwhile
        if not _WORKER_UP.wait(SHARD_WAIT_S) or _WORKER is None:
            raise RuntimeError(f"the tensor engine's worker did not start on proc "
                               f"{ctx.proc_id} within {SHARD_WAIT_S:g} s; the runtime.Tensor "
                               "passed to this actor has no shard here")
        got = _WORKER.shard(ref, SHARD_WAIT_S)
    if isinstance(got, Failure):
        raise RemoteTensorError(got)
    return got


# -- remote functions (runtime.remote) on this proc ------------------------------------------

def resolve_path(path: str) -> Callable[..., Any]:
    """'pkg.mod.fn' (or 'pkg.mod:fn') -> the function: the longest importable module
    prefix, then attributes."""
    if ":" in path:
        mod, _, attrs = path.partition(":")
        obj: Any = importlib.import_module(mod)
        for a in attrs.split("."):
            obj = getattr(obj, a)
        return obj
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for a in parts[i:]:
            obj = getattr(obj, a)
        return obj
    raise ImportError(f"remote function {path!r}: no importable module in the path "
                      "(use 'module.function')")


_FNS: dict = {}


def _fn_of(spec: tuple) -> Callable[..., Any]:
    fn = _FNS.get(spec)
    if fn is None:
        if spec[0] == "path":
            fn = resolve_path(spec[1])
        else:
            import cloudpickle

            fn = cloudpickle.loads(spec[1])
        if len(_FNS) > 256:
            _FNS.clear()
        _FNS[spec] = fn
    return fn


def _inputs(worker: Worker, args: Any, name: str) -> tuple:
    """(args with this proc's shards, the failure of a failed input or None)."""
    bad: list = []

    def value(x: Any) -> Any:
        if type(x) is Ref:
            t = worker.refs.get(x.id)
            if t is None:
                bad.append(worker.failed.get(x.id) or Failure(
                    name, worker.rank, f"input ref {x.id} is not on this proc", ""))
            return t
        return x

    out = tree_map(value, args)
    return out, (bad[0] if bad else None)


def _failure(name: str, rank: int, e: BaseException) -> Failure:
    return Failure(f"remote({name})", rank, f"{type(e).__name__}: {e}", traceback.format_exc())


def run_call(worker: Worker, cmd: tuple) -> None:
    """("call", spec, args, kwargs, out_ids, expected (shape, dtype) per output or None
    for a broadcast, name): run the function; its tensor results become the shards of
    out_ids (or they fail)."""
    _, spec, args, kwargs, out_ids, expect, name = cmd
    worker.ops_run += 1
    (args, kwargs), bad = _inputs(worker, (args, kwargs), name)
    if bad is not None:
        fail_outputs(worker, out_ids, bad)
        return
    try:
        out = _fn_of(spec)(*args, **kwargs)
        if expect is None:  # broadcast: for its effects only
            return
        leaves = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
        if len(leaves) != len(out_ids):
            raise TypeError(f"it returned {len(leaves)} tensors where propagate gave "
                            f"{len(out_ids)}")
        for i, (t, (shape, dtype)) in enumerate(zip(leaves, expect)):
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise TypeError(f"result {i} is {tuple(t.shape)} {t.dtype} where propagate "
                                f"gave {shape} {dtype}")
    except Exception as e:  # the proc lives on; the outputs are failed
        if expect is None:
            log.exception("remote(%s).broadcast failed on rank %s", name, worker.rank)
        fail_outputs(worker, out_ids, _failure(name, worker.rank, e))
        return
    for i, t in zip(out_ids, leaves):
        worker.refs[i] = t
        worker.failed.pop(i, None)


def call_value(worker: Worker, spec: tuple, args: Any, kwargs: Any, name: str) -> tuple:
    """Run the function here; ("ok", its value with tensors as CPU copies) or ("failed",
    Failure)."""
    worker.ops_run += 1
    (args, kwargs), bad = _inputs(worker, (args, kwargs), name)
    if bad is not None:
        return ("failed", bad)
    try:
        out = _fn_of(spec)(*args, **kwargs)
    except Exception as e:
        return ("failed", _failure(name, worker.rank, e))
    return ("ok", tree_map(lambda x: x.detach().to("cpu", copy=True)
                           if isinstance(x, torch.Tensor) else x, out))
