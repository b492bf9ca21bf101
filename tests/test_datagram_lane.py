"""The datagram lane (runtime/transport/datagram.py): messages between processes of one host
go by an AF_UNIX datagram socket beside each ipc inbox, large ones by zmq with a pointer on
the lane. Pinned here: one sender's order across both lanes, a sender never blocks (a full
or unbound inbox: the backlog), what a thread sent before it ended still arrives, anything
not of the session is dropped with a log line without stalling the reader, and no file is
left behind."""

import logging
import os
import shutil
import socket
import tempfile
import threading
import time

import pytest
import zmq

from runtime.transport import datagram, framing
from runtime.transport.datagram import BULK, LaneInbox, lane_path, pointer, pointer_key
from runtime.transport.framing import Header, Kind
from runtime.transport.loop import IOLoop

from _threads import in_thread

TOKEN = b"d" * 16


def small(i: int) -> list:
    return framing.build(TOKEN, Header(Kind.CALL, method="m", port=i), b"")


def bulk(i: int) -> list:
    """A message that cannot be one datagram: a large body and an out-of-band buffer."""
    return framing.build(TOKEN, Header(Kind.CALL, method="m", port=i),
                         b"b" * (datagram.MAX_DATAGRAM + 10), [b"z" * 1000])


@pytest.fixture(autouse=True)
def lane_on(monkeypatch):
    """The loops these tests make have the lane (setting `datagram_lane`), whatever the
    default."""
    from runtime.config import config

    monkeypatch.setattr(config, "datagram_lane", True)


