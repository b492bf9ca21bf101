"""`this_proc()`: the process running this code as a one-proc mesh (the controller itself,
or the proc of the calling actor), and `get_or_spawn_controller()`: named singleton actors
living in the root controller, reachable from every proc.

The controller hosts actors with the same `ProcServer` a proc uses (each actor on its own
thread), registered on the controller's I/O thread for the actor message kinds."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Optional

from .._core import ProcRecord, Runtime, get_runtime
from .._core.roles import ProcRole
from .._base import context as _context
from ..actor import Actor, endpoint, endpoints_of
from ..errors import ActorError
from ..future import Future, resolved, when_all
from ..shapes import Shape
from ..transport.framing import Header, Kind
from ..transport.serialization import dumps
from .proc_mesh import ProcMesh

__all__ = [
    "ROOT_ENV", "ThisProcMesh", "set_this_host", "this_proc", "root_controller_env",
    "get_or_spawn_controller",
]

#: env var of procs: "<root controller proc id>|<its address as seen from the proc's host>"
ROOT_ENV = "MONARCH_ROOT_CONTROLLER"
_CC_NAME = "controller_controller"
_lock = threading.RLock()
#: `host_mesh.this_host`: the host mesh of this process, which `this_proc().host_mesh` is
#: (host_mesh is above this module; the package, runtime._meshes, hands it over)
_this_host: Optional[Callable[[], Any]] = None


def set_this_host(this_host: Callable[[], Any]) -> None:
    """Give this module `this_host()` (called once, by the package that composes both)."""
    global _this_host
    _this_host = this_host


def _cc_actor_id(root_proc_id: str) -> str:
    return f"{_CC_NAME}-{root_proc_id}"


class ThisProcMesh(ProcMesh):
    """The calling process as a mesh of one proc. `stop()` stops the actors spawned on it,
    never the process itself."""

    @property
    def host_mesh(self) -> Any:
        """this_host(): the host this process runs on."""
        assert _this_host is not None, "runtime._meshes sets it when it is imported"
        return _this_host()

    def stop(self, reason: str = "stopped by client") -> Future:
        futs = [type(m).stop(m) for m in self._rt.state.live_meshes(internal=True)
                if getattr(m, "proc_mesh", None) is self and not m.stopped]
        self._stopped_flag = True
        out: Future = Future("this_proc.stop")

        def done() -> None:
            out.set_result(None)

        when_all(futs, done)
        return out

    def _stop_now(self, timeout: float = 5.0) -> None:
        self.stop().get(timeout)

    def __reduce__(self) -> Any:
        raise TypeError("this_proc() cannot be sent to another process; send an actor mesh")


def _local_server(rt: Runtime) -> Any:
    """The ProcServer hosting actors in this process (made on first use in a controller)."""
    role = rt.role
    if isinstance(role, ProcRole):
        return role.server
    with _lock:
        server = getattr(role, "local_server", None)
        if server is None:
            from ..proc import ProcServer

            server = ProcServer(rt, {})

            def install() -> None:
                for kind, fn in server.handlers().items():
                    if kind != Kind.STOP_PROC:
                        rt.register_handler(kind, fn)

            rt.loop.run_sync(install, timeout=10.0)
            role.local_server = server
            _start_controller_controller(rt, server)
        return server


def this_proc() -> ProcMesh:
    """This process as a mesh of one proc: `this_proc().spawn("name", Cls)` runs the actor
    here (in the notebook kernel or script, or in the calling actor's proc), each actor on
    its own thread, callable like any other."""
    rt = get_runtime()
    with _lock:
        pm = rt.role.this_proc_mesh
        if pm is not None and not pm.stopped:
            return pm
        _local_server(rt)
        rec = ProcRecord(rt.proc_id, 0, "this_proc", None, rt.address, host=rt.host,
                         pid=os.getpid(), state="running")
        pm = ThisProcMesh(rt, "this_proc", [rec], Shape((), ()), None)  # type: ignore[arg-type]
        rt.role.this_proc_mesh = pm
        return pm


# -- get_or_spawn_controller ------------------------------------------------------------------
class _ControllerController(Actor):
    """Lives in the root controller; spawns and remembers the named singleton actors."""

    @endpoint
    def get_or_spawn(self, name: str, cls: type, args: tuple, kwargs: dict) -> Any:
        return _get_or_spawn_here(name, cls, args, kwargs)


def _start_controller_controller(rt: Runtime, server: Any) -> None:
    """Start the controller-controller actor (not a user mesh: no health entry)."""
    h = Header(Kind.SPAWN_ACTOR, actor=_cc_actor_id(rt.proc_id), reply=rt.address, rank=0,
               extra={"name": _CC_NAME, "rank": 0, "labels": [], "sizes": []})
    body, bufs = dumps((_ControllerController, (), {}))
    rt.loop.call_soon(server.on_spawn, h, body, list(bufs))


def _get_or_spawn_here(name: str, cls: type, args: tuple, kwargs: dict) -> Any:
    rt = get_runtime()
    with _lock:
        registry = rt.role.__dict__.setdefault("controllers", {})
        mesh = registry.get(name)
        if mesh is not None and not mesh.stopped:
            from .actor_mesh import ref_of

            failed = ref_of(mesh).rec.failed
            if failed:  # as in Monarch: asking for a failed singleton raises its failure
                f = failed[min(failed)]
                raise ActorError(f"get_or_spawn_controller({name!r}): the actor has failed: "
                                 f"{f.call or 'Actor ' + name + ' failed'}: {f.cause}")
            return mesh
        ctx = _context.get_context()
        _context.set_context(None)  # the root owns the singletons, not the asking actor
        try:
            mesh = this_proc().spawn(name, cls, *args, **kwargs)
        finally:
            _context.set_context(ctx)
        registry[name] = mesh
        return mesh


def root_controller_env(rt: Runtime, agent_address: str) -> dict:
    """The env entry that tells procs how to reach the root controller."""
    inherited = os.environ.get(ROOT_ENV)
    if rt.is_proc:
        return {ROOT_ENV: inherited} if inherited else {}
    _local_server(rt)  # the controller-controller must exist before a proc asks for it
    return {ROOT_ENV: f"{rt.proc_id}|{rt.reply_address_for(agent_address)}"}


def get_or_spawn_controller(name: str, cls: type, *args: Any, **kwargs: Any) -> Future:
    """A Future of the singleton actor `name` of this controller session: spawned in the root
    controller's process on first request, the same mesh for every later one (from the
    controller or from inside any actor)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"get_or_spawn_controller(name, ...): name must be a non-empty str, "
                        f"got {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise TypeError(f"get_or_spawn_controller({name!r}, ...): {cls!r} is not an Actor "
                        "subclass")
    rt = get_runtime()
    if not rt.is_proc:
        return resolved(_get_or_spawn_here(name, cls, args, kwargs))
    root = os.environ.get(ROOT_ENV, "")
    if "|" not in root:
        raise RuntimeError("get_or_spawn_controller: this proc does not know its root "
                           f"controller ({ROOT_ENV} is not set)")
    root_id, root_addr = root.split("|", 1)
    from .actor_mesh import rebuild_actor_mesh
    from .proc_mesh import caller_signature

    cc = rebuild_actor_mesh({
        "actor_id": _cc_actor_id(root_id), "name": _CC_NAME,
        "cls_name": "_ControllerController", "proc_ids": [root_id], "addresses": [root_addr],
        "hosts": [""], "routes": [], "sizes": {},
        "sigs": {"get_or_spawn": caller_signature(
            endpoints_of(_ControllerController)["get_or_spawn"].fn, False)},
        "shape": Shape((), ())})
    return cc.get_or_spawn.call_one(name, cls, args, kwargs)

