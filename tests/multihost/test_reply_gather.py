"""Replies gathered per host (gather_replies): a host agent sends the replies of its procs to
one call() back as one message; values, errors and deaths are those of ungathered calls."""
from __future__ import annotations

import os
import sys
import time

import cloudpickle
import pytest

import runtime
from runtime import Actor, ActorError, Port, SupervisionError, current_rank, endpoint
from runtime.job import LocalJob

pytestmark = pytest.mark.timeout(120)


class Ranked(Actor):
    @endpoint
    def rank(self) -> int:
        return current_rank().rank

    @endpoint
    def blob(self, n: int) -> bytes:
        return bytes([current_rank().rank]) * n

    @endpoint
    def fail_on(self, bad: int, release: str) -> int:
        """Rank `bad` raises; the others answer once the file `release` exists (60 s at
        most)."""
        r = current_rank().rank
        if r == bad:
            raise ValueError(f"rank {r} refuses")
        deadline = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.01)
        return r

    @endpoint
    def die_on(self, bad: int) -> int:
        if current_rank().rank == bad:
            os._exit(7)
        return current_rank().rank


class Answering(Actor):
    @endpoint(explicit_response_port=True)
    def add(self, port: Port, b: int) -> None:
        port.send(current_rank().rank + b)


cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def mesh():
    job = LocalJob(hosts=2, progress=False)
    try:
        procs = job.state().hosts.spawn_procs(per_host={"procs": 3})
        yield procs
    finally:
        job.cleanup()


def _received(fn, calls: int) -> int:
    stats = runtime.current_runtime().stats
    before = stats["received"]
    for _ in range(calls):
        fn()
    return stats["received"] - before


def test_gathered_call_gives_every_value_in_one_message_per_host(mesh):
    a = mesh.spawn("ranked", Ranked)
    a.initialized.get(timeout=60)
    with runtime.configured(gather_replies="on"):
        assert list(a.rank.call().get(timeout=30).values()) == list(range(6))
        blobs = a.blob.call(40_000).get(timeout=30)  # bodies larger than a head frame
        assert [b[:1] for b in blobs.values()] == [bytes([r]) for r in range(6)]
        assert all(len(b) == 40_000 for b in blobs.values())
        gathered = _received(lambda: a.rank.call().get(timeout=30), 30)
    with runtime.configured(gather_replies="off"):
        plain = _received(lambda: a.rank.call().get(timeout=30), 30)
    # 6 replies per call without gathering, 2 (one per host) with it; heartbeats come on top
    assert plain >= 30 * 6
    assert gathered < 30 * 6 * 0.6, (gathered, plain)
    a.stop().get(timeout=30)


def test_an_error_is_not_held_back_by_slow_ranks(mesh, tmp_path):
    a = mesh.spawn("failing", Ranked)
    a.initialized.get(timeout=60)
    release = tmp_path / "release"
    with runtime.configured(gather_replies="on"):
        # the other ranks answer only after the error has arrived: it cannot wait for them
        with pytest.raises(ActorError, match="rank 4 refuses"):
            a.fail_on.call(4, str(release)).get(timeout=30)
        release.touch()
    a.stop().get(timeout=30)


def test_explicit_response_port_endpoints_are_not_gathered(mesh):
    # their answer goes through a Port the handler may hand to anyone: never via the agent
    a = mesh.spawn("answering", Answering)
    a.initialized.get(timeout=60)
    with runtime.configured(gather_replies="on"):
        assert list(a.add.call(10).get(timeout=30).values()) == list(range(10, 16))
    a.stop().get(timeout=30)


def test_a_proc_that_dies_fails_a_gathered_call(mesh):  # last: it kills a proc of `mesh`
    a = mesh.spawn("dying", Ranked)
    a.initialized.get(timeout=60)
    with runtime.configured(gather_replies="on"):
        with pytest.raises(SupervisionError):
            a.die_on.call(1).get(timeout=30)

