"""`HostMesh.sync_workspace`: the controller's side of workspace sync and live reload, and
`reload_actor_class` (a re-defined notebook class applied to live actors).

Through the control plane only (WORKSPACE messages to each host agent, answered on a
port, over the authenticated connection already open; no daemon, no port, no rsync):
1. the controller lists the workspace with content hashes (`runtime.workspace.scan`);
2. each agent is offered the manifest and answers which contents it lacks (a second sync
   of an unchanged tree moves no file content);
3. the missing contents go in batches (at most 4 in flight per host), each acknowledged
   (progress per host), then a commit makes the new tree appear at once on that host;
4. with `auto_reload`, every live proc on those hosts reloads the changed modules between
   messages (`runtime.proc._reload`), and actor meshes whose class changed learn its endpoints;
   without it, every live proc there puts the synced directories on its `sys.path` (new
   imports find them; modules it imported before keep their code).
Hosts sync in parallel, one thread each; every wait is bounded by `workspace_timeout`, and
a host agent that dies fails its host's sync at once (the port waits on the agent).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .._core import AgentRecord, Runtime
from ..config import config
from ..future import Future
from ..transport.framing import OK, Header, Kind
from ..transport.serialization import dumps
from ..workspace import FileEntry, Scan, Workspace, scan

__all__ = [
    "BATCH_BYTES", "BATCH_FILES", "WINDOW", "Progress", "WorkspaceSyncError", "HostSync",
    "ProcReload", "SyncResult", "sync_workspace", "reload_actor_class",
]

BATCH_BYTES = 8 << 20
BATCH_FILES = 256
WINDOW = 4
#: progress(host, files sent, files to send, bytes sent, bytes to send)
Progress = Callable[[str, int, int, int, int], None]


class WorkspaceSyncError(RuntimeError):
    """A sync or reload that failed on some hosts or procs; `result` has every detail."""

    def __init__(self, message: str, result: "SyncResult") -> None:
        super().__init__(message)
        self.result = result


@dataclass
class HostSync:
    """What a sync did on one host."""

    host: str
    address: str = ""  # its agent's address (names it where hosts share a name)
    files: int = 0  # files of the workspace
    bytes: int = 0
    sent_files: int = 0  # contents that had to travel
    sent_bytes: int = 0
    changed: int = 0  # files added or changed on this host
    deleted: int = 0
    root: str = ""  # the host's workspace root (procs import from root/current/<name>)
    error: Optional[str] = None


@dataclass
class ProcReload:
    """What a reload did in one live proc."""

    host: str
    address: str  # its host agent's
    proc_id: str
    mesh: str
    rank: int
    reloaded: list = field(default_factory=list)
    failed: dict = field(default_factory=dict)  # module -> traceback
    skipped: list = field(default_factory=list)  # dependants of a module that failed
    deleted: list = field(default_factory=list)
    busy: list = field(default_factory=list)  # actors that did not pause: nothing reloaded
    #: "name[rank]" -> the @concurrent_endpoint calls in progress the reload waited for
    waited: dict = field(default_factory=dict)
    actors: dict = field(default_factory=dict)  # actor id -> its endpoints now
    error: Optional[str] = None


@dataclass
class SyncResult:
    """`sync_workspace`'s answer: per host what moved, per live proc what reloaded."""

    hosts: list
    reloads: list = field(default_factory=list)
    #: without auto_reload: the live procs told to import from the synced directories
    paths: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def sent_bytes(self) -> int:
        return sum(h.sent_bytes for h in self.hosts)

    def errors(self) -> list[str]:
        """One text per host that failed, and per distinct proc failure (module tracebacks
        included) with the procs it happened in: an error on 8 procs is listed once."""
        out = [f"host {h.host} ({h.address}): {h.error}" for h in self.hosts if h.error]
        groups: dict[str, list[ProcReload]] = {}
        for r in self.reloads + self.paths:
            texts = [r.error] if r.error else []
            texts += [f"reloading {mod} failed (old code kept):\n{tb}"
                      for mod, tb in r.failed.items()]
            if r.busy:
                texts.append("nothing reloaded, actors busy past the timeout: "
                             + ", ".join(r.busy))
            for text in texts:
                groups.setdefault(text, []).append(r)
        out += [f"{_procs_named(rs)}: {text}" for text, rs in groups.items()]
        return out

    def __str__(self) -> str:
        lines = [f"{h.host}: {h.files} files ({h.bytes} bytes), sent {h.sent_files} "
                 f"({h.sent_bytes} bytes), {h.changed} changed, {h.deleted} deleted"
                 + (f", FAILED: {h.error}" if h.error else "") for h in self.hosts]
        reloaded = sorted({m for r in self.reloads for m in r.reloaded})
        failed = any(r.error or r.failed or r.busy for r in self.reloads)
        if self.paths:
            lines.append(f"{len(self.paths)} live procs import from it now (modules they "
                         "imported before keep their code: sync with reload to reload them)")
        if reloaded:
            lines.append(f"reloaded in {len(self.reloads)} procs: {', '.join(reloaded)}")
        elif self.reloads and not failed:
            lines.append(f"nothing to reload in {len(self.reloads)} procs (no module they "
                         "imported changed)")
        for r in self.reloads:
            for actor, calls in r.waited.items():
                lines.append(f"{r.host} proc {r.mesh}[{r.rank}]: waited for {actor}'s calls "
                             f"in progress ({', '.join(c + '()' for c in calls)})"
                             + (" past the timeout: not reloaded" if r.busy else ""))
        return "\n".join(lines)


