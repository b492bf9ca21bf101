"""Message framing and serialization, without processes."""

import pickle

import numpy as np
import pytest

from runtime.errors import SerializationError
from runtime.transport import framing
from runtime.transport.framing import FrameError, Header, Kind
from runtime.transport.serialization import dumps, loads

TOKEN = b"t" * 16


def test_frames_round_trip():
    h = Header(Kind.CALL, src="a", actor="x", method="m", reply="ipc://r", port=7,
               extra={"k": [1, 2]})
    frames = framing.build(TOKEN, h, b"body", [b"buf"])
    h2, body, bufs = framing.parse(frames, TOKEN)
    assert h2 == h and body == b"body" and bufs == [b"buf"]


@pytest.mark.parametrize("frames", [
    [b"x"],
    [b"wrong-token-1234", framing.encode_header(Header(Kind.CALL)), b""],
    [TOKEN, b"\xff\x00garbage", b""],
    [TOKEN, framing.encode_header(Header(999)), b""],
])
def test_bad_frames_are_rejected_before_unpickling(frames):
    with pytest.raises(FrameError):
        framing.parse(frames, TOKEN)


def test_numpy_travels_out_of_band():
    a = np.arange(1 << 20, dtype=np.float32)
    body, bufs = dumps(("x", a))
    assert len(body) < 1000, "the array must not be copied into the pickle"
    assert sum(memoryview(b).nbytes for b in bufs) == a.nbytes
    out = loads(body, [memoryview(b) for b in bufs])
    assert np.array_equal(out[1], a)


def test_torch_tensor_travels_out_of_band():
    torch = pytest.importorskip("torch")
    t = torch.arange(1 << 18, dtype=torch.float32).reshape(512, 512)
    bf = torch.ones(4, dtype=torch.bfloat16)
    p = torch.nn.Parameter(torch.zeros(3))
    body, bufs = dumps({"t": t, "bf": bf, "p": p})
    assert len(body) < 2000
    out = loads(body, [memoryview(b) for b in bufs])
    assert torch.equal(out["t"], t) and out["t"].shape == (512, 512)
    assert out["bf"].dtype == torch.bfloat16 and torch.equal(out["bf"], bf)
    assert isinstance(out["p"], torch.nn.Parameter) and out["p"].requires_grad


def test_unpicklable_names_what():
    import threading

    with pytest.raises(SerializationError, match="cannot pickle the thing"):
        dumps(threading.Lock(), "the thing")


def test_lambdas_travel_by_value():
    body, bufs = dumps(lambda x: x + 1)
    assert loads(body, bufs)(1) == 2


def test_small_bodies_travel_in_the_head_frame_and_large_ones_apart():
    h = Header(Kind.CALL, method="m", port=3)
    small = framing.build(TOKEN, h, b"x" * 100, [b"buf"])
    assert len(small) == 2 and small[1] == b"buf"
    big = framing.build(TOKEN, h, b"y" * (framing.INLINE_BODY + 1))
    assert len(big) == 2
    for frames, body in ((small, b"x" * 100), (big, b"y" * (framing.INLINE_BODY + 1))):
        h2, b2, _ = framing.parse(frames, [b"other-token-0000", TOKEN])
        assert h2 == h and bytes(b2) == body


@pytest.mark.parametrize("keep", [len(TOKEN), len(TOKEN) + 3, len(TOKEN) + 6])
def test_truncated_head_frames_are_rejected(keep):
    head = framing.build(TOKEN, Header(Kind.CALL), b"body")[0]
    with pytest.raises(FrameError):
        framing.parse([head[:keep]], TOKEN)


def test_reply_batches_split_back_into_replies():
    bodies = [dumps(v)[0] for v in ("a", 2, None)]
    items = [["p0", "act", 0, framing.OK, len(bodies[0]), 1],
             ["p1", "act", 1, framing.ERROR, len(bodies[1]), 0],
             ["p2", "act", 2, framing.OK, len(bodies[2]), 2]]
    h, body = framing.reply_batch(9, items, bodies)
    bufs = [b"b0", b"b2a", b"b2b"]
    frames = framing.build(TOKEN, h, body, bufs)
    h2, body2, bufs2 = framing.parse(frames, TOKEN)
    replies = framing.split_reply_batch(h2, body2, bufs2)
    assert [(r.kind, r.src, r.rank, r.status, r.port) for r, _, _ in replies] == [
        (Kind.REPLY, "p0", 0, framing.OK, 9), (Kind.REPLY, "p1", 1, framing.ERROR, 9),
        (Kind.REPLY, "p2", 2, framing.OK, 9)]
    assert [loads(b) for _, b, _ in replies] == ["a", 2, None]
    assert [list(map(bytes, bs)) for _, _, bs in replies] == [[b"b0"], [], [b"b2a", b"b2b"]]