@pytest.fixture
def tmpdir_():
    d = tempfile.mkdtemp(prefix="lane-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def two_loops(d: str, got: list) -> tuple[IOLoop, IOLoop]:
    """A sending loop and a receiving one (which appends (port, body length, buffer count)
    of what it receives to `got`), started."""
    rx = IOLoop("lane-rx", TOKEN, lambda h, b, bufs: got.append((h.port, len(b), len(bufs))))
    rx.bind(f"ipc://{d}/rx")
    tx = IOLoop("lane-tx", TOKEN, lambda h, b, bufs: None)
    tx.bind(f"ipc://{d}/tx")
    rx.start()
    tx.start()
    return tx, rx


@pytest.fixture
def pair(tmpdir_):
    """(sending loop, receiving loop's address, what it received, in order)."""
    got: list = []
    tx, rx = two_loops(tmpdir_, got)
    try:
        yield tx, rx.address, got
    finally:
        tx.stop()
        rx.stop()


@pytest.fixture
def bare(tmpdir_):
    """(sending loop, without coalescing, and a bare lane inbox nobody reads until the test
    does, with its address)."""
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    addr = f"ipc://{tmpdir_}/slow"
    pull.bind(addr)
    inbox = LaneInbox(pull, addr, [TOKEN])
    inbox.setsockopt(zmq.RCVTIMEO, 5000)
    tx = IOLoop("lane-tx", TOKEN, lambda h, b, bufs: None)
    tx.coalesce = False  # one datagram per message: far more than the kernel queues
    tx.bind(f"ipc://{tmpdir_}/tx")
    tx.start()
    try:
        yield tx, inbox, addr
    finally:
        tx.stop()
        inbox.close()
        ctx.term()


def wait_for(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.005)
    return cond()


# -- pure ----------------------------------------------------------------------------------------
def test_a_pointer_carries_its_key_and_is_refused_without_the_token():
    key = b"k" * 16
    p = pointer(key, TOKEN)
    assert p.startswith(BULK) and datagram.is_pointer(p)
    assert pointer_key(p, [b"x" * 16, TOKEN]) == key
    assert pointer_key(p, [b"x" * 16]) is None
    assert pointer_key(BULK + b"short", [TOKEN]) is None
    assert not datagram.is_pointer(small(1)[0])
    assert lane_path("ipc:///run/x/p1") == "/run/x/p1" + datagram.SUFFIX
    assert lane_path("tcp://127.0.0.1:5555") is None


# -- order and delivery --------------------------------------------------------------------------
def test_one_senders_messages_keep_their_order_across_both_lanes(pair):
    tx, addr, got = pair
    kinds = ["s", "b", "s", "s", "b", "b", "s"] * 5

    def send() -> None:
        for i, k in enumerate(kinds):
            tx.send(addr, small(i) if k == "s" else bulk(i))
        tx.before_block()

    in_thread(send)
    assert wait_for(lambda: len(got) == len(kinds))
    assert [p for p, _, _ in got] == list(range(len(kinds)))
    assert all((n > datagram.MAX_DATAGRAM) == (kinds[p] == "b") for p, n, _ in got)
    assert all(nb == (1 if kinds[p] == "b" else 0) for p, _, nb in got)


def test_each_of_several_threads_keeps_its_order(pair):
    tx, addr, got = pair
    per = 300

    def sender(t: int) -> None:
        for i in range(per):
            msg = bulk(t * 10_000 + i) if i % 50 == 7 else small(t * 10_000 + i)
            tx.send(addr, msg)

    threads = [threading.Thread(target=sender, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert wait_for(lambda: len(got) == 4 * per)
    for t in range(4):
        mine = [p - t * 10_000 for p, _, _ in got if p // 10_000 == t]
        assert mine == list(range(per))


def test_a_sender_never_blocks_on_an_inbox_that_does_not_read(bare):
    """The kernel queues a few datagrams per inbox (net.unix.max_dgram_qlen): the rest wait
    in the sender's backlog, and arrive in order once the inbox reads."""
    tx, inbox, addr = bare
    n = 2000
    sender = threading.Thread(target=lambda: [tx.send(addr, small(i)) for i in range(n)])
    sender.start()
    sender.join(10)
    assert not sender.is_alive()  # all sent (or in its backlog) before anything was read
    ports = [framing.parse([inbox.recv()], TOKEN)[0].port for _ in range(n)]
    assert ports == list(range(n))


def test_messages_to_an_inbox_not_bound_yet_arrive_once_it_is(tmpdir_):
    got: list = []
    addr = f"ipc://{tmpdir_}/late"
    tx = IOLoop("lane-tx", TOKEN, lambda h, b, bufs: None)
    tx.bind(f"ipc://{tmpdir_}/tx")
    tx.start()
    rx = IOLoop("lane-rx", TOKEN, lambda h, b, bufs: got.append(h.port))
    try:
        in_thread(lambda: [tx.send(addr, small(i)) for i in range(20)])
        time.sleep(0.05)
        rx.bind(addr)
        rx.start()
        assert wait_for(lambda: len(got) == 20)
        assert got == list(range(20))
    finally:
        tx.stop()
        rx.stop()


def test_what_a_thread_sent_before_it_ended_still_arrives(bare):
    """A thread that ends with messages in its backlog (the inbox was not reading): its
    sockets close with a linger, and the loop sends the rest."""
    tx, inbox, addr = bare
    in_thread(lambda: [tx.send(addr, small(i)) for i in range(200)])  # then it ends
    ports = [framing.parse([inbox.recv()], TOKEN)[0].port for _ in range(200)]
    assert ports == list(range(200))


# -- what is not of the session ---------------------------------------------------------------------
def test_strays_on_either_lane_are_dropped_without_stalling_the_reader(pair, caplog):
    tx, addr, got = pair
    with caplog.at_level(logging.WARNING, logger="runtime.transport"):
        d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        d.connect(lane_path(addr))
        d.send(BULK + b"k" * 16 + b"t" * 16)  # a pointer without the token: not waited for
        d.send(os.urandom(40))
        d.close()
        ctx = zmq.Context()
        s = ctx.socket(zmq.PUSH)
        s.connect(addr)
        s.send_multipart([b"k" * 16, b"no token here", b"x"])  # on zmq, no pointer, no token
        s.send_multipart([os.urandom(7)])
        s.close(linger=1000)
        ctx.term()
        t0 = time.monotonic()
        in_thread(lambda: tx.send(addr, small(1)))
        assert wait_for(lambda: got == [(1, 0, 0)], 5.0)
        assert time.monotonic() - t0 < 2.0  # the forged pointer did not hold the reader
        assert wait_for(lambda: caplog.text.count("not a lane's") >= 2, 5.0)  # the sweep
    text = caplog.text
    assert "a pointer without the session's token" in text
    assert "not from this session" in text


def test_processes_that_disagree_on_the_lane_say_so_in_the_log(tmpdir_, caplog, monkeypatch):
    """The agents pin the setting for what they start; a process started by hand with the
    other value loses its messages, and both sides say why: the lane's sender after
    NO_LANE_WARN_S (the inbox is bound, its lane is not), the lane's inbox on a plain zmq
    message of the session."""
    from runtime.config import config

    monkeypatch.setattr(datagram, "NO_LANE_WARN_S", 0.2)
    with caplog.at_level(logging.WARNING, logger="runtime.transport"):
        monkeypatch.setattr(config, "datagram_lane", False)
        plain = IOLoop("plain", TOKEN, lambda h, b, bufs: None)
        plain.bind(f"ipc://{tmpdir_}/plain")
        plain.start()
        monkeypatch.setattr(config, "datagram_lane", True)
        got: list = []
        lane = IOLoop("lane", TOKEN, lambda h, b, bufs: got.append(h.port))
        lane.bind(f"ipc://{tmpdir_}/lane")
        lane.start()
        try:
            in_thread(lambda: lane.send(plain.address, small(1)))  # waits for a lane
            assert wait_for(lambda: "without a datagram socket" in caplog.text, 5.0)
            in_thread(lambda: plain.send(lane.address, small(2)))  # zmq alone: dropped
            assert wait_for(lambda: "sent by zmq alone" in caplog.text, 5.0)
            assert got == []
        finally:
            lane.stop()
            plain.stop()
    assert caplog.text.count("MONARCH_DATAGRAM_LANE must agree") == 2


def test_a_pointer_whose_message_never_comes_is_given_up(tmpdir_, caplog, monkeypatch):
    monkeypatch.setattr(datagram, "BULK_WAIT_S", 0.3)
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    addr = f"ipc://{tmpdir_}/inbox"
    pull.bind(addr)
    inbox = LaneInbox(pull, addr, [TOKEN])
    d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    d.connect(lane_path(addr))
    try:
        d.send(pointer(b"q" * 16, TOKEN))
        d.send(small(5)[0])
        inbox.setsockopt(zmq.RCVTIMEO, 2000)
        with caplog.at_level(logging.ERROR, logger="runtime.transport"):
            assert inbox.recv() == b""  # given up: read as a wake-up
        assert "did not come within" in caplog.text
        assert framing.parse([inbox.recv()], TOKEN)[0].port == 5
    finally:
        d.close()
        inbox.close()
        ctx.term()


def test_no_socket_file_is_left_behind(tmpdir_):
    loops = []
    for name in ("a", "b"):
        loop = IOLoop(name, TOKEN, lambda h, b, bufs: None)
        loop.bind(f"ipc://{tmpdir_}/{name}")
        loop.start()
        loops.append(loop)
    assert {f for f in os.listdir(tmpdir_) if f.endswith(datagram.SUFFIX)} == \
        {"a" + datagram.SUFFIX, "b" + datagram.SUFFIX}
    in_thread(lambda: loops[0].send(loops[1].address, small(1)))
    for loop in loops:
        loop.stop()
    assert wait_for(lambda: not [f for f in os.listdir(tmpdir_)
                                 if f.endswith(datagram.SUFFIX)], 5.0)


# -- the setting -----------------------------------------------------------------------------------
def test_with_the_lane_off_inboxes_are_plain_zmq(tmpdir_, monkeypatch):
    from runtime.config import config

    monkeypatch.setattr(config, "datagram_lane", False)
    got: list = []
    tx, rx = two_loops(tmpdir_, got)
    try:
        assert isinstance(rx.inbox, zmq.Socket)
        in_thread(lambda: [tx.send(rx.address, small(i) if i % 3 else bulk(i))
                           for i in range(30)])
        assert wait_for(lambda: len(got) == 30)
        assert [p for p, _, _ in got] == list(range(30))
        assert not [f for f in os.listdir(tmpdir_) if f.endswith(datagram.SUFFIX)]
    finally:
        tx.stop()
        rx.stop()


_SCRIPT = """
import os, sys
sys.path.insert(0, {root!r})
import runtime
from runtime import Actor, endpoint, this_host

class Echo(Actor):
    @endpoint
    def echo(self, x):
        return x

    @endpoint
    def lane(self):
        return runtime.get_runtime().loop.lane

mine = runtime.get_runtime().loop.lane
# a setting made after this process's I/O loop started does not reach the processes that
# talk to it by ipc: they run with its lane setting (the local agent, and the agent's procs)
runtime.configure(datagram_lane=not mine)
pm = this_host().spawn_procs(per_host={{"procs": 2}})
am = pm.spawn("echo", Echo)
big = b"x" * (1 << 20)
assert list(am.echo.call(3).get(timeout=30).values()) == [3, 3]
assert am.slice(procs=1).echo.call_one(big).get(timeout=30) == big
assert list(am.lane.call().get(timeout=30).values()) == [mine, mine]
run_dir = os.path.dirname(runtime.get_runtime().address[len("ipc://"):])
print(sorted(f.endswith(".dg") for f in os.listdir(run_dir))[-1])
pm.stop().get(timeout=30)
runtime.shutdown()
"""


@pytest.mark.parametrize("lane", ["1", "0"])
def test_a_mesh_runs_with_the_lane_on_and_off(lane):
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, MONARCH_DATAGRAM_LANE=lane)
    p = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=root)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == ("True" if lane == "1" else "False")
