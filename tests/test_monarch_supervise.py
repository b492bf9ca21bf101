"""Monarch's supervision semantics through the public API: one event per failed rank, in
rank order, each handled by `__supervise__` before the failing call returns to its caller
(and while an async endpoint awaits); an unhandled event fails the owner and reaches its
caller as SupervisionError; Monarch's actor names and `[actor=...]` log prefix."""

from __future__ import annotations

import logging
import time

import pytest

import runtime
from runtime import SupervisionError, context, this_host
from _monarch_supervise_actors import Dies, Owner

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def two_meshes(failures):
    owners = this_host().spawn_procs(per_host={"procs": 1}, name="sup_owners")
    kids = this_host().spawn_procs(per_host={"gpus": 4}, name="sup_kids")
    try:
        yield owners, kids
    finally:
        owners.stop().get(timeout=30)
        kids.stop().get(timeout=30)


def _check_in_rank_order(seen: list[str]) -> None:
    assert len(seen) == 4, seen
    for rank, text in enumerate(seen):
        assert "MeshFailure" in text and f"rank={rank}" in text and "kids" in text, text
        assert f"crashed_ranks=[{rank}]" in text, text  # what Monarch's tests look for


def test_every_rank_is_supervised_in_order_before_the_call_returns(two_meshes):
    owners, kids = two_meshes
    owner = owners.spawn("owner", Owner, kids)
    # the call failed, and by then __supervise__ has seen all four ranks (while it awaited)
    assert owner.fail_kids_and_return.call_one().get(timeout=60) == "raised, seen 4"
    _check_in_rank_order(owner.failures.call_one().get(timeout=30))


def test_supervise_runs_while_an_async_endpoint_awaits(two_meshes):
    owners, kids = two_meshes
    owner = owners.spawn("owner", Owner, kids)
    # broadcast has no reply: the endpoint waits on an asyncio.Event that __supervise__ sets
    assert owner.broadcast_and_wait.call_one().get(timeout=60) >= 1
    _check_in_rank_order(owner.failures.call_one().get(timeout=30))


def test_unhandled_supervise_fails_the_owner_and_its_pending_call(two_meshes, failures):
    owners, kids = two_meshes
    owner = owners.spawn("owner", Owner, kids, handle=False)
    # within 15 s, not after the 20 s sleep: the endpoint was cut short
    with pytest.raises(SupervisionError, match=r"(?s)The actor .* and all its descendants "
                                               r"have failed:.*kids"):
        owner.fail_kids_then_sleep.call_one(20.0).get(timeout=15)
    with pytest.raises(SupervisionError):
        owner.failures.call_one().get(timeout=30)


def test_monarch_actor_names(two_meshes):
    owners, kids = two_meshes
    assert str(context().actor_instance) == "<root>"
    d = kids.spawn("dies", Dies)
    name = d.slice(gpus=1).my_name.call_one().get(timeout=30)
    assert name == "<root>.<_monarch_supervise_actors.Dies dies{'gpus': 1/4}>"
    owner = owners.spawn("own", Owner, kids.slice(gpus=slice(2, 4)))
    kid = owner.kid_names.call_one().get(timeout=30)[1]
    assert kid == ("<root>.<_monarch_supervise_actors.Owner own{'procs': 0/1}>"
                   ".<_monarch_supervise_actors.Dies kids{'gpus': 1/2}>")
    assert d.slice(gpus=0).log_line.call_one().get(timeout=30) == (
        "[actor=<root>.<_monarch_supervise_actors.Dies dies{'gpus': 0/4}>] hello")


def test_log_records_carry_the_actor_prefix(caplog):
    with caplog.at_level(logging.INFO, logger="monarch_test_prefix"):
        logging.getLogger("monarch_test_prefix").info("plain %s", "args")
        logging.getLogger("monarch_test_prefix").info("")
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == ["[actor=<root>] plain args", ""]


def test_actor_prefix_off_through_monarchs_config_flag(caplog, monkeypatch):
    """Monarch's `monarch.actor.config.prefix_python_logs_with_actor = False` (here
    `runtime.config.prefix_python_logs_with_actor`) turns the prefix off (test_instance_name)."""
    import runtime

    monkeypatch.setattr(runtime.config, "prefix_python_logs_with_actor", False)
    with caplog.at_level(logging.INFO, logger="monarch_test_prefix"):
        logging.getLogger("monarch_test_prefix").info("bare")
    assert [r.getMessage() for r in caplog.records] == ["bare"]