def _procs_named(procs: list) -> str:
    """`host h (addr) proc trainers[0-3]` for ProcReloads, ranks folded per host and mesh."""
    by: dict[tuple, list[int]] = {}
    for r in procs:
        by.setdefault((r.host, r.address, r.mesh), []).append(r.rank)
    out = []
    for (host, address, mesh), ranks in by.items():
        rs, parts = sorted(set(ranks)), []
        start = prev = rs[0]
        for x in rs[1:] + [None]:
            if x is not None and x == prev + 1:
                prev = x
                continue
            parts.append(f"{start}-{prev}" if prev > start else f"{start}")
            if x is not None:
                start = prev = x
        out.append(f"host {host} ({address}) proc {mesh}[{', '.join(parts)}]")
    return "; ".join(out)


def _ask(rt: Runtime, agent: AgentRecord, what: str, extra: dict, body: bytes = b"",
         buffers: tuple = (), waits_on: str = "", address: str = "",
         route: Any = None) -> Future:
    """Send a WORKSPACE request; a Future of its JSON answer, failed if `waits_on` (the
    agent or the proc asked) dies first."""
    fut: Future = Future(what)

    def on_reply(h: Header, data: Any, bufs: list) -> None:
        rt.close_port(port)
        text = bytes(data)
        if h.status == OK:
            fut.set_result(json.loads(text))
        else:
            fut.set_exception(RuntimeError(text.decode("utf-8", "replace")))

    def on_fail(exc: BaseException, **_: Any) -> None:
        rt.close_port(port)
        fut.set_exception(exc)

    port = rt.open_port(on_reply, on_fail, {waits_on or agent.agent_id})
    target = address or agent.address
    h = Header(Kind.WORKSPACE, reply=rt.reply_address_for(target or agent.address), port=port,
               extra=extra)
    if address or not route:
        rt.send(target, h, body, buffers)
    else:
        rt.send_to_proc(address, route, h, body, buffers)
    return fut


def _batches(files: list[FileEntry]) -> list[list[FileEntry]]:
    out: list[list[FileEntry]] = [[]]
    size = 0
    for f in files:
        if out[-1] and (size + f.size > BATCH_BYTES or len(out[-1]) >= BATCH_FILES):
            out.append([])
            size = 0
        out[-1].append(f)
        size += f.size
    return [b for b in out if b]


def _contents(batch: list[FileEntry]) -> tuple:
    out = []
    for f in batch:
        data = f.path.read_bytes()
        if hashlib.sha256(data).hexdigest() != f.digest:
            raise RuntimeError(f"{f.path} changed during the sync; sync again")
        out.append(data)
    return tuple(out)


