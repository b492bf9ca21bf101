"""Looking at a mesh tensor's values from the controller: `fetch_shard`, `inspect`, `show`,
and the engine's per-proc counters (`engine_stats`)."""

from __future__ import annotations

import html
import sys
import threading
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..future import Future
from ._engine import engine_for, send_call, send_command
from ._tensor import Tensor, fetch_one, tensor_html, tensor_state
from ._worker import RemoteTensorError

if TYPE_CHECKING:
    from .._meshes import ProcMesh
    from ..value_mesh import ValueMesh

__all__ = [
    "RemoteTensorError", "fetch_shard", "inspect", "show", "engine_stats", "manual_seed", "flush",
    "tensor_state", "tensor_html",
]


def _coords(shard: Optional[dict], kwargs: dict) -> dict:
    coords = dict(shard or {})
    coords.update(kwargs)
    return coords


def fetch_shard(obj: Any, shard: Optional[dict] = None, **kwargs: int) -> Future:
    """A Future of one rank's values of the mesh tensors in `obj` (a tensor or a pytree of
    them; each becomes a CPU torch.Tensor). `shard`/keywords name the rank's coordinates;
    those not given are 0, so none means rank 0. A failed tensor raises RemoteTensorError."""
    coords = _coords(shard, kwargs)
    if isinstance(obj, Tensor):
        return fetch_one(obj, coords)
    leaves, spec = tree_flatten(obj)
    futs = {i: fetch_one(x, coords) for i, x in enumerate(leaves) if isinstance(x, Tensor)}
    if not futs:
        raise TypeError(f"fetch_shard needs a runtime.Tensor (or a structure holding some), "
                        f"got {type(obj).__name__}")
    out: Future = Future(f"fetch_shard({coords or 'rank 0'})")
    left = [len(futs)]
    lock = threading.Lock()

    def done(_: Future) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        try:
            values = [futs[i].result(0) if i in futs else x for i, x in enumerate(leaves)]
        except BaseException as e:
            out.set_exception(e)
            return
        out.set_result(tree_unflatten(values, spec))

    for f in futs.values():
        f.add_done_callback(done)
    return out


def inspect(obj: Any, shard: Optional[dict] = None, timeout: float = 60.0,
            **kwargs: int) -> Any:
    """One rank's values of `obj`'s mesh tensors as local torch.Tensors (blocks; rank 0 by
    default)."""
    return fetch_shard(obj, shard, **kwargs).get(timeout=timeout)


class _Shown:
    def __init__(self, title: str, value: torch.Tensor) -> None:
        self.title, self.value = title, value

    def __repr__(self) -> str:
        return f"{self.title}\n{self.value}"

    def _repr_html_(self) -> str:
        v = self.value
        rows = v.reshape(1, -1) if v.dim() < 2 else v.reshape(-1, v.shape[-1])
        body = "".join("<tr>" + "".join(f"<td>{float(x):.4g}</td>" if v.is_floating_point()
                                        else f"<td>{html.escape(str(x.item()))}</td>"
                                        for x in row) + "</tr>" for row in rows[:64])
        more = f"<p>... {rows.shape[0] - 64} more rows</p>" if rows.shape[0] > 64 else ""
        return (f"<div><b>{html.escape(self.title)}</b><table>{body}</table>{more}</div>")


def show(t: Tensor, shard: Optional[dict] = None, **kwargs: int) -> None:
    """Print one rank's values of `t` (rank 0 by default); a table in a notebook."""
    if not isinstance(t, Tensor):
        raise TypeError(f"show needs a runtime.Tensor, got {type(t).__name__}")
    coords = _coords(shard, kwargs)
    value = inspect(t, coords)
    where = ", ".join(f"{k}={v}" for k, v in coords.items()) or "rank 0"
    shown = _Shown(f"{t.mesh.name} [{where}] {tuple(t.shape)} {t.dtype}", value)
    ip = sys.modules.get("IPython")
    shell = ip.get_ipython() if ip is not None and hasattr(ip, "get_ipython") else None
    if shell is not None and getattr(shell, "kernel", None) is not None:
        from IPython.display import display

        display(shown)
    else:
        print(repr(shown))


def engine_stats(mesh: "ProcMesh") -> "Future[ValueMesh]":
    """Per proc of `mesh`: live and failed shard counts, bytes held, ops run (after every
    command issued before this call)."""
    engine = engine_for(mesh)
    key, target = engine.target(mesh)
    return send_call(engine, key, lambda: target.stats.call(), "engine_stats", lambda v: v)


def manual_seed(seed: int, per_rank: bool = False) -> None:
    """Seed torch's generator on every proc of the active mesh (`seed + rank` with
    `per_rank=True`, so ranks differ but runs repeat)."""
    from ._context import get_active_mesh

    mesh = get_active_mesh()
    if mesh is None:
        raise RuntimeError("manual_seed needs an active mesh (use `with mesh.activate():`)")
    engine = engine_for(mesh)
    key, target = engine.target(mesh)
    send_command(engine, key, target, ("seed", int(seed), bool(per_rank)))


def flush(timeout: float = 30.0) -> None:
    """Wait until every command issued so far has been sent to the procs."""
    from . import _coalescing
    from ._engine import sender

    _coalescing.flush()
    sender.flush(timeout)
