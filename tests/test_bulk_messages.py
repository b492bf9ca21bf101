"""Arguments and results over MONARCH_MAX_MESSAGE_BYTES travel over the data plane instead
of failing (as Monarch returns gigabytes of tensors from an endpoint): the limit is set to
4 MiB here and 16-24 MiB arrays go both ways; what cannot travel that way fails clearly."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import runtime
from runtime import Actor, MessageTooLargeError, endpoint, this_host
from runtime.transport import bulk
from runtime.transport.serialization import dumps, loads

pytestmark = pytest.mark.timeout(120)
LIMIT = 4 << 20


class Big(Actor):
    @endpoint
    def echo_sum(self, t: torch.Tensor, a: np.ndarray) -> tuple:
        return float(t.double().sum()), float(a.sum()), t.dtype, a.shape

    @endpoint
    def make(self, n: int, seed: int) -> dict:
        g = torch.Generator().manual_seed(seed)
        return {"t": torch.rand(n, generator=g), "list": [np.arange(n // 2), "tag"]}

    @endpoint
    def pair(self, n: int) -> tuple:
        return torch.full((n,), 1.0), torch.full((n,), 2.0)

    @endpoint
    def make_bytes(self, n: int) -> bytes:
        return b"x" * n  # in-band pickle data: cannot be left on the data plane

    @endpoint
    def rdma_buffers(self) -> int:
        from runtime.rdma.server import current_server

        s = current_server()
        return 0 if s is None else len(s.registry._live)


@pytest.fixture(scope="module")
def actors():
    with runtime.configured(max_message_bytes=LIMIT):
        pm = this_host().spawn_procs(per_host={"procs": 2}, name="bulk")
        yield pm.spawn("big", Big)
        pm.stop().get(timeout=30)


def test_offload_and_materialize_round_trip_in_process():
    arr = np.arange(3 << 20, dtype=np.int64)  # 24 MiB
    body, bufs = dumps({"a": arr, "small": np.ones(4)})
    moved = bulk.offload(body, bufs, LIMIT, drop_on_read=True)
    assert moved is not None
    body2, bufs2, held = moved
    assert bulk.is_bulk(body2) and sum(memoryview(b).nbytes for b in bufs2) < LIMIT
    got = loads(body2, bufs2)
    assert np.array_equal(got["a"], arr) and got["small"].tolist() == [1.0] * 4
    bulk.release(held)
    assert bulk.offload(b"x" * (LIMIT + 1), [], LIMIT, drop_on_read=False) is None


def _own_buffers() -> set:
    from runtime.rdma.server import current_server

    server = current_server()
    return set() if server is None else set(server.registry._live)


def test_large_arguments_and_results_travel(actors):
    before = _own_buffers()  # other tests of this process may hold buffers of their own
    with runtime.configured(max_message_bytes=LIMIT):
        t = torch.rand(4 << 20)  # 16 MiB
        a = np.arange(3 << 20, dtype=np.float64)  # 24 MiB
        got = actors.echo_sum.call(t, a).get(timeout=60)
        for s_t, s_a, dtype, shape in got.values():
            assert s_t == pytest.approx(float(t.double().sum()))
            assert s_a == float(a.sum()) and dtype == torch.float32 and shape == a.shape
        out = actors.slice(procs=1).make.call_one(6 << 20, seed=3).get(timeout=60)
        want = torch.rand(6 << 20, generator=torch.Generator().manual_seed(3))
        assert torch.equal(out["t"], want)
        assert out["list"][1] == "tag" and np.array_equal(out["list"][0], np.arange(3 << 20))
        many = actors.make.call(5 << 20, seed=1).get(timeout=60)
        assert all(v["t"].shape == (5 << 20,) for v in many.values())
        # nothing left exported: the caller dropped each result buffer after reading it,
        # and released its own argument buffers when the call returned
        deadline = time.monotonic() + 10  # the drops after reading are asynchronous
        while set(actors.rdma_buffers.call().get(timeout=30).values()) != {0}:
            assert time.monotonic() < deadline, "result buffers were not dropped"
            time.sleep(0.05)
        assert _own_buffers() <= before


def test_result_of_buffers_each_under_the_limit_but_over_it_together(actors):
    """Monarch's 4 GB result (two 2e9-byte tensors, each under the 2 GiB limit) at 1/512
    scale: two 3.8 MiB tensors under a 4 MiB limit; the larger goes on the data plane."""
    n = (LIMIT - (256 << 10)) // 4
    with runtime.configured(max_message_bytes=LIMIT):
        ones, twos = actors.slice(procs=0).pair.call_one(n).get(timeout=60)
    assert 2 * 4 * n > LIMIT and ones.shape == twos.shape == (n,)
    assert bool((ones == 1).all()) and bool((twos == 2).all())


def test_what_cannot_move_fails_clearly(actors):
    with runtime.configured(max_message_bytes=LIMIT):
        with pytest.raises(MessageTooLargeError, match="broadcast and send cannot"):
            actors.echo_sum.broadcast(torch.rand(2 << 20), np.ones(1))
        with pytest.raises(MessageTooLargeError, match="pickled part alone"):
            actors.echo_sum.call(b"y" * (LIMIT + 10), np.ones(1))
        with pytest.raises(runtime.ActorError, match="pickled part alone is too large"):
            actors.slice(procs=0).make_bytes.call_one(LIMIT + 10).get(timeout=60)
