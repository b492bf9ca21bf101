"""Future: the result of a remote operation, usable with `.get()` and with `await`.

A Future is resolved by the runtime's I/O thread and waited on by user threads or by
any asyncio loop, including one already running in the calling thread (a notebook cell).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import threading
import time
from typing import (Any, Callable, Coroutine, Generator, Generic, Iterator, Optional,
                    TypeVar)

__all__ = [
    "R", "waiting_in", "CallScope", "call_scope", "note_call", "add_wait_hook",
    "remove_wait_hook", "Future", "resolved", "failed", "completed", "when_all", "resolve_later",
    "on_resolve",
]

R = TypeVar("R")

_PENDING = object()

#: Functions called as fn(future) about every 0.1 s by a thread blocked in Future.get();
#: the debugger uses this to open a pdb prompt in the waiting cell.
_wait_hooks: list = []
#: thread id -> the future that thread is blocked on in `get()` now (`waiting_in`): what a
#: busy actor waits on, for `runtime.diagnose`
_waiting: dict = {}


def waiting_in(thread_id: Optional[int]) -> Optional["Future"]:
    """The future thread `thread_id` is blocked on in `get()` now, or None."""
    return _waiting.get(thread_id) if thread_id is not None else None


#: thread id -> the CallScope open in that thread (`call_scope`)
_scopes: dict = {}


class CallScope:
    """The remote calls one thread starts while this scope is open (a notebook cell's):
    an interrupted wait in that thread (Ctrl-C, a cancelled `await`) interrupts a call only
    if this scope started it (a call started before goes on), and `cancel()` cancels the
    calls of this scope still running. Open it with `with runtime.call_scope() as calls:`,
    or `open()` / `close()`; scopes nest per thread (the inner one counts)."""

    __slots__ = ("_calls", "_interrupted", "_thread", "_outer", "_prune_at", "_open")

    def __init__(self) -> None:
        """A scope not yet open."""
        self._calls: dict = {}  # a call's interrupt hook -> its futures
        self._interrupted: set = set()  # hooks whose wait was interrupted (run already)
        self._thread: Optional[int] = None
        self._outer: Optional["CallScope"] = None
        self._prune_at = 1024
        self._open = False

    def open(self) -> "CallScope":
        """Make this the calling thread's scope (until `close()`); returns self."""
        if self._open:
            raise RuntimeError("this CallScope is open already")
        self._thread = me = threading.get_ident()
        self._outer = _scopes.get(me)
        _scopes[me] = self
        self._open = True
        return self

    def close(self) -> None:
        """Stop collecting calls (the calls stay known to `pending()` and `cancel()`)."""
        if not self._open:
            return
        self._open = False
        if _scopes.get(self._thread) is self:
            if self._outer is None:
                _scopes.pop(self._thread, None)
            else:
                _scopes[self._thread] = self._outer
        self._outer = None

    def __enter__(self) -> "CallScope":
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _add(self, hook: Any, futs: Any) -> None:
        """A call started in this scope: its interrupt hook and its future(s)."""
        calls = self._calls
        calls[hook] = list(futs) if isinstance(futs, (list, tuple)) else [futs]
        if len(calls) >= self._prune_at:  # a long cell: forget the calls that ended
            for h in [h for h, fs in calls.items() if all(f._flag for f in fs)]:
                del calls[h]
                self._interrupted.discard(h)
            self._prune_at = max(1024, 2 * len(calls))

    def owns(self, fut: "Future") -> bool:
        """Whether `fut` is (or derives from) a call this scope started."""
        hook = fut._on_interrupt
        return hook is not None and hook in self._calls

    def pending(self) -> "list[Future]":
        """The futures of this scope's calls not yet resolved."""
        return [f for fs in list(self._calls.values()) for f in fs if not f._flag]

    def cancel(self) -> "list[str]":
        """`Future.cancel()` each call of this scope still running, except those whose
        wait was interrupted (their actors were interrupted already); returns their labels."""
        out = []
        for hook, futs in list(self._calls.items()):
            if hook in self._interrupted:
                continue
            for f in futs:
                if f.cancel():
                    out.append(f._label or "a call")
                    break  # one cancel stops the call (every future of a stream)
        return out


def call_scope() -> CallScope:
    """A `CallScope` to open with `with`: the calls this thread starts in the block."""
    return CallScope()


def note_call(hook: Any, futs: Any) -> None:
    """Runtime-internal: a remote call with interrupt hook `hook` and future(s) `futs` was
    started by this thread (the open CallScope, if any, keeps it)."""
    if _scopes and hook is not None:
        scope = _scopes.get(threading.get_ident())
        if scope is not None:
            scope._add(hook, futs)


def add_wait_hook(fn: Callable[["Future"], None]) -> None:
    """Register `fn(future)`, called periodically while a thread blocks in `get()`."""
    if fn not in _wait_hooks:
        _wait_hooks.append(fn)


def remove_wait_hook(fn: Callable[["Future"], None]) -> None:
    if fn in _wait_hooks:
        _wait_hooks.remove(fn)


_guard = threading.Lock()
#: the futures' locks, shared round-robin: a lock is a garbage-collected object, and one per
#: call in flight made the collector run more often. Safe to share: a future's lock guards a
#: few assignments and is never held while another lock is taken or a callback runs.
_LOCKS = tuple(threading.Lock() for _ in range(64))
_next_lock = itertools.count()


class Future(Generic[R]):
    """A value that arrives later. `.get()` blocks; `await fut` suspends a coroutine."""

    __slots__ = ("_lock", "_flag", "_lk", "_value", "_exc", "_callbacks", "_on_interrupt",
                 "_label", "_ports", "_coro", "_had_coro", "_gathered", "_finish")

    def __init__(self, label: str = "", *, coro: Optional[Coroutine[Any, Any, R]] = None
                 ) -> None:
        """A pending future; with `coro` (Monarch's `Future(coro=...)`), one whose value is
        that coroutine's: run by the first `.get()` (on its own event loop) or `await`."""
        self._lock = _LOCKS[next(_next_lock) & 63]
        # resolved: a flag, and a lock made only if a thread has to wait (held until the
        # future resolves; waiters acquire it, then pass it on): one futex wake on resolve
        self._flag = False
        self._lk: Any = None
        self._value: Any = _PENDING
        self._exc: Optional[BaseException] = None
        # made on use; an _Inline runs on the resolving thread
        self._callbacks: Optional[list[Callable[["Future[R]"], None] | _Inline]] = None
        self._on_interrupt: Optional[Callable[[], None]] = None
        self._label = label
        self._ports: tuple = ()  # reply ports of the call (the debugger matches sessions)
        self._coro = coro  # not yet started; taken by whoever runs it
        self._had_coro = coro is not None
        self._gathered = False  # its coroutine was handed to Future.gather
        #: resolved with raw data (`resolve_later`): what turns it into the value, run by
        #: the first thread that takes the value (never the I/O thread that resolved it)
        self._finish: Optional[Callable[[Any], Any]] = None

    # -- resolution (runtime side) -------------------------------------------------
    def _resolve(self, value: Any = None, exc: Optional[BaseException] = None,
                 finish: Optional[Callable[[Any], Any]] = None) -> bool:
        with self._lock:
            if self._flag:
                return False
            if exc is not None:
                self._exc = exc
            else:
                self._value = value
                self._finish = finish
            self._flag = True
            lk = self._lk
            if lk is not None:
                try:
                    lk.release()
                except RuntimeError:  # released already
                    pass
            callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            inline = [cb for cb in callbacks if isinstance(cb, _Inline)]
            for cb in inline:
                _run_callback(cb.fn, self)
            if len(inline) < len(callbacks):
                _callbacks.submit(self, [cb for cb in callbacks if not isinstance(cb, _Inline)])
        return True

    def set_result(self, value: R) -> bool:
        """Resolve with a value; returns False if already resolved."""
        return self._resolve(value=value)

    def set_exception(self, exc: BaseException) -> bool:
        """Resolve with an error; returns False if already resolved."""
        return self._resolve(exc=exc)

    # -- inspection ------------------------------------------------------------------
    def done(self) -> bool:
        return self._flag

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        self._wait(timeout)
        if self._finish is not None:
            self._finished()
        return self._exc

    def _finished(self) -> None:
        """Turn raw data into the value (`resolve_later`), in this thread, once: two threads
        racing both decode, the first result stays (one that read the other's value as
        raw data is discarded by the check under the lock)."""
        finish = self._finish
        raw = self._value  # read after `finish`: raw data unless another thread finished
        if finish is None:
            return
        try:
            value, exc = finish(raw), None
        except BaseException as e:  # noqa: BLE001 - it belongs to the future
            value, exc = None, e
        with self._lock:
            if self._finish is finish:
                self._finish = None
                self._value, self._exc = value, exc

    def result(self, timeout: Optional[float] = None) -> R:
        """Alias of `get`, for concurrent.futures-style code."""
        return self.get(timeout)

    def add_done_callback(self, fn: Callable[["Future[R]"], None]) -> None:
        """Call `fn(self)` once resolved, on the runtime's callback thread (never on the I/O
        thread, which must keep reading: a callback may block, print or wait on another
        call). A future's callbacks run in the order added; at once, on this thread, if it
        is resolved already."""
        if not self._add_callback(fn):
            fn(self)

    def _add_callback(self, fn: "Callable[[Future[R]], None] | _Inline") -> bool:
        """Keep `fn` for the resolution; False (kept nowhere) if resolved already."""
        with self._lock:
            if self._flag:
                return False
            if self._callbacks is None:
                self._callbacks = [fn]
            else:
                self._callbacks.append(fn)
            return True

    @property
    def interrupt_hook(self) -> Optional[Callable[[], None]]:
        """What an interrupted wait on this future runs (Ctrl-C in `get()`, a cancelled
        `await`): for a call, interrupting its remote actors; None: nothing. Assign it to
        make a derived future interrupt like the one it derives from."""
        return self._on_interrupt

    @interrupt_hook.setter
    def interrupt_hook(self, fn: Optional[Callable[[], None]]) -> None:
        self._on_interrupt = fn

    @property
    def label(self) -> str:
        """What this future is for, in error messages (`Echo.ping.call_one`)."""
        return self._label

    @property
    def reply_ports(self) -> tuple:
        """The reply ports of the call this future waits on (the debugger matches its
        sessions to a wait by them); () when it is not a call's."""
        return self._ports

    @reply_ports.setter
    def reply_ports(self, ports: tuple) -> None:
        self._ports = ports

    # -- waiting ---------------------------------------------------------------------
    def _wait(self, timeout: Optional[float]) -> None:
        if self._flag:
            return
        me = threading.get_ident()
        outer = _waiting.get(me)
        _waiting[me] = self
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            # Wait in slices so Ctrl-C in the main thread is seen promptly and wait hooks run.
            while True:
                step = 0.1
                if deadline is not None:
                    step = min(step, deadline - time.monotonic())
                    if step <= 0:
                        raise TimeoutError(
                            f"{self._label or 'future'} not resolved within {timeout:g} s")
                if _callbacks.on_worker():
                    with _callbacks.blocked():  # another worker takes the queue meanwhile
                        done = self._wait_flag(step)
                else:
                    done = self._wait_flag(step)
                if done:
                    return
                for hook in list(_wait_hooks):
                    hook(self)
        except KeyboardInterrupt:
            self._interrupted()
            raise
        finally:
            if outer is None:
                _waiting.pop(me, None)
            else:
                _waiting[me] = outer

    def _wait_flag(self, timeout: float) -> bool:
        """Block up to `timeout` seconds until resolved."""
        if self._flag:
            return True
        lk = self._lk
        if lk is None:
            new = threading.Lock()
            new.acquire()
            with _guard:
                lk = self._lk
                if lk is None:
                    lk = self._lk = new
        if self._flag:  # resolved before the lock existed
            return True
        if lk.acquire(True, max(0.0, timeout)):
            lk.release()  # wake the next waiter, if any
            return True
        return self._flag

    def cancel(self) -> bool:
        """Cancel the call this future waits on: its actors stop it (a running handler gets
        an exception at its next Python bytecode, an `async` one is cancelled at its next
        await, a call still queued is not run) and stay usable; the future fails with
        `runtime.CancelledError` naming the call. False when it is resolved already, or is
        not a remote call's (nothing to cancel)."""
        if self._flag:
            return False
        cancel = getattr(self._on_interrupt, "cancel", None)
        if cancel is None:
            return False
        cancel(self._label or "the call")
        return True

    def _interrupted(self) -> None:
        """The wait was interrupted (Ctrl-C, task cancelled): tell the remote side."""
        hook = self._on_interrupt
        if hook is not None and _scopes:
            scope = _scopes.get(threading.get_ident())
            if scope is not None:
                if not scope.owns(self):
                    return  # a call started before this scope: the wait ends, it goes on
                scope._interrupted.add(hook)
        if hook is not None:
            try:
                hook()
            except Exception:
                pass

    # -- coroutine-backed futures (Monarch's Future(coro=...), Future.gather) ----------
    def _take_coro(self) -> Optional[Coroutine]:
        with self._lock:
            if self._gathered:
                raise ValueError(f"{self._label or 'this Future'} was consumed by "
                                 f"Future.gather; use the gathered future's value")
            coro, self._coro = self._coro, None
            return coro

    def start(self) -> None:
        """Start this future's coroutine, if it has one not yet started, on its own loop."""
        coro = self._take_coro()
        if coro is None:
            return
        import asyncio

        def drive() -> None:
            try:
                self._resolve(value=asyncio.run(coro))
            except BaseException as e:  # noqa: BLE001 - it belongs to the future
                self._resolve(exc=e)

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            drive()  # no loop in this thread: run it here
            return
        threading.Thread(target=drive, name="runtime-future-coro", daemon=True).start()

    @classmethod
    def _from_coro(cls, coro: Coroutine[Any, Any, R]) -> "Future[R]":
        """Monarch's private constructor, which its tests use: `Future(coro=coro)`."""
        return cls("Future._from_coro", coro=coro)

    @classmethod
    def gather(cls, *futures: "Future[Any]", return_exceptions: bool = False
               ) -> "Future[list]":
        """Monarch's `Future.gather`: one future of the list of the values, in order. An
        error fails it (or, with `return_exceptions=True`, takes the value's place). A
        coroutine-backed future is consumed: its own `.get()` then raises ValueError, and
        one whose coroutine already ran cannot be gathered."""
        import asyncio

        for f in futures:
            if not isinstance(f, Future):
                raise TypeError(f"Future.gather takes Futures, got {type(f).__name__}")
            if f._had_coro and f._coro is None:
                raise ValueError(f"{f._label or 'a Future'} has already been consumed "
                                 f"(its value was taken, or it was gathered before)")
        awaitables: list = []
        for f in futures:
            with f._lock:
                coro, f._coro = f._coro, None
                f._gathered = coro is not None
            awaitables.append(coro if coro is not None else _awaiting(f))

        async def everything() -> list:
            return list(await asyncio.gather(*awaitables, return_exceptions=return_exceptions))

        # a plain Future whatever the class: a subclass's (_Completed: resolved already,
        # rdma's _Deferred: no coro) cannot stand for a pending coroutine
        return Future("Future.gather", coro=everything())

    def get(self, timeout: Optional[float] = None) -> R:
        """Block until resolved and return the value (or raise the error).

        On timeout raises TimeoutError and leaves the future usable."""
        self.start()
        self._wait(timeout)
        if self._finish is not None:
            self._finished()
        if self._exc is not None:
            raise self._exc
        return self._value

    def __await__(self) -> Generator[Any, None, R]:
        coro = self._take_coro()
        if coro is not None:  # Future(coro=...) not yet started: run it on this loop
            try:
                value = yield from coro.__await__()
            except BaseException as e:  # noqa: BLE001 - it belongs to the future
                self._resolve(exc=e)
                raise
            self._resolve(value=value)
            return value
        if not self._flag:
            import asyncio

            loop = asyncio.get_running_loop()
            waiter: asyncio.Future = loop.create_future()

            def wake(_: "Future[R]") -> None:
                def settle() -> None:
                    if not waiter.done():
                        waiter.set_result(None)

                if loop.is_closed():
                    return
                try:
                    if threading.get_ident() == getattr(loop, "_thread_id", None):
                        settle()
                    else:
                        loop.call_soon_threadsafe(settle)
                except RuntimeError:  # loop closed meanwhile
                    pass

            on_resolve(self, wake)  # wakes the loop only: cheap, on the resolving thread
            try:
                yield from waiter.__await__()
            except asyncio.CancelledError:
                self._interrupted()
                raise
        if self._finish is not None:
            self._finished()
        if self._exc is not None:
            raise self._exc
        return self._value

    def __repr__(self) -> str:
        state = "pending"
        if self._flag:
            state = "error" if self._exc is not None else "done"
        return f"<Future {self._label} {state}>"


async def _awaiting(f: Future) -> Any:
    return await f


def resolved(value: Any) -> Future:
    """A future that is already resolved with `value`."""
    f: Future = Future()
    f.set_result(value)
    return f


def failed(exc: BaseException) -> Future:
    """A future that is already resolved with the error `exc`."""
    f: Future = Future()
    f.set_exception(exc)
    return f


class _Completed(Future):
    """A resolved Future that is also a finished coroutine, for calls Monarch declares
    `async def`: `asyncio.run(procs.logging_option(...))` works, and so do a plain call
    (the work is already done), `await` and `.get()`."""

    __slots__ = ()

    def send(self, value: Any) -> Any:
        raise StopIteration(self._value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        raise (val if val is not None else typ)

    def close(self) -> None:
        pass


def completed(value: Any = None) -> Future:
    """A resolved future that asyncio also takes as a (finished) coroutine."""
    f: Future = _Completed()
    f.set_result(value)
    return f


import collections.abc  # noqa: E402

collections.abc.Coroutine.register(_Completed)


def when_all(futures: "list[Future[Any]]", fn: "Callable[[], None]") -> None:
    """Call `fn()` once every one of `futures` has resolved (at once if there are none),
    on the thread that resolves the last one: runtime code only, as `on_resolve`."""
    if not futures:
        fn()
        return
    left = [len(futures)]
    lock = threading.Lock()

    def one_done(_: "Future[Any]") -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            fn()

    for f in futures:
        on_resolve(f, one_done)


# -- callbacks ----------------------------------------------------------------------------
# The I/O thread resolves most futures; it must never run the user's code (a callback that
# sleeps, prints to a paused pipe or waits on another call would stop every read,
# heartbeat and reply of the process). `add_done_callback` hands callbacks to worker
# threads; `on_resolve` is the runtime's own way to run a short, non-blocking function on
# the resolving thread.


class _Inline:
    """A callback marked to run on the resolving thread (`on_resolve`)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable) -> None:
        self.fn = fn


def resolve_later(fut: Future, raw: Any, finish: Callable[[Any], Any]) -> bool:
    """Runtime-internal: resolve `fut` with `raw` data that `finish(raw)` turns into its value
    (or raises as its error) in the first thread that takes the value (`get`, `await`,
    `exception`, a callback), not in the resolving one: the I/O thread resolves a reply
    without unpickling it. False if already resolved."""
    return fut._resolve(value=raw, finish=finish)


def on_resolve(fut: Future, fn: Callable[[Future], None]) -> None:
    """Runtime-internal: call `fn(fut)` on the thread that resolves `fut` (at once if it is
    resolved). `fn` must be short and never block: it may run on the I/O thread."""
    if not fut._add_callback(_Inline(fn)):
        _run_callback(fn, fut)


def _run_callback(fn: Callable, fut: Future) -> None:
    try:
        fn(fut)
    except Exception:  # one callback's failure stops neither the others nor the thread
        import logging

        logging.getLogger("runtime").exception("future callback %r failed", fn)


class _CallbackWorkers:
    """Threads that run futures' callbacks, in the order the futures resolved.

    One worker runs them; a callback that waits on a future (`get()` inside a callback)
    counts as blocked, and if work is queued and every worker is blocked another one starts
    (up to MAX_WORKERS), so a callback that waits on something another callback resolves
    still ends. The queue holds one entry per resolved future with callbacks: it is bounded
    by the calls the program has made. Workers beyond the first leave after IDLE_S idle."""

    MAX_WORKERS = 32
    IDLE_S = 5.0

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._queue: "collections.deque[tuple[Future, list]]" = collections.deque()
        self._workers = 0  # alive
        self._idle = 0     # waiting for work
        self._blocked = 0  # inside a callback, waiting on a future
        self._local = threading.local()

    def submit(self, fut: Future, callbacks: list) -> None:
        """Queue `callbacks` of the resolved `fut` (any thread; never blocks)."""
        with self._cv:
            self._queue.append((fut, callbacks))
            if self._idle:
                self._cv.notify()
            else:
                self._grow()

    def _grow(self) -> None:
        """Start a worker if none is free to take the queue (lock held)."""
        if self._workers - self._blocked - self._idle <= 0 and self._workers < self.MAX_WORKERS:
            self._workers += 1
            threading.Thread(target=self._work, name="runtime-callbacks", daemon=True).start()

    def on_worker(self) -> bool:
        """Whether the calling thread is one of these workers."""
        return getattr(self._local, "worker", False)

    @contextlib.contextmanager
    def blocked(self) -> Iterator[None]:
        """The calling worker waits on a future: let another take the queue."""
        with self._cv:
            self._blocked += 1
            if self._queue and not self._idle:
                self._grow()
        try:
            yield
        finally:
            with self._cv:
                self._blocked -= 1

    def _work(self) -> None:
        self._local.worker = True
        while True:
            with self._cv:
                while not self._queue:
                    self._idle += 1
                    woke = self._cv.wait(self.IDLE_S)
                    self._idle -= 1
                    if not woke and not self._queue and self._workers > 1:
                        self._workers -= 1
                        return
                fut, callbacks = self._queue.popleft()
            for fn in callbacks:
                _run_callback(fn, fut)

    def _after_fork(self) -> None:
        """In a forked child: no worker thread came along."""
        self._cv = threading.Condition(threading.Lock())
        self._queue.clear()
        self._workers = self._idle = self._blocked = 0


_callbacks = _CallbackWorkers()
os.register_at_fork(after_in_child=_callbacks._after_fork)
