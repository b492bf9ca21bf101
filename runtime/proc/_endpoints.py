"""How an actor runs the endpoint kinds beyond a plain call (private; used by
`_actor_instance`): its asyncio loop and the tasks on it (`ActorLoop`: async endpoints,
`@concurrent_endpoint` tasks interleaved between messages), explicit response ports and
`as_endpoint` calls of plain methods. Runs on the actor's own thread.

Layer 6 (process roles, below `proc`): imports actor, channel and the basics.
"""

from __future__ import annotations

import queue
from typing import TYPE_CHECKING, Any, Optional, Protocol

from ..actor import EndpointDef
from ..channel import Port
from ..errors import SupervisionError, actor_failed_message

if TYPE_CHECKING:
    import asyncio

__all__ = ["ActorPort", "Mailbox", "ActorLoop", "adhoc_endpoint", "response_port", "is_fatal",
           "failed_reply"]


class ActorPort(Protocol):
    """What the helpers below read of the actor they serve (the proc's ActorInstance,
    which calls them): its user object, name and rank."""

    @property
    def instance(self) -> Any: ...

    @property
    def name(self) -> str: ...

    @property
    def rank(self) -> int: ...


class Mailbox(queue.SimpleQueue):
    """An actor's mailbox: a SimpleQueue whose `put` an actor with concurrent endpoints
    replaces (on the instance) with one that also wakes its event loop."""

    def put(self, item: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        queue.SimpleQueue.put(self, item)


class ActorLoop:
    """One actor's asyncio loop (made on first use, run only by the actor's thread) and the
    tasks on it: the async endpoint running, `@concurrent_endpoint` tasks and tasks
    endpoints started, which run between messages and while an async endpoint awaits."""

    def __init__(self, mailbox: Mailbox) -> None:
        self.mailbox = mailbox
        self.loop: Any = None  # the asyncio loop, once made
        self.tasks: set = set()  # running @concurrent_endpoint tasks
        self.in_async = False  # an async endpoint runs on the event loop (it may await)
        self.main_task: Any = None  # that endpoint's task
        self.wake: Any = None  # set while the event loop runs tasks between messages
        self.waker = False  # whether mailbox.put wakes that loop

    def get(self) -> Any:
        """The asyncio loop (made on first use)."""
        if self.loop is None:
            import asyncio

            self.loop = asyncio.new_event_loop()
        return self.loop

    def run(self, coro: Any) -> Any:
        """Run `coro` to its end on the loop (an async `__init__`, `__cleanup__`, ...)."""
        return self.get().run_until_complete(coro)

    def run_endpoint(self, coro: Any) -> Any:
        """Run an async endpoint; supervision events are handled while it awaits."""
        loop = self.get()
        self.main_task = task = loop.create_task(coro)
        self.in_async = True
        try:
            return loop.run_until_complete(task)
        finally:
            self.in_async = False
            self.main_task = None

    def cancel_running(self) -> bool:
        """Cancel the async endpoint running now at its next await (any thread); False if
        none runs."""
        task, loop = self.main_task, self.loop
        if not self.in_async or task is None or loop is None:
            return False
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # the loop closed meanwhile
            return False
        return True

    def call_while_awaiting(self, fn: Any, *args: Any) -> None:
        """Run `fn(*args)` on the loop soon if an async endpoint awaits there (any thread);
        else nothing (the caller's mailbox entry handles it)."""
        loop = self.loop
        if self.in_async and loop is not None:
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop closed meanwhile
                pass

    def has_work(self) -> bool:
        """Whether the loop has tasks that are not done (concurrent endpoints, or tasks
        endpoints started with asyncio.create_task)."""
        import asyncio  # here, not at import: most procs never need it

        if self.loop is None:
            return False
        if self.tasks:
            return True
        return any(not t.done() for t in asyncio.all_tasks(self.loop))

    def install_waker(self) -> None:
        """Make `mailbox.put` wake the loop while it runs tasks between messages (installed
        on first need; a put racing with it is seen by the empty() check)."""
        self.waker = True
        mailbox = self.mailbox
        plain_put = Mailbox.put

        def put(item: Any) -> None:
            plain_put(mailbox, item)
            wake = self.wake
            if wake is not None:
                try:
                    self.get().call_soon_threadsafe(_set_done, wake)
                except RuntimeError:  # the loop was closed meanwhile
                    pass

        mailbox.put = put  # type: ignore[method-assign, assignment]

    def start(self, coro: Any, name: str) -> None:
        """Start `coro` (a concurrent endpoint's call) as a task on the loop; it runs
        whenever the loop runs (between messages, and while other async endpoints await)."""
        task = self.get().create_task(coro, name=name)  # the name says what runs
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def wait_idle(self) -> None:
        """Run the loop (its tasks) until a message arrives or no task is left: as in
        Monarch, an actor's asyncio loop keeps running between messages."""
        import asyncio  # here, not at import: most procs never need it
        loop = self.get()
        mailbox = self.mailbox
        if not self.waker:
            self.install_waker()
        while mailbox.empty():
            pending = {t for t in asyncio.all_tasks(loop) if not t.done()}
            if not pending:
                return
            wake = loop.create_future()
            self.wake = wake
            if not mailbox.empty():  # arrived before the waker could see `wake`
                self.wake = None
                break
            try:
                loop.run_until_complete(asyncio.wait({wake, *pending},
                                                     return_when=asyncio.FIRST_COMPLETED))
            finally:
                self.wake = None

    def cancel_all(self, every_task: bool = False) -> None:
        """Cancel the concurrent tasks (before `__cleanup__`), or with `every_task` all
        tasks of the loop (after it), and wait for them."""
        import asyncio  # here, not at import: most procs never need it
        loop = self.loop
        if loop is None:
            return
        tasks = list(self.tasks) if not every_task else \
            [t for t in asyncio.all_tasks(loop) if not t.done()]
        if not tasks:
            return
        for t in tasks:
            t.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))

    def close(self) -> None:
        """The actor stopped: end every task left, then close the loop."""
        if self.loop is not None:
            self.cancel_all(every_task=True)
            self.loop.close()


