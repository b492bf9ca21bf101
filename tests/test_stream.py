"""The stream transport (runtime/transport/stream.py, docs/transport.md): the wire format as
pure logic, then two I/O loops in this process talking over AF_UNIX stream connections."""

from __future__ import annotations

import os
import random
import socket
import stat
import threading
import time

import pytest

from _util import wait_until
from runtime.transport import framing
from runtime.transport.framing import FrameError, Header, Kind
from runtime.transport.loop import IOLoop

pytestmark = pytest.mark.timeout(60)
TOKEN = b"t" * 16


_wait = wait_until


def _decode(data: bytes, chunks: list[int], max_frame: int = 1 << 30) -> list[list[bytes]]:
    """Feed `data` to a decoder in reads of the given sizes (as recv_into would)."""
    dec = framing.StreamDecoder(max_frame, chunk=64 << 10)
    out, off, i = [], 0, 0
    while off < len(data):
        buf = dec.buffer()
        n = min(len(buf), chunks[i % len(chunks)], len(data) - off)
        buf[:n] = data[off:off + n]
        off += n
        i += 1
        out += [[bytes(f) for f in m] for m in dec.feed(n)]
    assert not dec.mid_message()
    return out


# -- the wire, pure -------------------------------------------------------------------------
@pytest.mark.parametrize("chunks", [[1], [7, 3], [4096], [1 << 20], [100, 70000, 5]])
def test_messages_come_out_whole_and_in_order_whatever_the_reads(chunks):
    rng = random.Random(1)
    messages = []
    for i in range(60):
        sizes = [rng.choice([0, 1, 100, 5000, 40000, 200000]) for _ in range(rng.randint(1, 4))]
        messages.append([bytes([i % 251]) * s if s else b"" for s in sizes])
        messages[-1][0] = f"head {i}".encode()
    if chunks == [1]:  # a decoder call per byte: the first 15 messages (1.2 of 6 MB)
        messages = messages[:15]
    # every frame size (one over the decoder's 64 KiB chunk) and 1 to 4 frames a message
    assert {len(f) for m in messages for f in m[1:]} == {0, 1, 100, 5000, 40000, 200000}
    assert {len(m) for m in messages} == {1, 2, 3, 4}
    data = b"".join(bytes(b) for m in messages for b in framing.stream_message(m))
    assert _decode(data, chunks) == messages


def test_a_large_frame_is_read_into_a_buffer_of_its_own_that_is_writable():
    big = os.urandom(300000)
    dec = framing.StreamDecoder(1 << 30, chunk=64 << 10)
    data = b"".join(bytes(b) for b in framing.stream_message([b"head", big, b"tail"]))
    off, got = 0, []
    while off < len(data):
        buf = dec.buffer()
        n = min(len(buf), len(data) - off)
        buf[:n] = data[off:off + n]
        off += n
        got += dec.feed(n)
    (frames,) = got
    assert frames[0] == b"head" and type(frames[0]) is bytes
    assert bytes(frames[1]) == big and isinstance(frames[1], bytearray)
    assert bytes(frames[2]) == b"tail"


@pytest.mark.parametrize("bad, why", [
    (b"\0\0\0\0", "0 frames"),
    ((9000).to_bytes(4, "little"), "9000 frames"),  # over framing.MAX_FRAMES
    ((1).to_bytes(4, "little") + (1 << 40).to_bytes(8, "little"), "a frame of"),
])
def test_a_stream_that_is_not_ours_is_refused(bad, why):
    dec = framing.StreamDecoder(1 << 30)
    buf = dec.buffer()
    buf[:len(bad) + 8] = bad + b"\0" * 8
    with pytest.raises(FrameError, match=why):
        dec.feed(len(bad) + 8)


def test_a_message_cut_short_is_seen_as_such():
    data = b"".join(bytes(b) for b in framing.stream_message([b"x" * 1000]))
    dec = framing.StreamDecoder(1 << 30)
    dec.buffer()[:500] = data[:500]
    assert dec.feed(500) == [] and dec.mid_message()


def test_a_partial_send_leaves_the_rest_of_its_buffers():
    bufs = [b"abc", memoryview(b"defgh"), bytearray(b"ij")]
    for n in range(11):
        assert b"".join(bytes(b) for b in framing.advance(list(bufs), n)) == b"abcdefghij"[n:]


