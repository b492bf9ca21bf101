"""The controller side of the tensor engine: one worker actor mesh per root proc mesh, and
one sender thread that sends every command (ops, frees, fetches) in the order they were
issued, batched per destination, without waiting for replies."""

from __future__ import annotations

import itertools
import logging
import pickle
import threading
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from . import _coalescing
from ..future import Future
from ..errors import SerializationError
from ._worker import Failure, Worker

if TYPE_CHECKING:
    from .._meshes import ActorMesh, ProcMesh

__all__ = [
    "ref_ids", "mesh_key", "Engine", "engine_for", "Sender", "sender", "then", "send_command",
    "send_call",
]

_BATCH_MAX = 1000
#: after a wake-up the sender lets ops gather into one message this long, or this long
#: while a burst is under way (its last pass sent _BURST entries or more); a fetch, a call
#: or a flush ends the wait at once
_GATHER_S = 0.0003
_GATHER_BURST_S = 0.002
_BURST = 64
log = logging.getLogger(__name__)
ref_ids = itertools.count(1)


def mesh_key(mesh: "ProcMesh") -> tuple:
    """Two views name the same procs in the same order iff their keys are equal."""
    return tuple(p.proc_id for p in mesh.procs)


class _CommState(Protocol):
    """What the engine uses of its collectives' state (runtime.tensor._collectives._Comm)."""

    def close(self) -> None: ...


class Engine:
    """The workers of one root proc mesh, and the per-view targets sliced from them."""

    #: the collectives' rendezvous state, made on first use (runtime.tensor._collectives)
    comm: _CommState

    def __init__(self, root: "ProcMesh") -> None:
        self.root = root
        self.workers: "ActorMesh" = root.spawn_internal("tensor_engine", Worker)
        self.targets: dict[tuple, "ActorMesh"] = {}
        self.broken: dict[tuple, BaseException] = {}
        # Mesh tensors free their shards from weakref callbacks that stop when the at-exit
        # pass of weakref.finalize starts (as finalizers did): make sure it is registered.
        weakref.finalize(self, int).atexit = False

    def target(self, mesh: "ProcMesh") -> tuple[tuple, "ActorMesh"]:
        """(key, the worker actors on `mesh`'s procs)."""
        key = mesh_key(mesh)
        t = self.targets.get(key)
        if t is None:
            t = self.targets[key] = self.workers.restricted_to(mesh)
        return key, t

    def close(self) -> None:
        """Release what the collectives hold here (their rendezvous directory or store)."""
        comm = self.__dict__.get("comm")
        if comm is not None:
            comm.close()

    def check(self, key: tuple) -> None:
        """Raise the error that broke sending to these procs, if any (at the call site)."""
        exc = self.broken.get(key)
        if exc is not None:
            raise exc

    def send_command(self, key: tuple, target: "ActorMesh", command: tuple) -> None:
        """Queue a command for the workers of `target` (`send_command` below)."""
        send_command(self, key, target, command)


_engines: dict[int, Engine] = {}
_engines_lock = threading.Lock()


def engine_for(mesh: "ProcMesh") -> Engine:
    """The engine of `mesh`'s root proc mesh; its workers are spawned on first use."""
    root = mesh.root
    e = _engines.get(id(root))
    if e is None or e.root is not root:
        with _engines_lock:
            e = _engines.get(id(root))
            if e is None or e.root is not root:
                for k, old in list(_engines.items()):  # engines of stopped meshes go
                    if old.root.stopped:
                        old.close()
                        del _engines[k]
                e = _engines[id(root)] = Engine(root)
    return e