def _set_done(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


def adhoc_endpoint(a: ActorPort, h: Any) -> Optional[EndpointDef]:
    """The endpoint of an `as_endpoint(mesh.method)` call: a plain public method of the
    actor's class, marked so by the caller (None if this call is not one)."""
    e = h.extra
    if not isinstance(e, dict) or "as" not in e or h.method.startswith("_"):
        return None
    fn = getattr(type(a.instance), h.method, None)
    if fn is None or not callable(fn) or isinstance(fn, EndpointDef):
        return None
    return EndpointDef(fn, explicit_response_port=e["as"] == "port")


def response_port(a: ActorPort, h: Any) -> Port:
    """The Port an explicit-response-port endpoint receives: it answers this call."""
    return Port(h.reply, h.port, a.rank)


def is_fatal(ep: EndpointDef, exc: BaseException) -> bool:
    """An exception that fails the actor instead of going to the caller: any escaping an
    explicit-response-port endpoint (it answers through its port), and a BaseException
    that is not an Exception (SystemExit, ...); KeyboardInterrupt (Ctrl-C on the caller's
    side interrupts remote calls) and asyncio's CancelledError (a cancelled call) go to the
    caller."""
    if isinstance(exc, KeyboardInterrupt) or type(exc).__name__ == "CancelledError":
        return False  # Ctrl-C or Future.cancel() on the caller's side: the caller's error
    return ep.explicit_response_port or not isinstance(exc, Exception)


def failed_reply(a: ActorPort, cause: str) -> SupervisionError:
    """What a call to a failed actor raises at its caller."""
    cls_name = type(a.instance).__name__ if a.instance is not None else "actor"
    ctx = getattr(a, "context", None)
    return SupervisionError(actor_failed_message(cls_name, a.name, a.rank, cause,
                                                 str(ctx) if ctx is not None else ""))
