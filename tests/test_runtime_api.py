"""The runtime's public API with real processes: meshes, adverbs, slicing, errors."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

import runtime
from runtime import (Accumulator, ActorError, Channel, MeshStoppedError, SerializationError,
                     Future, ValueMesh, this_host)
from _actors import Echo, FailingInit

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def procs():
    pm = this_host().spawn_procs(per_host={"procs": 4}, name="api")
    yield pm
    pm.stop().get(timeout=15)


@pytest.fixture(scope="module")
def echo(procs):
    m = procs.spawn("echo", Echo)
    m.initialized.get(timeout=30)
    return m


def test_call_returns_value_mesh(echo):
    vm = echo.whoami.call().get(timeout=10)
    assert isinstance(vm, ValueMesh) and len(vm) == 4
    ranks = [v["rank"] for v in vm.values()]
    assert ranks == [0, 1, 2, 3]
    assert vm.item(procs=2)["coords"] == {"procs": 2}
    assert all(v["size"] == {"procs": 4} and v["name"] == "echo" for v in vm.values())
    assert len({v["pid"] for v in vm.values()}) == 4


def test_spawn_procs_shape_and_procs_info(procs):
    assert procs.sizes == {"procs": 4} and procs.size("procs") == 4
    procs.initialized.get(timeout=10)
    assert [p.rank for p in procs.procs] == [0, 1, 2, 3]
    assert all(p.pid > 0 for p in procs.procs)


def test_call_one_and_slices(echo):
    one = echo.slice(procs=2)
    assert one.whoami.call_one().get(timeout=10)["rank"] == 2
    with pytest.raises(ValueError, match="exactly one actor"):
        echo.ping.call_one(1)
    part = echo.slice(procs=slice(1, 3))
    vm = part.whoami.call().get(timeout=10)
    assert [v["rank"] for v in vm.values()] == [1, 2]
    assert part.sizes == {"procs": 2}
    # rename / split / flatten keep addressing the same actors
    ren = echo.rename(procs="workers")
    assert ren.sizes == {"workers": 4}
    assert ren.slice(workers=3).whoami.call_one().get(timeout=10)["rank"] == 3
    sp = echo.split(procs=("a", "b"), b=2)
    assert sp.sizes == {"a": 2, "b": 2}
    assert [v["rank"] for v in sp.slice(b=1).whoami.call().get(timeout=10).values()] == [1, 3]
    assert echo.flatten("all").size() == 4 and echo.extent == {"procs": 4}


def test_async_endpoint_and_await_in_running_loop(echo):
    async def main():
        v = await echo.slice(procs=0).aping.call_one(5)
        vm = await echo.aping.call(6)
        return v, list(vm.values())

    v, vals = asyncio.run(main())
    assert v == ("async", 5) and vals == [("async", 6)] * 4


def test_one_actor_mixes_sync_and_async_endpoints(echo):
    """A deliberate difference (docs/porting.md): Monarch refuses at spawn an actor with
    both `def` and `async def` endpoints; here both kinds run, one message at a time."""
    one = echo.slice(procs=1)
    assert one.aping.call_one(1).get(timeout=10) == ("async", 1)
    assert one.ping.call_one(2).get(timeout=10) == 2
    assert one.aping.call_one(3).get(timeout=10) == ("async", 3)


def test_choose_spreads_over_actors(echo):
    got = [echo.whoami.choose().get(timeout=10)["rank"] for _ in range(8)]
    assert set(got) == {0, 1, 2, 3}


def test_stream_yields_in_arrival_order(echo):
    futs = list(echo.sleep.stream(0.0))
    assert len(futs) == 4
    assert [f.get(timeout=10) for f in futs] == [0.0] * 4
    # a slow rank comes last
    part = echo.slice(procs=slice(0, 2))
    fast_first = list(part.busy_loop.stream(0.0))
    assert all(isinstance(f.get(timeout=10), int) for f in fast_first)


def test_broadcast_is_fire_and_forget_and_ordered(echo):
    one = echo.slice(procs=1)
    for i in range(200):
        one.record.broadcast(i)
    assert one.seen_list.call_one().get(timeout=10)[-200:] == list(range(200))


def test_future_timeout_does_not_consume(echo):
    fut = echo.slice(procs=3).sleep.call_one(0.5)
    with pytest.raises(TimeoutError):
        fut.get(timeout=0.05)
    assert fut.get(timeout=10) == 0.5


def test_unknown_endpoint_is_attribute_error(echo):
    with pytest.raises(AttributeError, match=r"Echo has no endpoint 'nope' \(its endpoints: .*ping"):
        echo.nope


def test_bad_arguments_raise_before_sending(echo):
    with pytest.raises(TypeError, match="missing a required argument: 'msg'"):
        echo.boom.call()
    with pytest.raises(TypeError, match="unexpected keyword"):
        echo.ping.call(y=1)


def test_unpicklable_argument_is_named(echo):
    with pytest.raises(SerializationError, match="argument 'x' of Echo.ping"):
        echo.ping.call(threading.Lock())


def test_endpoint_exception_is_actor_error_and_actor_survives(echo):
    with pytest.raises(ActorError) as ei:
        echo.slice(procs=0).boom.call_one("kaput").get(timeout=10)
    e = ei.value
    assert "ValueError: kaput" in str(e) and "raise ValueError(msg)" in e.remote_traceback
    assert e.rank == 0 and e.endpoint == "boom"
    assert echo.slice(procs=0).ping.call_one(1).get(timeout=10) == 1


def test_unpicklable_return_value_is_actor_error(echo):
    with pytest.raises(ActorError, match="unpicklable.*cannot be pickled"):
        echo.slice(procs=0).unpicklable.call_one().get(timeout=10)
    assert echo.slice(procs=0).ping.call_one(2).get(timeout=10) == 2


def test_numpy_arrays_both_ways(echo):
    a = np.arange(1 << 20, dtype=np.float32)
    total, writable = echo.slice(procs=0).array_sum.call_one(a).get(timeout=20)
    assert total == float(a.sum()) and writable
    out = echo.slice(procs=1).make_array.call_one(1000).get(timeout=10)
    assert out.shape == (1000,) and out.flags.writeable


def test_torch_tensor_argument(echo):
    torch = pytest.importorskip("torch")
    t = torch.ones(1000)
    total, _ = echo.slice(procs=0).array_sum.call_one(t).get(timeout=60)
    assert total == 1000.0


def test_ports_and_channels(echo):
    port, recv = Channel.open()
    echo.send_to_port.call(port, "hi").get(timeout=10)
    got = sorted(recv.recv().get(timeout=10) for _ in range(4))
    assert got == [(0, "hi"), (1, "hi"), (2, "hi"), (3, "hi")]
    assert echo.slice(procs=0).open_channel_and_wait.call_one().get(timeout=10) == "self-sent"


def test_accumulator(echo):
    acc = Accumulator(echo.ping, 0, lambda a, b: a + b)
    assert acc.accumulate(5).get(timeout=10) == 20
    assert Accumulator(echo.ping, [], lambda a, r: a + [r]).accumulate(x=7) \
        .get(timeout=10) == [7] * 4  # one value per actor, keyword arguments too


def test_an_associative_accumulator_folds_the_same_value(echo):
    """associative=True on procs that answer the caller directly (no host agent gathers
    here): the caller folds, and the result is the plain fold's."""
    import operator

    acc = Accumulator(echo.ping, 100, operator.add, associative=True)
    assert acc.accumulate(5).get(timeout=10) == 120
    assert acc.accumulate(x=1).get(timeout=10) == 104  # the same accumulator again


