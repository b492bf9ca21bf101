"""A thread's burst of small messages to one address goes out as one frame
(runtime/transport/senders.py): in order, never later than its next wait or the I/O
thread's late flush, and each message checked on arrival as if it had come alone."""

import gc
import logging
import shutil
import socket
import tempfile
import threading
import time
import weakref

import pytest
import zmq

import runtime
from runtime import Actor, endpoint, this_host
from runtime.transport import framing, senders
from runtime.transport.datagram import LaneInbox, lane_path
from runtime.transport.framing import FrameError, Header, Kind
from runtime.transport.loop import IOLoop

from _threads import in_thread

TOKEN = b"k" * 16


def message(i: int, token: bytes = TOKEN) -> bytes:
    """A one-frame CALL message numbered `i` (in its port field)."""
    (frame,) = framing.build(token, Header(Kind.CALL, method="m", port=i), b"")
    return frame


def number(frame: bytes) -> int:
    return framing.parse([frame], TOKEN)[0].port


# -- the frame format (pure) ------------------------------------------------------------------
def test_a_coalesced_frame_gives_back_its_messages_in_order():
    msgs = [message(i) for i in range(5)] + [b"x" * 3000]
    assert framing.unpack_coalesced(framing.pack_coalesced(msgs)) == msgs


@pytest.mark.parametrize("cut", [1, 3, 7])
def test_a_cut_coalesced_frame_is_rejected(cut):
    frame = framing.pack_coalesced([message(1), message(2)])
    with pytest.raises(FrameError):
        framing.unpack_coalesced(frame[:-cut])


def test_a_frame_without_the_mark_is_not_coalesced():
    with pytest.raises(FrameError):
        framing.unpack_coalesced(message(1))


@pytest.fixture(autouse=True)
def lane_on(monkeypatch):
    """The loops here send by the datagram lane (setting `datagram_lane`), as the bare
    inbox below reads it."""
    from runtime.config import config

    monkeypatch.setattr(config, "datagram_lane", True)


# -- the sending side: an I/O loop sends to a raw socket that shows each frame ----------------
@pytest.fixture
def wire():
    """(loop, address of a bare inbox, receive(timeout) -> a message's frames or None): an
    ipc inbox with its datagram lane (runtime/transport/datagram.py), read frame by frame."""
    d = tempfile.mkdtemp(prefix="coalesce-")
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    addr = f"ipc://{d}/pull"
    pull.bind(addr)
    inbox = LaneInbox(pull, addr, [TOKEN])
    loop = IOLoop("coalesce-test", TOKEN, lambda h, b, bufs: None)
    loop.bind(f"ipc://{d}/inbox")
    loop.start()

    def receive(timeout: float = 5.0):
        inbox.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
        try:
            head = inbox.recv()
        except zmq.Again:
            return None
        return [head, *inbox.recv_multipart()]

    try:
        yield loop, addr, receive
    finally:
        loop.stop()
        inbox.close(linger=0)
        ctx.term()
        shutil.rmtree(d, ignore_errors=True)


def arrived(receive, n: int) -> tuple[list[int], int]:
    """The numbers of the next `n` messages, and how many zmq messages brought them."""
    got, count = [], 0
    while len(got) < n:
        frames = receive()
        assert frames is not None, f"only {len(got)} of {n} messages arrived"
        count += 1
        if len(frames) == 1 and frames[0].startswith(framing.COALESCED):
            got += [number(m) for m in framing.unpack_coalesced(frames[0])]
        else:
            got.append(framing.parse(frames, TOKEN)[0].port)
    return got, count


def test_a_burst_goes_out_in_fewer_frames_in_order(wire):
    loop, addr, receive = wire
    n = 500
    in_thread(lambda: [loop.send(addr, [message(i)]) for i in range(n)])
    got, frames = arrived(receive, n)
    assert got == list(range(n))
    assert frames < n / 4, f"{frames} frames for a burst of {n} messages"
    assert frames >= n / senders.MAX_HELD


def test_a_finalizer_run_inside_a_threads_send_neither_hangs_it_nor_is_lost(wire):
    """The collector runs finalizers at an allocation anywhere, maybe while a thread holds
    its send lock: one that schedules work (call_soon flushes what the thread holds) or
    sends must not wait for that lock (the thread hung for good, the collector with it, and
    the interpreter at exit), and what it sends or schedules still happens."""
    loop, addr, receive = wire
    ran: list = []

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    class Collecting(bytes):
        """A frame whose length is asked under the send lock: the collector runs there."""

        def __len__(self) -> int:
            gc.collect()
            return bytes.__len__(self)

    def body() -> None:
        loop.send(addr, [message(0)])
        loop.send(addr, [message(1)])  # a burst (held), or a recent send: a flush to do
        c = Cycle()
        weakref.finalize(c, loop.call_soon, ran.append, "scheduled")
        weakref.finalize(c, loop.send, addr, [message(99)])
        del c  # garbage for the collection inside the next send
        loop.send(addr, [Collecting(message(2))])
        loop.send(addr, [message(3)])
        loop.before_block()

    gc.disable()  # no automatic collection before the one inside the send
    try:
        t = threading.Thread(target=body, daemon=True)  # a hung one must not block exit
        t.start()
        t.join(10)
    finally:
        gc.enable()
    assert not t.is_alive(), "the thread waits for its own send lock"
    got, _ = arrived(receive, 5)
    assert sorted(got) == [0, 1, 2, 3, 99]
    assert [n for n in got if n != 99] == [0, 1, 2, 3]
    deadline = time.monotonic() + 5
    while not ran and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran == ["scheduled"]
    fired: list = []  # and the collector still collects
    c = Cycle()
    weakref.finalize(c, fired.append, True)
    del c
    gc.collect()
    assert fired == [True]


