"""A limit fails one call, at the call site, with a clear error; it never kills an actor's
thread, closes a connection or hangs a call (docs/transport.md, "Limits")."""

from __future__ import annotations

import numpy as np
import pytest

import runtime
from runtime import ActorError, Channel, MessageTooLargeError, this_host
from _seam_actors import Holder, Worker

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def workers():
    with runtime.configured(max_message_bytes=1 << 20):  # the procs take it at spawn
        pm = this_host().spawn_procs(per_host={"procs": 2}, name="limits")
        m = pm.spawn("workers", Worker)
        m.initialized.get(timeout=30)
    yield m
    pm.stop().get(timeout=15)


def test_any_number_of_arrays_is_an_ordinary_answer_and_argument(workers):
    """A state_dict of 1,200 tensors (more frames than one message carries): answered, and
    sent back as an argument, as any other value."""
    one = workers.slice(procs=0)
    state = one.many_arrays.call_one(1200).get(timeout=30)
    assert len(state) == 1200 and float(state["layer1199.weight"][0]) == 1199.0
    assert isinstance(state["layer0.weight"], np.ndarray)
    expected = float(sum(3 * i for i in range(1200)))
    assert one.total.call_one(state).get(timeout=30) == expected
    assert list(workers.total.call(state).get(timeout=30).values()) == [expected, expected]
    assert list(workers.rank.call().get(timeout=10).values()) == [0, 1]


def test_an_error_over_the_message_limit_fails_its_call_only(workers):
    """An endpoint raises with a 3 MB message under a 1 MiB limit: the call fails with an
    ActorError carrying the start of the text; the actor answers the next call."""
    one = workers.slice(procs=1)
    with pytest.raises(ActorError) as e:
        one.big_error.call_one(3_000_000).get(timeout=20)
    assert "xxxx" in str(e.value) and "more characters" in str(e.value)
    assert len(str(e.value)) < 1 << 20
    assert one.rank.call_one().get(timeout=10) == 0


def test_a_port_send_over_the_limit_fails_at_the_call_site(workers):
    """Port.send of 3 MB under a 1 MiB limit: MessageTooLargeError where it is sent (the
    endpoint that sends), not a dropped connection; a small value still arrives."""
    port, receiver = Channel.open()
    one = workers.slice(procs=0)
    with pytest.raises(ActorError, match="MessageTooLargeError|over the message limit"):
        one.send_to.call_one(port, 3_000_000).get(timeout=20)
    assert one.send_to.call_one(port, 10).get(timeout=10) == "sent"
    assert receiver.recv().get(timeout=10) == "y" * 10


def test_spawn_arguments_over_the_limit_fail_at_spawn(workers):
    """spawn() with 3 MB of arguments under a 1 MiB limit raises MessageTooLargeError at
    once; the procs keep answering."""
    with runtime.configured(max_message_bytes=1 << 20):
        with pytest.raises(MessageTooLargeError, match="spawn"):
            workers.proc_mesh.spawn("too_big", Holder, b"z" * 3_000_000)
    small = workers.proc_mesh.spawn("small", Holder, b"z" * 1000)
    assert list(small.held.call().get(timeout=30).values()) == [1000, 1000]
    assert list(workers.rank.call().get(timeout=10).values()) == [0, 1]


def test_a_receiver_started_under_a_smaller_limit_still_takes_the_message(workers):
    """The procs started under 1 MiB; this controller now allows 64 MiB and sends 8 MB:
    the message arrives (a receiver never drops a connection for one message's size)."""
    blob = np.ones(8_000_000, dtype=np.uint8)
    with runtime.configured(max_message_bytes=64 << 20):
        total = workers.slice(procs=1).total.call_one({"b": blob}).get(timeout=30)
    assert total == 8_000_000.0
    assert list(workers.rank.call().get(timeout=10).values()) == [0, 1]


def test_an_answer_on_the_data_plane_counts_if_its_proc_dies_next():
    """An 8 MB answer under a 4 MiB limit stays on the proc's data plane for the caller to
    read; the proc is killed by the next call: the answer was sent (its send returns once
    the caller has it), so it counts, and only the killing call fails."""
    with runtime.configured(max_message_bytes=4 << 20):
        pm = this_host().spawn_procs(per_host={"procs": 1}, name="bulkdeath")
        try:
            m = pm.spawn("w", Worker)
            m.initialized.get(timeout=30)
            answer = m.blob.call_one(8_000_000)
            death = m.exit_now.call_one(9)
            assert len(answer.get(timeout=60)) == 8_000_000
            with pytest.raises(runtime.SupervisionError):
                death.get(timeout=60)
        finally:
            pm.stop().get(timeout=30)