@pytest.mark.parametrize("items", [
    None, [["p0", "a", 0, 0, 5]], [["p0", "a", 0, 0, 999, 0]], [["p0", "a", 0, 0, 1, 5]],
    [["p0", "a", 0, 0, -1, 0]], [["p0", "a", 0, 0, "3", 0]], [["p0", "a", 0, 0, 1, 0]],
])
def test_reply_batches_that_do_not_add_up_are_rejected(items):
    h = Header(Kind.REPLY_BATCH, port=1, extra={"items": items})
    with pytest.raises(FrameError):
        framing.split_reply_batch(h, b"abc", [])


def test_pickling_while_another_thread_imports_torch(monkeypatch):
    """Another thread is importing torch (its module object exists, its Tensor not yet):
    pickling a value that holds no tensor does not trip over the half-made module."""
    import sys
    import types

    half = types.ModuleType("torch")  # what sys.modules holds mid-import
    monkeypatch.setitem(sys.modules, "torch", half)
    body, bufs = dumps({"step": 3, "values": [1.5, 2.5], "error": ValueError("x")})
    assert loads(body, bufs)["step"] == 3


def test_a_held_gathered_reply_goes_before_a_later_message_of_its_proc():
    """An agent holds proc p's reply to a gathered call while q has not answered; before it
    relays anything else p sent, it sends what it holds of p (`flush_from`), and only that:
    the batch then waits for q alone."""
    from runtime.host.gather import ReplyGather

    sent: list = []
    g = ReplyGather("ipc://agent", lambda addr, frames: sent.append((addr, frames)), b"t")
    inner = g.start(Header(Kind.CALL, reply="tcp://caller:1", port=7), ["p", "q"])
    gid = framing.extra_get(inner, "g")
    reply = Header(Kind.REPLY, src="p", actor="a", rank=0, port=7, extra={"g": gid})
    g.on_reply(reply, b"p-answer", [])
    g.flush_from("q")  # q holds nothing: nothing goes
    assert sent == []
    g.flush_from("p")
    (addr, frames), = sent
    h, body, bufs = framing.parse(frames, b"t")
    assert addr == "tcp://caller:1" and h.kind == Kind.REPLY_BATCH and h.port == 7
    assert [(r.src, bytes(b)) for r, b, _ in framing.split_reply_batch(h, body, bufs)] == \
        [("p", b"p-answer")]
    g.flush_from("p")  # sent once
    assert len(sent) == 1 and g.holding == {}
    g.on_reply(Header(Kind.REPLY, src="q", actor="a", rank=1, port=7, extra={"g": gid}),
               b"q-answer", [])
    assert len(sent) == 2 and g.batches == {}


def test_a_gateway_end_keeps_what_it_sent_until_confirmed_and_sends_the_rest_again():
    """`Resend` numbers messages and keeps them until the other end confirms; after a cut,
    what the other end lacks comes in order; over its bound the oldest are let go and
    counted. `Receipt` takes each number once, in order."""
    from runtime.transport.gateway import Receipt, Resend

    r = Resend(limit=10_000)
    msgs = [r.add(b"D", [b"x" * 100, str(i).encode()]) for i in range(1, 6)]
    assert [m[0] for m in msgs] == [b"D"] * 5 and r.seq == 5
    r.confirmed(2)
    assert r.after(3) == msgs[3:]  # the other end has up to 3
    assert r.lost_after(3) == 0
    got, taken = Receipt(), []
    for m in msgs[:2] + msgs[:3] + msgs[4:] + msgs[3:]:  # a duplicate, a gap, the resend
        if got.take(m[1]):
            taken.append(m[3])
    assert taken == [b"1", b"2", b"3", b"4", b"5"]
    assert got.ack() == [b"A", msgs[4][1]] and got.ack() is None
    small = Resend(limit=500)  # room for about two
    for i in range(10):
        small.add(b"D", [b"y" * 150])
    assert small.let_go >= 7 and small.lost_after(0) == small.let_go
    assert len(small.after(small.let_go)) == 10 - small.let_go
    # a send that failed at once is taken back whole: its number and its bytes
    before = (r.seq, r.bytes, len(r.kept))
    r.add(b"D", [b"z" * 10])
    r.take_back()
    assert (r.seq, r.bytes, len(r.kept)) == before