def test_a_message_after_a_wait_goes_out_alone_at_once(wire):
    loop, addr, receive = wire

    def calls_and_waits() -> None:
        for i in range(20):
            loop.send(addr, [message(i)])
            loop.before_block()  # what Future.get() does before it waits
            frames = receive()
            assert frames is not None and len(frames) == 1
            assert not frames[0].startswith(framing.COALESCED) and number(frames[0]) == i

    in_thread(calls_and_waits)


def test_what_a_busy_thread_holds_goes_out_without_a_wait(wire):
    """A thread sends a burst and then computes without waiting on the runtime: the I/O
    thread sends what it holds (this thread sleeps, so the I/O thread gets the GIL)."""
    loop, addr, receive = wire
    n = 50
    lag: list = []

    def burst_then_sleep() -> None:
        for i in range(n):
            loop.send(addr, [message(i)])
        sent = time.monotonic()
        got, _ = arrived(receive, n)
        lag.append(time.monotonic() - sent)
        assert got == list(range(n))

    in_thread(burst_then_sleep)
    assert lag[0] < 0.5, lag


def test_large_messages_and_other_addresses_keep_the_order(wire):
    loop, addr, receive = wire

    def mixed() -> None:
        for i in range(30):
            loop.send(addr, [message(i)])
        big = framing.build(TOKEN, Header(Kind.CALL, port=30), b"y" * (64 << 10))
        loop.send(addr, big)  # a frame list of its own: what is held goes first
        for i in range(31, 60):
            loop.send(addr, [message(i)])

    in_thread(mixed)
    got, _ = arrived(receive, 60)
    assert got == list(range(60))


def test_with_coalescing_off_every_message_is_a_frame(wire):
    loop, addr, receive = wire
    loop.coalesce = False
    in_thread(lambda: [loop.send(addr, [message(i)]) for i in range(100)])
    got, frames = arrived(receive, 100)
    assert got == list(range(100)) and frames == 100


# -- the receiving side ------------------------------------------------------------------------
def test_each_message_of_a_coalesced_frame_is_checked_alone(caplog):
    """A message of another session inside a coalesced frame is dropped, the others are
    handled; a coalesced frame that does not add up is dropped whole, with a log line."""
    d = tempfile.mkdtemp(prefix="coalesce-")
    seen: list = []
    loop = IOLoop("coalesce-rx", TOKEN, lambda h, b, bufs: seen.append(h.port))
    addr = loop.bind(f"ipc://{d}/inbox")
    loop.start()
    push = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # a sender on the inbox's lane
    push.connect(lane_path(addr))
    try:
        with caplog.at_level(logging.WARNING, logger="runtime.transport"):
            push.send(framing.pack_coalesced([message(1), message(2, b"z" * 16), message(3)]))
            push.send(framing.pack_coalesced([message(4), message(5)])[:-2])
            push.send(message(6))
            deadline = time.monotonic() + 10
            while 6 not in seen and time.monotonic() < deadline:
                time.sleep(0.01)
        assert seen == [1, 3, 6]
        assert loop.stats["dropped"] == 2
        text = caplog.text
        assert "not from this session" in text and "dropped a coalesced frame" in text
    finally:
        push.close()
        loop.stop()
        shutil.rmtree(d, ignore_errors=True)


# -- through the runtime -------------------------------------------------------------------------
class Tally(Actor):
    def __init__(self) -> None:
        self.seen: list = []

    @endpoint
    def note(self, i: int) -> int:
        self.seen.append(i)
        return i

    @endpoint
    def count(self) -> int:
        return len(self.seen)

    @endpoint
    def order(self) -> list:
        return self.seen


@pytest.fixture(scope="module")
def tally():
    pm = this_host().spawn_procs(per_host={"procs": 1}, name="coalesce")
    try:
        yield pm.spawn("tally", Tally)
    finally:
        pm.stop().get(timeout=30)
        runtime.shutdown()


def test_pipelined_calls_and_their_replies_arrive_whole_and_in_order(tally):
    n = 3000
    start = tally.count.call_one().get(timeout=30)
    futs = [tally.note.call_one(i) for i in range(n)]
    assert [f.get(timeout=30) for f in futs] == list(range(n))
    assert tally.order.call_one().get(timeout=30)[start:] == list(range(n))


def test_broadcasts_from_a_thread_that_never_waits_arrive(tally):
    """Fire-and-forget calls, then the sending thread computes: nothing it held stays
    behind (the I/O thread's late flush)."""
    start = tally.count.call_one().get(timeout=30)
    n = 200

    def fire_and_spin() -> None:
        for i in range(n):
            tally.note.broadcast(i)
        t = time.monotonic()
        while time.monotonic() - t < 1.0:  # busy, no runtime wait
            pass

    th = threading.Thread(target=fire_and_spin)
    th.start()
    try:
        deadline = time.monotonic() + 0.8  # before the sender's busy second ends
        while time.monotonic() < deadline:
            if tally.count.call_one().get(timeout=30) - start == n:
                break
            time.sleep(0.02)
        assert tally.count.call_one().get(timeout=30) - start == n
    finally:
        th.join(10)
    assert tally.order.call_one().get(timeout=30)[start:] == list(range(n))