def test_a_preamble_names_its_sender_only_with_the_token():
    (frames,) = _decode(b"".join(framing.preamble(TOKEN, "proc-3")), [1 << 20])
    assert framing.parse_preamble(frames, [b"other" * 4, TOKEN]) == "proc-3"
    with pytest.raises(FrameError, match="token"):
        framing.parse_preamble(frames, [b"x" * 16])
    with pytest.raises(FrameError, match="preamble"):
        framing.parse_preamble([b"hello"], [TOKEN])


def test_too_many_frames_cannot_be_sent():
    with pytest.raises(FrameError):
        framing.stream_message([b""] * (framing.MAX_FRAMES + 1))


# -- two loops ------------------------------------------------------------------------------
class Sink:
    """An I/O loop that records what it receives: (sender's thread, sequence, payload)."""

    def __init__(self, path: str, bind: bool = True) -> None:
        self.got: list = []
        self.loop = IOLoop("sink", TOKEN, self.on_message)
        self.addr = f"ipc://{path}"
        if bind:
            self.bind()

    def bind(self) -> None:
        self.loop.bind(self.addr)
        self.loop.start()

    def on_message(self, h: Header, body, buffers) -> None:
        self.got.append((h.extra["who"], h.extra["i"], len(body), [bytes(b) for b in buffers]))


def _source(name: str = "source") -> tuple[IOLoop, list]:
    failed: list = []
    loop = IOLoop(name, TOKEN, lambda h, b, bufs: None)
    loop.peers.on_send_failed = lambda addr, ports, error, gone: failed.append((addr, ports, error))
    loop.start()
    return loop, failed


def _msg(who: int, i: int, size: int = 0, buffers: tuple = ()) -> list:
    return framing.build(TOKEN, Header(Kind.LOG, extra={"who": who, "i": i}), b"b" * size,
                         buffers)


@pytest.fixture
def rundir(tmp_path):
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    return d


