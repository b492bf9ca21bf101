"""An idle actor thread reads its proc's inbox and runs a call for itself at once
(runtime/transport/inbox.py, SharedInbox): who reads, order per sender with two actors in
one proc, and the setting that turns it off."""

from __future__ import annotations


import pytest

import runtime
from runtime import this_host

from _actors import Ledger
from _threads import run_in_threads

pytestmark = pytest.mark.timeout(120)


def _reads(m) -> tuple:
    return m.read_by_actors.call_one().get(timeout=30)


@pytest.mark.parametrize("on", [True, False])
def test_an_idle_actor_reads_the_calls_for_it(on):
    with runtime.configured(actor_reads_calls=on):  # procs take the setting at spawn
        pm = this_host().spawn_procs(per_host={"procs": 1}, name=f"reader{int(on)}")
    try:
        m = pm.spawn("counter", Ledger)
        # the I/O thread watches the inbox until it finds an actor reading it: the first
        # calls after the spawn may go its way (the faster they come, the more of them)
        for i in range(10):
            m.add.call_one(1, i).get(timeout=30)
        a0, r0 = _reads(m)
        for i in range(50):
            assert m.add.call_one(0, i).get(timeout=30) == i
        a1, r1 = _reads(m)
        assert r1 - r0 >= 51
        if on:  # the proc's I/O thread still reads heartbeats and anything while busy
            assert a1 - a0 >= 25, (a1 - a0, r1 - r0)
        else:
            assert a1 == a0 == 0
    finally:
        pm.stop().get(timeout=30)


def test_two_actors_in_one_proc_get_their_calls_in_order():
    """Whichever actor thread reads, a call for the other goes to its mailbox; each
    sender's calls to each actor run in the order sent, and a stop comes after them."""
    pm = this_host().spawn_procs(per_host={"procs": 1}, name="tworeaders")
    try:
        a, b = pm.spawn("a", Ledger), pm.spawn("b", Ledger)
        n = 40

        def caller(who: int) -> None:
            futs = []
            for i in range(n):
                futs += [a.add.call_one(who, i), b.add.call_one(who, i)]
                if i % 10 == 0:
                    futs.append(b.nap.call_one(0.005))  # keeps b busy now and then
            for f in futs:
                f.get(timeout=30)

        errors = run_in_threads(caller, 3)
        assert not errors, errors
        for w in range(3):
            assert a.seen_by.call_one(w).get(timeout=30) == list(range(n))
            assert b.seen_by.call_one(w).get(timeout=30) == list(range(n))
        last = b.nap.call_one(0.3)  # queued calls run before a stop, which answers
        b.stop().get(timeout=30)
        assert last.get(timeout=30) == 0.3
        assert a.add.call_one(9, 1).get(timeout=30) == 1  # a still reads and answers
    finally:
        pm.stop().get(timeout=30)