def _sync_host(rt: Runtime, agent: AgentRecord, listing: Scan, manifest: bytes,
               sync_id: str, timeout: float, progress: Optional[Progress],
               out: HostSync) -> None:
    """Offer, send what is missing, commit: one host (its own thread)."""
    try:
        if not agent.alive:
            raise RuntimeError("its host agent is not running")
        tag = f"workspace sync to {agent.label}"
        need = set(_ask(rt, agent, tag, {"op": "offer", "sync": sync_id,
                                          "names": sorted(listing.targets)},
                        manifest).get(timeout)["need"])
        unique: dict[str, FileEntry] = {}
        for f in listing.files.values():
            if f.digest in need:
                unique.setdefault(f.digest, f)
        todo = list(unique.values())
        total_b = sum(f.size for f in todo)
        if progress:
            progress(out.host, 0, len(todo), 0, total_b)
        inflight: list[tuple[Future, list[FileEntry]]] = []

        def settle_one() -> None:
            fut, batch = inflight.pop(0)
            fut.get(timeout)
            out.sent_files += len(batch)
            out.sent_bytes += sum(f.size for f in batch)
            if progress:
                progress(out.host, out.sent_files, len(todo), out.sent_bytes, total_b)

        for batch in _batches(todo):
            if len(inflight) >= WINDOW:
                settle_one()
            inflight.append((_ask(rt, agent, tag, {"op": "put", "sync": sync_id, "digests": [
                f.digest for f in batch]}, b"", _contents(batch)), batch))
        while inflight:
            settle_one()
        done = _ask(rt, agent, tag, {"op": "commit", "sync": sync_id}).get(timeout)
        out.changed, out.deleted, out.root = done["changed"], done["deleted"], done["root"]
    except TimeoutError:
        out.error = f"no answer within {timeout:g} s (workspace_timeout)"
    except Exception as e:  # noqa: BLE001 - reported for this host
        out.error = f"{type(e).__name__}: {e}" if not isinstance(e, RuntimeError) else str(e)