def test_each_threads_messages_arrive_whole_and_in_order_large_ones_among_them(rundir):
    sink = Sink(str(rundir / "sink"))
    src, failed = _source()
    big = os.urandom(3 << 20)
    n = 300
    try:
        def sender(who: int) -> None:
            for i in range(n):
                size = 200000 if i % 50 == 7 else 10
                bufs = (big,) if i % 100 == 3 else ()
                src.send(sink.addr, _msg(who, i, size, bufs))

        threads = [threading.Thread(target=sender, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        _wait(lambda: len(sink.got) == 4 * n, 30)
        for w in range(4):
            mine = [g for g in sink.got if g[0] == w]
            assert [g[1] for g in mine] == list(range(n))
            for _, i, size, bufs in mine:
                assert size == (200000 if i % 50 == 7 else 10)
                assert bufs == ([big] if i % 100 == 3 else [])
        assert not failed
    finally:
        src.stop()
        sink.loop.stop()


def test_messages_to_a_peer_not_listening_yet_arrive_once_it_is(rundir):
    sink = Sink(str(rundir / "late"), bind=False)
    src, failed = _source()
    try:
        for i in range(20):
            src.send(sink.addr, _msg(0, i))
        from runtime.transport.stream import CONNECT_RETRY_S
        # the sender has retried its connect (a retry failed, the next one waits longer)
        _wait(lambda: src.peers.out[sink.addr].retry > CONNECT_RETRY_S)
        sink.bind()
        _wait(lambda: len(sink.got) == 20)
        assert [g[1] for g in sink.got] == list(range(20)) and not failed
    finally:
        src.stop()
        sink.loop.stop()


def test_calls_to_an_address_nobody_listens_at_fail_after_connect_timeout(rundir):
    """Messages to an ipc address where nothing ever listens: the calls they carry fail,
    naming the address and the setting, once connect_timeout has passed (not retried
    forever with the messages held)."""
    import runtime

    src, failed = _source()
    addr = f"ipc://{rundir}/nobody"
    try:
        with runtime.configured(connect_timeout=0.3):
            for i in range(5):
                src.send(addr, _msg(0, i), port=10 + i)
            _wait(lambda: len(failed) >= 1)
        ports = sorted(p for _, ps, _ in failed for p in ps)
        assert ports == [10, 11, 12, 13, 14], failed
        assert all(a == addr and "nothing listens" in e and "connect_timeout" in e
                   for a, _, e in failed), failed
    finally:
        src.stop()


def test_a_send_that_fails_fails_the_call_it_carried_naming_the_peer(rundir):
    """A peer that accepts the connection, then goes (closes it and its listening socket):
    the sends after that fail, and the calls they carried are reported, never a log line
    alone (a dial after a broken connection does not wait for a listener)."""
    path = str(rundir / "closer")
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(path)
    lsock.listen(1)
    src, failed = _source()
    try:
        src.send(f"ipc://{path}", _msg(0, 0), port=5)
        conn, _ = lsock.accept()
        conn.close()
        lsock.close()
        i = 1
        deadline = time.monotonic() + 10
        while not any(7 in ports for _, ports, _ in failed):
            assert time.monotonic() < deadline, failed
            src.send(f"ipc://{path}", _msg(0, i), port=7)
            i += 1
            time.sleep(0.01)
        addr, ports, error = [f for f in failed if 7 in f[1]][0]
        assert addr == f"ipc://{path}" and path in error
    finally:
        src.stop()
        lsock.close()


def test_a_malformed_connection_is_dropped_and_others_are_served(rundir, caplog):
    sink = Sink(str(rundir / "sink"))
    src, _ = _source()
    try:
        for data in (b"\xff" * 64, b"".join(framing.stream_message([b"no preamble"])),
                     b"".join(framing.preamble(b"w" * 16, "intruder"))):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sink.addr[6:])
            s.sendall(data)
            s.close()
        _wait(lambda: sink.loop.stats["dropped"] == 3)
        src.send(sink.addr, _msg(1, 1))
        _wait(lambda: sink.got == [(1, 1, 0, [])])
    finally:
        src.stop()
        sink.loop.stop()


def test_the_socket_file_is_private_and_gone_after_stop(rundir):
    sink = Sink(str(rundir / "sink"))
    path = sink.addr[6:]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    sink.loop.stop()
    assert not os.path.exists(path)


def test_drain_from_reads_everything_a_closed_peer_sent(rundir):
    """What a sender wrote before it went away is all read, in order, and `drain_from` (what
    a death report calls before it fails the calls) returns on a peer that is gone (here a
    plain socket that writes into the kernel's buffer and closes before the loop runs)."""
    got: list = []
    loop = IOLoop("reader", TOKEN, lambda h, b, bufs: got.append(h.extra["i"]))
    addr = loop.bind(f"ipc://{rundir}/reader")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(addr[6:])
    s.sendall(b"".join(framing.preamble(TOKEN, "writer")))
    for i in range(50):
        s.sendall(b"".join(bytes(b) for b in framing.stream_message(_msg(0, i))))
    s.close()
    loop.start()
    try:
        _wait(lambda: len(got) == 50)
        loop.run_sync(loop.drain_from, "writer")
        assert got == list(range(50))
    finally:
        loop.stop()


def test_drain_from_reads_a_connection_not_yet_accepted_or_identified(rundir):
    """A sender's first message to us is its answer, on a new connection, and it exits
    while our I/O thread is busy: the connection is still in the listening socket's backlog
    when its death is handled. `drain_from` accepts and reads such connections too, so the
    answer is dispatched before the death fails anything."""
    got: list = []
    loop = IOLoop("reader", TOKEN, lambda h, b, bufs: got.append(h.extra["i"]))
    addr = loop.bind(f"ipc://{rundir}/reader")
    loop.start()
    try:
        loop.call_soon(time.sleep, 1.0)  # busy: nothing is accepted meanwhile
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(addr[6:])
        s.sendall(b"".join(framing.preamble(TOKEN, "answerer")) +
                  b"".join(bytes(b) for b in framing.stream_message(_msg(0, 7))))
        s.close()

        def death_handled() -> list:
            loop.drain_from("answerer")  # what a death report does before failing calls
            return list(got)

        assert loop.run_sync(death_handled, timeout=10) == [7]
    finally:
        loop.stop()


def test_a_forgotten_tcp_address_is_dialed_again(rundir):
    """A TCP host:port names no one process (an agent started later may listen there): after
    its peer is forgotten, a send there dials again (an ipc address would fail at once)."""
    got: list = []
    sink = IOLoop("tcpsink", TOKEN, lambda h, b, bufs: got.append(h.extra["i"]))
    addr = sink.bind("tcp://127.0.0.1:0")
    sink.start()
    src, failed = _source()
    try:
        src.send(addr, _msg(0, 1))
        _wait(lambda: got == [1])
        src.run_sync(src.forget_peer, addr)
        src.send(addr, _msg(0, 2))
        _wait(lambda: got == [1, 2])
        gone = f"ipc://{rundir}/gone"
        src.run_sync(src.forget_peer, gone)
        src.send(gone, _msg(0, 3), port=9)
        _wait(lambda: [f[1] for f in failed] == [[9]])
    finally:
        src.stop()
        sink.stop()
