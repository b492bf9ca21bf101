"""Monarch's Future constructor and combinator through `runtime.Future`: Future(coro=...),
Future.gather (order, errors, return_exceptions, consumption), from sync code and asyncio."""

from __future__ import annotations

import asyncio

import pytest

from runtime import Future
from runtime.future import resolved

pytestmark = pytest.mark.timeout(30)


async def _value(v):
    await asyncio.sleep(0)
    return v


async def _boom(msg):
    raise ValueError(msg)


def test_future_of_a_coroutine_get_and_await():
    assert Future(coro=_value(3)).get() == 3
    f = Future(coro=_value(4))
    assert asyncio.run(_await(f)) == 4
    assert f.get() == 4 and f.done()  # the value stays
    with pytest.raises(ValueError, match="nope"):
        Future(coro=_boom("nope")).get()


async def _await(f):
    return await f


def test_monarchs_private_from_coro_is_future_of_coro():
    """Monarch's tests build futures with `Future._from_coro(coro)`: the same lazy future."""
    f = Future._from_coro(_value(5))
    assert isinstance(f, Future) and not f.done()
    assert f.get() == 5 and asyncio.run(_await(Future._from_coro(_value(6)))) == 6


def test_get_from_inside_a_running_loop_runs_the_coroutine_elsewhere():
    async def main():
        return Future(coro=_value(5)).get(timeout=10)  # a blocking get inside a loop

    assert asyncio.run(main()) == 5


def test_gather_in_order_with_errors():
    assert Future.gather(*[Future(coro=_value(i)) for i in range(5)]).get() == [0, 1, 2, 3, 4]
    assert Future.gather().get() == []
    with pytest.raises(ValueError, match="boom"):
        Future.gather(Future(coro=_value(1)), Future(coro=_boom("boom"))).get()
    out = Future.gather(Future(coro=_value(1)), Future(coro=_boom("b")),
                        return_exceptions=True).get()
    assert out[0] == 1 and isinstance(out[1], ValueError)
    assert asyncio.run(_await(Future.gather(Future(coro=_value(7)), resolved(8)))) == [7, 8]


def test_gather_mixes_runtime_futures_and_consumes_coroutine_ones():
    pending: Future = Future()
    g = Future.gather(pending, Future(coro=_value(2)))
    pending.set_result(1)
    assert g.get(timeout=10) == [1, 2]
    assert pending.get() == 1  # a runtime future is only awaited, not consumed
    f = Future(coro=_value(1))
    assert Future.gather(f).get(timeout=10) == [1]
    with pytest.raises(ValueError, match="consumed by Future.gather"):
        f.get()
    ran = Future(coro=_value(1))
    ran.get()
    with pytest.raises(ValueError, match="already been consumed"):
        Future.gather(ran)
    c = _value(1)
    with pytest.raises(TypeError, match="takes Futures"):
        Future.gather(c)  # type: ignore[arg-type]
    c.close()
