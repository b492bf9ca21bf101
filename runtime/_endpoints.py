"""How an actor runs the endpoint kinds beyond a plain call (private; used by `proc`):
explicit response ports, `as_endpoint` calls of plain methods, and `@concurrent_endpoint`
tasks interleaved on the actor's event loop. Runs on the actor's own thread.

Layer 6 (process roles, below `proc`): imports actor, channel and the basics.
"""

from __future__ import annotations

import queue
from typing import TYPE_CHECKING, Any, Optional

from .actor import EndpointDef
from .channel import Port
from .errors import ActorError, SupervisionError, actor_failed_message

if TYPE_CHECKING:
    import asyncio

    from ._actor_instance import ActorInstance


class Mailbox(queue.SimpleQueue):
    """An actor's mailbox: a SimpleQueue whose `put` an actor with concurrent endpoints
    replaces (on the instance) with one that also wakes its event loop."""

    def put(self, item: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        queue.SimpleQueue.put(self, item)


def loop_has_work(a: "ActorInstance") -> bool:
    """Whether the actor's event loop has tasks that are not done (concurrent endpoints, or
    tasks endpoints started with asyncio.create_task)."""
    import asyncio  # here, not at import: most procs never need it

    if a.tasks:
        return True
    return any(not t.done() for t in asyncio.all_tasks(a._aloop))


def install_waker(a: "ActorInstance") -> None:
    """Make `a.mailbox.put` wake the actor's event loop while it runs tasks between
    messages (installed on first need; a put racing with it is seen by the empty() check)."""
    a.waker = True
    mailbox = a.mailbox
    plain_put = Mailbox.put

    def put(item: Any) -> None:
        plain_put(mailbox, item)
        wake = a.wake
        if wake is not None:
            try:
                a.event_loop().call_soon_threadsafe(_set_done, wake)
            except RuntimeError:  # the loop was closed meanwhile
                pass

    mailbox.put = put  # type: ignore[method-assign]


def _set_done(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


def adhoc_endpoint(a: "ActorInstance", h: Any) -> Optional[EndpointDef]:
    """The endpoint of an `as_endpoint(mesh.method)` call: a plain public method of the
    actor's class, marked so by the caller (None if this call is not one)."""
    e = h.extra
    if not isinstance(e, dict) or "as" not in e or h.method.startswith("_"):
        return None
    fn = getattr(type(a.instance), h.method, None)
    if fn is None or not callable(fn) or isinstance(fn, EndpointDef):
        return None
    return EndpointDef(fn, explicit_response_port=e["as"] == "port")


def response_port(a: "ActorInstance", h: Any) -> Port:
    """The Port an explicit-response-port endpoint receives: it answers this call."""
    return Port(h.reply, h.port, a.rank)


def is_fatal(ep: EndpointDef, exc: BaseException) -> bool:
    """An exception that fails the actor instead of going to the caller: any escaping an
    explicit-response-port endpoint (it answers through its port), and a BaseException
    that is not an Exception (SystemExit, ...); KeyboardInterrupt (Ctrl-C on the caller's
    side interrupts remote calls) goes to the caller."""
    if isinstance(exc, KeyboardInterrupt):
        return False
    return ep.explicit_response_port or not isinstance(exc, Exception)


def start_concurrent(a: "ActorInstance", ep: EndpointDef, h: Any, args: tuple,
                     kwargs: dict) -> None:
    """Start a concurrent endpoint as a task on the actor's event loop; it runs whenever
    the loop runs (between messages, and while other async endpoints await)."""
    loop = a.event_loop()
    coro = ep.fn(a.instance, *args, **kwargs)
    task = loop.create_task(_run(a, ep, h, coro), name=ep.name)  # the name says what runs
    a.tasks.add(task)
    task.add_done_callback(a.tasks.discard)


async def _run(a: "ActorInstance", ep: EndpointDef, h: Any, coro: Any) -> None:
    import asyncio  # here, not at import: most procs never need it

    try:
        result = await coro
    except asyncio.CancelledError:
        if h.port and not ep.explicit_response_port:
            a._reply_error(h, ActorError(f"{ep.name}() was cancelled (the actor stopped)",
                                         mesh=a.name, rank=a.rank, endpoint=ep.name))
        raise
    except BaseException as e:  # noqa: BLE001 - an ActorError to the caller, or the actor
        a.report_error(h, ep, e)  # fails (an explicit-port endpoint, SystemExit, ...), as in
        return                    # Monarch
    if h.port and not ep.explicit_response_port:
        a._send_result(h, ep.name, result)


def wait_idle(a: "ActorInstance") -> None:
    """Run the actor's event loop (its tasks) until a message arrives or no task is left:
    as in Monarch, an actor's asyncio loop keeps running between messages."""
    import asyncio  # here, not at import: most procs never need it
    loop = a.event_loop()
    mailbox = a.mailbox
    if not a.waker:
        install_waker(a)
    while mailbox.empty():
        pending = {t for t in asyncio.all_tasks(loop) if not t.done()}
        if not pending:
            return
        wake = loop.create_future()
        a.wake = wake
        if not mailbox.empty():  # arrived before the waker could see `wake`
            a.wake = None
            break
        try:
            loop.run_until_complete(asyncio.wait({wake, *pending},
                                                 return_when=asyncio.FIRST_COMPLETED))
        finally:
            a.wake = None


def cancel_all(a: "ActorInstance", every_task: bool = False) -> None:
    """Cancel the actor's concurrent tasks (before `__cleanup__`), or with `every_task` all
    tasks of its loop (after it), and wait for them."""
    import asyncio  # here, not at import: most procs never need it
    if a._aloop is None:
        return
    loop = a._aloop
    tasks = list(a.tasks) if not every_task else \
        [t for t in asyncio.all_tasks(loop) if not t.done()]
    if not tasks:
        return
    for t in tasks:
        t.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def failed_reply(a: "ActorInstance", cause: str) -> SupervisionError:
    """What a call to a failed actor raises at its caller."""
    cls_name = type(a.instance).__name__ if a.instance is not None else "actor"
    ctx = getattr(a, "context", None)
    return SupervisionError(actor_failed_message(cls_name, a.name, a.rank, cause,
                                                 str(ctx) if ctx is not None else ""))