def test_an_associative_accumulator_needs_a_combine_that_pickles(echo):
    import threading

    lock = threading.Lock()
    with pytest.raises(SerializationError, match="associative=True.*must pickle"):
        Accumulator(echo.ping, 0, lambda a, b: (lock, a + b)[1], associative=True)
    with pytest.raises(TypeError, match="combine must be callable"):
        Accumulator(echo.ping, 0, 42)


class _Streaming:
    """An endpoint stand-in: `stream()` records its arguments and yields given futures."""

    def __init__(self, futures):
        self.futures, self.calls = futures, []

    def stream(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return iter(self.futures)


def _resolved(value):
    async def coro():
        return value
    return Future(coro=coro())


def test_accumulator_folds_over_stream_in_order():
    """As Monarch: a fold of `endpoint.stream(...)` from identity, left to right in stream
    order, the identity when nothing streams; futures resolved later (or coroutine-backed
    ones) are waited for; the first error fails the fold."""
    ep = _Streaming([_resolved(1), _resolved(2), _resolved(3)])
    assert Accumulator(ep, [], lambda a, r: a + [r]).accumulate("a", k=1).get(timeout=5) \
        == [1, 2, 3]
    assert ep.calls == [(("a",), {"k": 1})]
    assert Accumulator(_Streaming([]), 42, lambda a, r: a + r).accumulate().get(5) == 42
    late = Future("late")
    fut = Accumulator(_Streaming([_resolved(1), late]), 0, lambda a, r: a + r).accumulate()
    assert not fut.done()
    late.set_result(10)
    assert fut.get(timeout=5) == 11
    bad = Future("bad")
    bad.set_exception(ValueError("rank 1 failed"))
    with pytest.raises(ValueError, match="rank 1 failed"):
        Accumulator(_Streaming([_resolved(1), bad]), 0, lambda a, r: a + r).accumulate().get(5)


def test_actor_to_actor_calls(procs, echo):
    other = procs.spawn("other", Echo)
    vals = echo.slice(procs=0).call_other.call_one(other, "x").get(timeout=20)
    assert vals == ["x"] * 4
    other.stop().get(timeout=10)


def test_two_actor_meshes_share_a_proc_mesh(procs, echo):
    second = procs.spawn("second", Echo, "two")
    a = echo.whoami.call().get(timeout=10)
    b = second.whoami.call().get(timeout=10)
    assert [v["pid"] for v in a.values()] == [v["pid"] for v in b.values()]
    second.stop().get(timeout=10)
    with pytest.raises(MeshStoppedError):
        second.ping.call(1)


def test_init_error_surfaces_at_initialized_and_first_use(procs):
    bad = procs.slice(procs=slice(0, 2)).spawn("bad", FailingInit)
    with pytest.raises(runtime.SupervisionError, match="init exploded"):
        bad.initialized.get(timeout=20)
    with pytest.raises(runtime.SupervisionError, match="__init__"):
        bad.ping.call()


def test_spawn_bad_input(procs):
    with pytest.raises(TypeError, match="not an Actor subclass"):
        procs.spawn("x", dict)
    with pytest.raises(TypeError, match="__init__"):
        procs.spawn("x", Echo, 1, 2, 3)
    with pytest.raises(ValueError, match="positive"):
        this_host().spawn_procs(per_host={"procs": 0})


def test_remote_output_is_forwarded_with_prefix(echo):
    got = []
    done = threading.Event()
    rt = runtime.get_runtime()

    def sink(label, stream, text):
        got.append((label, stream, text))
        if sum("-libc" in t for _, _, t in got) >= 1 and sum("-err" in t for _, _, t in got) >= 1:
            done.set()

    rt.set_output_sink(sink)
    try:
        echo.slice(procs=1).say.call_one("hello").get(timeout=10)
        assert done.wait(5)
    finally:
        rt.set_output_sink(None)
    text = "".join(t for _, _, t in got)
    for needle in ("hello\n", "hello-err", "hello-fd1", "hello-libc"):
        assert needle in text
    assert ("echo 1", "stdout") in {(lbl, s) for lbl, s, t in got if "hello\n" in t}
    assert any(s == "stderr" and "hello-err" in t for _, s, t in got)


def test_workers_do_not_import_torch_until_needed():
    from _actors import Probe

    with this_host().spawn_procs(per_host={"procs": 1}) as pm:
        p = pm.spawn("probe", Probe)
        assert "torch" not in p.modules.call_one().get(timeout=20)


def test_classes_defined_in_main_travel_by_value(tmp_path):
    import subprocess
    import sys
    import textwrap

    root = __import__("os").path.dirname(__import__("os").path.dirname(__file__))
    script = tmp_path / "main_defined.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {root!r})
        from runtime import Actor, endpoint, this_host

        def helper(x):
            return x * 3

        class Local(Actor):
            @endpoint
            def triple(self, x):
                return helper(x)

        with this_host().spawn_procs(per_host={{"procs": 2}}) as pm:
            m = pm.spawn("local", Local)
            print(list(m.triple.call(7).get(timeout=60).values()))
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[21, 21]"


def test_ctrl_c_cancels_the_wait_and_interrupts_the_remote_call(echo):
    import _thread

    one = echo.slice(procs=0)
    fut = one.busy_loop.call_one(30)
    timer = threading.Timer(0.3, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):  # not the call's answer 30 s later
        fut.get()
    # the remote endpoint was interrupted too: the actor is free again at once
    with pytest.raises(ActorError, match="KeyboardInterrupt"):
        fut.get(timeout=5)
    assert one.ping.call_one("free").get(timeout=5) == "free"


def test_a_setting_configured_while_the_host_agent_started_does_not_outlive_its_block(tmp_path):
    """this_host()'s agent starts inside a `configured(max_message_bytes=4 MiB)` block (its
    environment keeps 4 MiB); a proc spawned after the block gets the setting's value now,
    the default, not the agent's."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    root = str(Path(__file__).resolve().parent.parent)
    script = tmp_path / "limits.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {root!r})
        import runtime
        from runtime import Actor, endpoint, this_host

        class Limit(Actor):
            @endpoint
            def limit(self):
                from runtime.config import config
                return config.max_message_bytes

        with runtime.configured(max_message_bytes=4 << 20):
            with this_host().spawn_procs(per_host={{"procs": 1}}, name="inside") as pm:
                print(pm.spawn("l", Limit).limit.call_one().get(timeout=60))
        with this_host().spawn_procs(per_host={{"procs": 1}}, name="after") as pm:
            print(pm.spawn("l", Limit).limit.call_one().get(timeout=60))
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-2:] == [str(4 << 20), str(2 << 30)], r.stdout