def sync_workspace(rt: Runtime, agents: list[AgentRecord], workspace: Workspace,
                   auto_reload: bool, progress: Optional[Progress] = None,
                   timeout: Optional[float] = None) -> SyncResult:
    """Copy `workspace` to every agent's host, then (with `auto_reload`) reload the changed
    modules in the live procs there. Raises WorkspaceSyncError naming each host, proc and
    module that failed (the others are done)."""
    t0 = time.monotonic()
    timeout = config.workspace_timeout if timeout is None else timeout
    listing = scan(workspace, config.workspace_max_bytes)
    manifest = json.dumps(listing.manifest()).encode()
    sync_id = os.urandom(8).hex()
    result = SyncResult([HostSync(a.label, a.address, len(listing.files), listing.total_bytes)
                         for a in agents])
    threads = [threading.Thread(target=_sync_host, name=f"workspace-{a.label}", daemon=True,
                                args=(rt, a, listing, manifest, sync_id, timeout, progress, h))
               for a, h in zip(agents, result.hosts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    roots = {a.agent_id: h.root for a, h in zip(agents, result.hosts) if not h.error}
    sources = {name: str(path) for name, path in listing.targets.items()}
    if auto_reload:
        result.reloads = _reload_procs(rt, agents, roots, sources, timeout)
    else:  # live procs can import what was synced (as procs started after it can)
        result.paths = _reload_procs(rt, agents, roots, sources, timeout, op="path")
    result.seconds = time.monotonic() - t0
    errors = result.errors()
    if errors:
        raise WorkspaceSyncError("sync_workspace failed:\n" + "\n".join(errors), result)
    return result


def _reload_procs(rt: Runtime, agents: list[AgentRecord], roots: dict, sources: dict,
                  timeout: float, op: str = "reload") -> list[ProcReload]:
    """Ask every live proc of this runtime on the synced hosts to reload (op "path": only
    to put the synced directories on its sys.path)."""
    asked = []
    ids = {a.agent_id for a in agents}
    for rec in list(rt.state.procs.values()):
        if rec.agent is None or rec.agent.agent_id not in ids or rec.stopping or \
                rec.state not in ("starting", "running") or not roots.get(rec.agent.agent_id):
            continue
        extra = {"op": op, "root": roots[rec.agent.agent_id], "sources": sources,
                 "timeout": timeout}
        fut = _ask(rt, rec.agent, f"reload in {rec.proc_id}", extra, waits_on=rec.proc_id,
                   address=rec.address, route=rec.route)
        asked.append((ProcReload(rec.agent.label, rec.agent.address, rec.proc_id, rec.mesh,
                                 rec.rank), fut))
    for out, fut in asked:
        try:
            got = fut.get(timeout * 2 + 5)  # its actors get `timeout` to pause
            for k in ("reloaded", "failed", "skipped", "deleted", "busy", "waited", "actors"):
                setattr(out, k, got.get(k, getattr(out, k)))
        except TimeoutError:
            out.error = f"no answer within {timeout * 2 + 5:g} s"
        except Exception as e:  # noqa: BLE001 - reported for this proc
            out.error = str(e)
    changed: dict[str, dict] = {}
    for out, _ in asked:
        changed.update(out.actors)
    if changed:
        _learn_endpoints(rt, changed)
    return [out for out, _ in asked]


def _learn_endpoints(rt: Runtime, changed: dict[str, dict]) -> None:
    """Actor meshes whose class was reloaded: the endpoints the new class has are callable
    on the existing refs (their signatures unknown here: the actor checks the arguments)."""
    def update() -> list:
        recs = []
        for actor_id, info in changed.items():
            rec = rt.state.actor_meshes.get(actor_id)
            if rec is not None:
                rec.sigs = {n: None for n in info["endpoints"]}
                rec.methods = {n: None for n in info["methods"]}
                recs.append(rec)
        return recs

    _forget_cached_endpoints(rt, rt.state.change(update))


def _forget_cached_endpoints(rt: Runtime, recs: list) -> None:
    from .actor_mesh import ActorMesh, forget_endpoints, ref_of

    ids = {id(r) for r in recs}
    for obj in rt.meshes(internal=True):
        if isinstance(obj, ActorMesh) and id(ref_of(obj).rec) in ids:
            forget_endpoints(obj)


def reload_actor_class(actors: Any, cls: type, timeout: Optional[float] = None) -> None:
    """Make the live actors of `actors` (an ActorMesh) instances of `cls`, a re-defined
    version of their class (sent by value, as a notebook cell's class is): their next
    message runs its methods, their attributes kept. Raises RuntimeError naming each rank
    that could not take it."""
    from .actor_mesh import ref_of
    from .proc_mesh import endpoint_signatures, method_signatures
    from ..actor import Actor, endpoints_of

    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise TypeError(f"reload_actor_class: {cls!r} is not an Actor subclass")
    ref = ref_of(actors)
    rt, rec = ref.rt, ref.rec
    timeout = config.workspace_timeout if timeout is None else timeout
    body, bufs = dumps(cls, f"actor class {cls.__name__}")
    futs = []
    for rank, proc_id in enumerate(rec.proc_ids):
        if rank in rec.failed or rt.state.proc(proc_id) is None:
            continue
        address, route = rec.target(rank)
        agent = rt.state.proc(proc_id).agent
        futs.append((rank, _ask(rt, agent, f"reload {rec.name}[{rank}]", {
            "op": "swap", "actor": rec.actor_id, "timeout": timeout}, body, tuple(bufs),
            waits_on=proc_id,
            address=address, route=route)))
    errors = []
    for rank, fut in futs:
        try:
            fut.get(timeout + 5)  # the actor gets `timeout` for its calls in progress
        except Exception as e:  # noqa: BLE001 - collected per rank
            errors.append(f"{rec.name}[{rank}]: {type(e).__name__}: {e}")

    def update() -> None:
        rec.sigs, rec.methods = endpoint_signatures(cls), method_signatures(cls)
        rec.explicit_ports = frozenset(n for n, ep in endpoints_of(cls).items()
                                       if ep.explicit_response_port)

    rt.state.change(update)
    _forget_cached_endpoints(rt, [rec])
    if errors:
        raise RuntimeError("reload_actor_class: some actors keep their old class:\n"
                           + "\n".join(errors))