class Sender:
    """Sends queued entries from one thread, so that a proc receives them in issue order."""

    def __init__(self) -> None:
        self.queue: deque = deque()
        self.wake = threading.Event()
        self.urgent = threading.Event()  # a queued call or mark: someone waits for it
        self.thread: Optional[threading.Thread] = None
        self.lock = threading.Lock()
        #: the loop is about to wait or waits for `wake`: a put must set it. Set before the
        #: loop's last look at the queue, read by put after its append, so one of the two
        #: sees the other's write (an entry is never left behind a sleeping sender); one
        #: attribute read per command instead of a call of Event.is_set.
        self.asleep = True

    def put(self, entry: tuple) -> None:
        """Queue ("cmd", engine, key, target, command, plain), ("call", ...) or ("mark",
        event); never blocks."""
        self.queue.append(entry)
        if entry[0] != "cmd" and not self.urgent.is_set():
            self.urgent.set()
        if self.asleep:  # read after the append: see _loop
            self.asleep = False
            if self.thread is None:  # asleep from the start: the first put starts it
                self._start()
            self.wake.set()

    def _start(self) -> None:
        with self.lock:
            if self.thread is None:
                t = threading.Thread(target=self._loop, name="tensor-engine-sender", daemon=True)
                t.start()
                self.thread = t

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until everything queued so far has been handed to the transport."""
        done = threading.Event()
        self.put(("mark", done))
        if not done.wait(timeout):
            raise TimeoutError("tensor engine: commands were not sent in time")

    def _loop(self) -> None:
        q = self.queue
        last = 0
        while True:
            self.asleep = True
            if not q:
                self.wake.wait()
            self.urgent.wait(_GATHER_BURST_S if last >= _BURST else _GATHER_S)
            self.asleep = False
            self.wake.clear()
            self.urgent.clear()
            last = len(q)
            while q:
                try:
                    self._drain(q)
                except Exception:  # never let the sender die: later commands would hang
                    log.exception("tensor engine: sending a batch failed")

    def _drain(self, q: deque) -> None:
        batch: list = []
        cur: Optional[tuple] = None
        plain = True
        while q and len(batch) < _BATCH_MAX:
            entry = q[0]
            if entry[0] != "cmd":
                break
            if cur is not None and entry[2] != cur[2]:
                break
            q.popleft()
            cur = entry
            batch.append(entry[4])
            plain = plain and entry[5]
        if cur is not None:  # (set with the batch's first command)
            self._send(cur, batch, plain)
        elif q:
            entry = q.popleft()
            if entry[0] == "mark":
                entry[1].set()
            else:
                self._call(entry)

    def _send(self, entry: tuple, batch: list, plain: bool = False) -> None:
        engine, key, target = entry[1], entry[2], entry[3]
        if key in engine.broken:
            return
        try:
            target.run.broadcast(_packed(batch) if plain else batch)
        except SerializationError:
            self._send_each(engine, key, target, batch)
        except BaseException as e:  # a dead or stopped proc: later use raises this
            engine.broken[key] = e

    def _send_each(self, engine: Engine, key: tuple, target: "ActorMesh", batch: list) -> None:
        """Send one by one; a command that cannot be pickled fails its outputs instead."""
        for cmd in batch:
            try:
                target.run.broadcast([cmd])
            except SerializationError as e:
                name = f"remote({cmd[6]})" if cmd[0] == "call" else str(cmd[1])
                failure = Failure(name, -1, f"its arguments cannot be sent: {e}", "")
                if cmd[0] in ("op", "call"):
                    target.run.broadcast([("fail", cmd[4], failure)])
            except BaseException as e:
                engine.broken[key] = e
                return

    def _call(self, entry: tuple) -> None:
        _, engine, key, call, out, finish = entry[:6]
        exc = engine.broken.get(key)
        if exc is not None:
            out.set_exception(exc)
            return
        try:
            inner = call()
        except BaseException as e:
            out.set_exception(e)
            return

        then(inner, finish, out)


sender = Sender()


def _packed(batch: list) -> Any:
    """A batch of plain commands pickled by the C pickler (the worker unpickles bytes),
    ~3x cheaper than the transport's cloudpickle; the batch itself if that fails."""
    try:
        return pickle.dumps(batch, 5)
    except Exception:
        return batch


def then(fut: Future, fn: Callable[[Any], Any], out: Optional[Future] = None) -> Future:
    """A Future (`out`, or a new one) of `fn(fut's result)`, failing as `fut` or `fn` does."""
    if out is None:
        out = Future(getattr(fut, "label", "then"))

    def done(f: Future) -> None:
        e = f.exception(0)
        if e is not None:
            out.set_exception(e)
            return
        try:
            out.set_result(fn(f.result(0)))
        except BaseException as e2:
            out.set_exception(e2)

    fut.add_done_callback(done)
    return out


def send_command(engine: Engine, key: tuple, target: "ActorMesh", command: tuple,
                 plain: bool = False) -> None:
    """Queue a command for the workers of `target` (sent in order, batched). `plain`: it
    holds only builtins, torch dtypes/devices/layouts/memory formats and Refs."""
    if _coalescing.blocks and _coalescing.active():
        _coalescing.flush()  # reductions held for fusion go first: program order
    sender.put(("cmd", engine, key, target, command, plain))


def send_call(engine: Engine, key: tuple, call: Callable[[], Future], label: str,
              finish: Callable[[Any], Any], keepalive: Any = None) -> Future:
    """Queue `call()` (an endpoint call) after the commands before it; a Future of
    `finish(result)`."""
    if _coalescing.blocks and _coalescing.active():
        _coalescing.flush()
    out: Future = Future(label)
    sender.put(("call", engine, key, call, out, finish, keepalive))
    return out
