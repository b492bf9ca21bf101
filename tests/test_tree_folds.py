"""A host agent's fold of a reduced call (runtime/host/folds.py) and the PARTIAL items of its
reply batches (runtime/host/gather.py), as pure logic: no process, no worker thread."""

from __future__ import annotations

import operator
import threading

from runtime.errors import ActorError
from runtime.host.folds import Fold, Folds
from runtime.host.gather import ReplyGather
from runtime.transport import framing
from runtime.transport.framing import Header, Kind
from runtime.transport.serialization import dumps, loads


def _item(src: str, rank: int, body: bytes) -> list:
    return [src, "actor", rank, framing.OK, len(body), 0]


def _value(v: object) -> bytes:
    body, bufs = dumps(v)
    assert not bufs
    return body


def test_a_fold_combines_answers_and_partials_and_says_which_ranks() -> None:
    fold = Fold(operator.add, "here")
    assert fold.add(_item("p1", 1, _value(10)), _value(10), [], None) is None
    assert fold.add(_item("p2", 2, _value(5)), _value(5), [], None) is None
    assert fold.add(_item("agent", 7, _value(100)), _value(100), [],
                    (["p7", "p8"], [7, 8])) is None
    partial, raw = fold.finish()
    body, bufs, procs, ranks = partial
    assert loads(body, bufs) == 115 and raw == []
    assert procs == ["p1", "p2", "p7", "p8"] and ranks == [1, 2, 7, 8]


def test_a_fold_with_nothing_folded_has_no_partial() -> None:
    assert Fold(operator.add, "here").finish() == (None, [])


def test_a_value_the_fold_cannot_read_passes_up_as_it_came() -> None:
    fold = Fold(operator.add, "here")
    bad = b"not a pickle"
    item = _item("p3", 3, bad)
    assert fold.add(item, bad, [], None) is None
    fold.add(_item("p4", 4, _value(1)), _value(1), [], None)
    partial, raw = fold.finish()
    assert raw == [[item, bad, [], None]]
    assert partial[3] == [4]


def test_a_combine_that_raises_is_an_error_item_naming_the_rank() -> None:
    def combine(a: int, b: int) -> int:
        raise ValueError("no")

    fold = Fold(combine, "host-a (pid 1)")
    fold.add(_item("p1", 1, _value(1)), _value(1), [], None)
    item, body = fold.add(_item("p2", 2, _value(2)), _value(2), [], None)
    assert item[2] == 2 and item[3] == framing.ERROR
    err = loads(body)
    assert isinstance(err, ActorError) and "host-a (pid 1)" in str(err) and "rank 2" in str(err)
    assert "ValueError" in err.remote_traceback
    later = _item("p3", 3, _value(3))
    fold.add(later, _value(3), [], None)  # broken: the rest passes up unfolded
    partial, raw = fold.finish()
    assert partial[3] == [1] and raw[0][0] == later


def test_a_batch_carries_one_partial_value_with_its_ranks() -> None:
    """Through ReplyGather: three local answers folded, sent up as one PARTIAL item whose
    `part` names the three procs and ranks; the batch is then forgotten."""
    sent: list = []
    gather = ReplyGather("ipc://agent", lambda addr, frames: sent.append((addr, frames)),
                         b"t" * 16, lambda fn, *args: fn(*args))
    assert gather.folds is not None  # no worker below: each step runs at once
    gather.folds.submit = lambda fn, *args: fn(*args)  # type: ignore[method-assign]
    inner = Header(Kind.CALL, src="caller", reply="tcp://caller", port=9)
    combine, _ = dumps(operator.add)
    inner = gather.start(inner, ["p0", "p1", "p2"], reduce=bytes(combine))
    gid = inner.extra["g"]
    for r in range(3):
        body = _value(r + 1)
        gather.on_reply(Header(Kind.REPLY, src=f"p{r}", actor="a", port=inner.port, rank=r,
                               status=framing.OK, extra={"g": gid}), body, [])
    assert gid not in gather.batches and len(sent) == 1
    addr, frames = sent[0]
    assert addr == "tcp://caller"
    h, body, bufs = framing.parse(frames, b"t" * 16)
    assert h.kind == Kind.REPLY_BATCH and h.extra["part"] == [[["p0", "p1", "p2"], [0, 1, 2]]]
    [(rh, rbody, rbufs)] = framing.split_reply_batch(h, body, bufs)
    assert rh.status == framing.PARTIAL and loads(bytes(rbody), rbufs) == 6


def test_the_worker_runs_steps_in_order_off_the_calling_thread() -> None:
    ran: list = []
    done = threading.Event()
    folds = Folds(lambda fn, *args: fn(*args))
    for i in range(5):
        folds.submit(lambda i=i: ran.append((i, threading.current_thread().name)))
    folds.submit(done.set)
    assert done.wait(10)
    folds.stop()
    assert [i for i, _ in ran] == list(range(5))
    assert {name for _, name in ran} == {"agent-folds"}
