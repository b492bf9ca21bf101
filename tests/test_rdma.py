"""RDMABuffer through its public API, with real owner processes (spawned) and checksums."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from typing import Callable, Optional

import pytest
import torch

from runtime.rdma import (RDMABuffer, RDMAAuthError, RDMABufferDroppedError, RDMABufferError,
                          RDMADTypeError, RDMAError, RDMAOwnerDiedError, RDMASizeError,
                          RDMATimeoutError, get_rdma_backend)
from runtime.rdma import client, ibverbs, vm
from runtime.rdma.identity import process_alive, process_start_time
from _procs import stop_all_threads
from _util import wait_until

TRANSPORTS = ["vm", "tcp"]


# -- an owner process ---------------------------------------------------------------------
def pattern(nbytes: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)


def sha(data) -> str:
    if isinstance(data, torch.Tensor):
        data = data.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(bytes(data)).hexdigest()


def _owner_main(conn) -> None:
    """Command loop of an owner process: make buffers, report checksums, drop, exit."""
    held: dict[int, tuple[object, RDMABuffer]] = {}
    while True:
        msg = conn.recv()
        try:
            cmd = msg[0]
            if cmd == "make":
                _, kind, nbytes, dtype, seed = msg
                data = pattern(nbytes, seed)
                if kind == "memoryview":
                    mem = bytearray(data.numpy().tobytes())
                    obj: object = mem
                    buf = RDMABuffer(memoryview(mem))
                else:
                    if kind == "cuda":  # CUDA memory (tests/test_rdma_cuda.py)
                        data = data.cuda()
                    obj = data.view(getattr(torch, dtype))
                    buf = RDMABuffer(obj)
                key = len(held) + 1
                held[key] = (obj, buf)
                conn.send((True, (key, buf)))
            elif cmd == "sha":
                conn.send((True, sha(held[msg[1]][0])))
            elif cmd == "drop":
                held[msg[1]][1].drop().get(timeout=5)
                conn.send((True, None))
            elif cmd == "live":
                from runtime.rdma.server import current_server
                conn.send((True, len(current_server().registry)))
            elif cmd == "exit":
                conn.send((True, None))
                return
        except Exception as e:  # report, keep serving
            conn.send((False, repr(e)))


def _owner_entry(fd: int) -> None:
    """Entry point of an owner subprocess: dies with its parent, serves commands on `fd`."""
    import ctypes
    from multiprocessing.connection import Connection

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    _owner_main(Connection(fd))


class Owner:
    """An owner process (a plain subprocess, not a runtime proc) driven over a socketpair."""

    def __init__(self, env: Optional[dict] = None) -> None:
        from multiprocessing.connection import Connection

        ours, theirs = socket.socketpair()
        here = os.path.dirname(os.path.abspath(__file__))
        code = ("import sys; sys.path[:0] = {!r}; import test_rdma; "
                "test_rdma._owner_entry({})").format([here, os.path.dirname(here)], theirs.fileno())
        self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=[theirs.fileno()],
                                     env={**os.environ, **(env or {})})
        theirs.close()
        self.conn = Connection(ours.detach())
        self.pid = self.proc.pid

    def call(self, *msg, timeout: float = 60):
        self.conn.send(msg)
        if not self.conn.poll(timeout):
            raise TimeoutError(f"owner did not answer {msg[0]}")
        ok, val = self.conn.recv()
        if not ok:
            raise RuntimeError(val)
        return val

    def make(self, nbytes: int, seed: int = 1, kind: str = "tensor", dtype: str = "uint8"):
        return self.call("make", kind, nbytes, dtype, seed)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.conn.close()


@pytest.fixture(scope="module")
def owner():
    """One owner process shared by the tests that leave it healthy."""
    o = Owner()
    yield o
    o.kill()


@pytest.fixture
def fresh_owner():
    """An owner of its own, for tests that drop everything, stop or kill it."""
    o = Owner()
    yield o
    o.kill()


@pytest.fixture(params=TRANSPORTS)
def transport(request, monkeypatch):
    monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", request.param)
    return request.param


# -- reads and writes with checksums ---------------------------------------------------------
@pytest.mark.timeout(90)
@pytest.mark.parametrize("nbytes", [1, 12345, 9 << 20])
def test_read_matches_owner_bytes(owner, transport, nbytes):
    key, buf = owner.make(nbytes, seed=nbytes)
    assert buf.size() == nbytes
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    assert buf.read_into(dst, timeout=20).get(timeout=30) == nbytes
    assert buf.last_transport == transport
    assert sha(dst) == sha(pattern(nbytes, nbytes)) == owner.call("sha", key)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("nbytes", [7, 9 << 20])
def test_write_lands_in_owner_memory(owner, transport, nbytes):
    key, buf = owner.make(nbytes, seed=3)
    src = pattern(nbytes, seed=99)
    assert owner.call("sha", key) != sha(src)
    buf.write_from(src, timeout=20).get(timeout=30)
    assert buf.last_transport == transport
    assert owner.call("sha", key) == sha(src)


@pytest.mark.timeout(60)
def test_memoryview_owner_and_destination(owner, transport):
    key, buf = owner.make(100_000, seed=5, kind="memoryview")
    assert buf.dtype is None
    dst = bytearray(100_000)
    buf.read_into(memoryview(dst)).get(timeout=30)
    assert sha(dst) == owner.call("sha", key)
    new = bytes(range(256)) * 390 + bytes(160)
    buf.write_from(memoryview(new)).get(timeout=30)  # read-only source is fine for a write
    assert owner.call("sha", key) == sha(new)


@pytest.mark.timeout(60)
def test_offset_reads_and_writes_a_sub_range(owner, transport):
    key, buf = owner.make(1 << 20, seed=11)
    whole = pattern(1 << 20, 11)
    part = torch.empty(4096, dtype=torch.uint8)
    buf.read_into(part, offset=8192).get(timeout=30)
    assert torch.equal(part, whole[8192:8192 + 4096])
    patch = torch.full((100,), 0xAB, dtype=torch.uint8)
    buf.write_from(patch, offset=10).get(timeout=30)
    whole[10:110] = 0xAB
    assert owner.call("sha", key) == sha(whole)


@pytest.mark.timeout(60)
def test_typed_tensors_round_trip(owner, transport):
    key, buf = owner.make(4 * 1000, seed=2, dtype="float32")
    assert buf.dtype == "float32"
    dst = torch.empty(1000, dtype=torch.float32)
    buf.read_into(dst).get(timeout=30)
    assert torch.equal(dst.view(torch.uint8), pattern(4000, 2))
    raw = torch.empty(4000, dtype=torch.uint8)  # uint8 is raw bytes: always allowed
    buf.read_into(raw).get(timeout=30)
    assert torch.equal(raw, pattern(4000, 2))


@pytest.mark.timeout(90)
def test_parallel_transfers_are_independent(owner, transport):
    made = [owner.make(3 << 20, seed=s) for s in range(4)]
    dsts = [torch.empty(3 << 20, dtype=torch.uint8) for _ in made]
    futs = [b.read_into(d, timeout=20) for (_, b), d in zip(made, dsts)]
    for f in futs:
        f.get(timeout=30)
    for s, d in enumerate(dsts):
        assert sha(d) == sha(pattern(3 << 20, s))


def _served_connections(pid: int) -> int:
    """The connections the data server of process `pid` serves now (a thread each): the
    sockets it accepted on its unix path (on one host every transport connects there)."""
    import psutil

    on_path = [c for c in psutil.Process(pid).net_connections(kind="unix")
               if c.laddr.endswith("data.sock")]
    return len(on_path) - 1  # the listening socket has that address too


@pytest.mark.timeout(60)
def test_idle_connections_are_bounded(owner, fresh_owner, monkeypatch):
    """At most `rdma_idle_connections` connections stay open for the next transfer, the
    least recently used closed first (a controller reading from procs all day keeps no
    descriptor, nor a data server's thread, for each proc it ever read from)."""
    import runtime

    monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", "tcp")
    monkeypatch.setattr(runtime.config.config, "rdma_streams", 1)
    monkeypatch.setattr(runtime.config.config, "rdma_idle_connections", 1)

    def read(o: Owner) -> None:
        key, buf = o.make(1 << 16, seed=o.pid % 7)
        dst = torch.empty(1 << 16, dtype=torch.uint8)
        buf.read_into(dst, timeout=20).get(timeout=30)
        assert sha(dst) == o.call("sha", key)

    def served(*owners: Owner) -> Callable[[], list[int]]:
        return lambda: [_served_connections(o.pid) for o in owners]

    read(owner)
    wait_until(lambda: served(owner)() == [1], 10, served(owner))  # kept for the next
    read(fresh_owner)  # the older one is closed for it
    wait_until(lambda: served(owner, fresh_owner)() == [0, 1], 10, served(owner, fresh_owner))
    read(owner)
    wait_until(lambda: served(owner, fresh_owner)() == [1, 0], 10, served(owner, fresh_owner))
    monkeypatch.setattr(runtime.config.config, "rdma_idle_connections", 0)
    read(fresh_owner)
    wait_until(lambda: served(owner, fresh_owner)() == [0, 0], 10, served(owner, fresh_owner))


def test_same_process_buffer_reads_and_writes_locally():
    t = pattern(5000, 8).clone()
    buf = RDMABuffer(t)
    clone = pickle.loads(pickle.dumps(buf))
    dst = torch.empty(5000, dtype=torch.uint8)
    clone.read_into(dst).get(timeout=10)
    assert torch.equal(dst, t)
    clone.write_from(torch.zeros(5000, dtype=torch.uint8)).get(timeout=10)
    assert int(t.sum()) == 0
    assert clone.last_transport == "local"
    buf.drop().get(timeout=5)
    with pytest.raises(RDMABufferDroppedError):
        clone.read_into(dst).get(timeout=10)


def test_handle_is_small_and_names_its_owner(owner):
    _, buf = owner.make(64 << 20, seed=1)
    assert len(pickle.dumps(buf)) < 1024  # the bytes never travel with the handle
    assert buf.owner.pid == owner.pid
    assert buf.owner.hostname == socket.gethostname()
    assert str(owner.pid) in repr(buf)


# -- bad input: clear errors at the call site ---------------------------------------------------
def test_bad_buffers_are_refused_with_clear_errors():
    with pytest.raises(RDMABufferError, match="1-D"):
        RDMABuffer(torch.zeros(4, 4))
    with pytest.raises(RDMABufferError, match="contiguous"):
        RDMABuffer(torch.zeros(10)[::2])
    with pytest.raises(RDMABufferError, match="read-only"):
        RDMABuffer(memoryview(b"abc"))
    with pytest.raises(RDMASizeError, match="empty"):
        RDMABuffer(torch.zeros(0))
    with pytest.raises(RDMABufferError, match="torch.Tensor or a writable memoryview"):
        RDMABuffer([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(RDMABufferError, match="dense"):
        RDMABuffer(torch.zeros(5).to_sparse())


def test_size_and_dtype_mismatches_fail_before_any_transfer(owner):
    _, buf = owner.make(4000, dtype="float32")
    with pytest.raises(RDMASizeError, match="4000"):
        buf.read_into(torch.empty(999, dtype=torch.float32))
    with pytest.raises(RDMASizeError, match="overruns"):
        buf.write_from(torch.empty(10, dtype=torch.float32), offset=3990)
    with pytest.raises(RDMADTypeError, match="float32"):
        buf.read_into(torch.empty(500, dtype=torch.int64))
    with pytest.raises(RDMABufferError, match="contiguous"):
        buf.read_into(torch.empty(2000, dtype=torch.float32)[::2])
    with pytest.raises(RDMASizeError, match="offset"):
        buf.read_into(torch.empty(10, dtype=torch.uint8), offset=-1)


# -- failures on the far side ----------------------------------------------------------------
@pytest.mark.timeout(60)
def test_dropped_by_owner_is_reported(owner, transport):
    key, buf = owner.make(1 << 20)
    owner.call("drop", key)
    dst = torch.empty(1 << 20, dtype=torch.uint8)
    with pytest.raises(RDMABufferDroppedError, match="dropped"):
        buf.read_into(dst).get(timeout=10)
    with pytest.raises(RDMABufferDroppedError):
        buf.write_from(dst).get(timeout=10)


@pytest.mark.timeout(60)
def test_drop_from_a_holder_reaches_the_owner(fresh_owner, transport):
    key, buf = fresh_owner.make(4096)
    key2, other = fresh_owner.make(4096, seed=2)
    assert fresh_owner.call("live") == 2
    buf.drop().get(timeout=10)
    assert fresh_owner.call("live") == 1
    with pytest.raises(RDMABufferDroppedError):
        buf.read_into(torch.empty(4096, dtype=torch.uint8)).get(timeout=10)
    dst = torch.empty(4096, dtype=torch.uint8)
    other.read_into(dst).get(timeout=10)  # the other buffer is untouched
    assert sha(dst) == fresh_owner.call("sha", key2)


@pytest.mark.timeout(60)
def test_dead_owner_gives_owner_died_not_a_hang(fresh_owner, transport):
    _, buf = fresh_owner.make(1 << 20)
    dst = torch.empty(1 << 20, dtype=torch.uint8)
    buf.read_into(dst).get(timeout=10)  # warm: a pooled connection now exists
    fresh_owner.kill()
    # OwnerDied, not RDMATimeoutError: the death is seen, the 5 s timeout not waited out
    with pytest.raises(RDMAOwnerDiedError, match=str(fresh_owner.pid)):
        buf.read_into(dst, timeout=5).get(timeout=10)
    with pytest.raises(RDMAOwnerDiedError):
        buf.write_from(dst, timeout=5).get(timeout=10)


@pytest.mark.timeout(60)
def test_stalled_owner_times_out_with_an_error(fresh_owner, transport):
    _, buf = fresh_owner.make(8 << 20)
    dst = torch.empty(8 << 20, dtype=torch.uint8)
    stop_all_threads(fresh_owner.pid)
    try:
        # the transfer's own 1 s timeout answers (a wait's TimeoutError is not one)
        with pytest.raises(RDMATimeoutError):
            buf.read_into(dst, timeout=1.0).get(timeout=5)
        with pytest.raises(RDMATimeoutError):
            buf.write_from(dst, timeout=1.0).get(timeout=5)
    finally:
        os.kill(fresh_owner.pid, signal.SIGCONT)


@pytest.mark.timeout(60)
def test_reused_pid_is_not_mistaken_for_the_owner(owner):
    _, buf = owner.make(4096)
    fake = dataclasses.replace(buf._h, start_time=buf._h.start_time + 1)
    impostor = pickle.loads(pickle.dumps(buf))
    impostor._h = fake
    with pytest.raises(RDMAOwnerDiedError, match="another process"):
        os.environ["MONARCH_RDMA_TRANSPORT"] = "vm"
        try:
            impostor.read_into(torch.empty(4096, dtype=torch.uint8)).get(timeout=10)
        finally:
            del os.environ["MONARCH_RDMA_TRANSPORT"]
    assert process_alive(owner.pid, process_start_time(owner.pid))
    assert not process_alive(owner.pid, (process_start_time(owner.pid) or 0) + 1)


_DIES_WHILE_WE_CONNECT = """
import os, socket, sys
from runtime.rdma import protocol as P
path, stage = sys.argv[1], sys.argv[2]
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path); srv.listen(1)
print("ready", flush=True)
conn, _ = srv.accept()
if stage == "proof":  # reads the client's proof and dies without answering it
    conn.sendall(P.MAGIC + os.urandom(P.NONCE))
    P.recv_exact(conn, P.NONCE + P.MAC)
else:  # proves itself, then dies on the client's identity check
    P.server_handshake(conn, b"s" * 32)
    P.recv_request(conn)
os._exit(0)  # as a killed owner does
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stage", ["proof", "identity"])
def test_owner_dying_while_we_connect_is_owner_died(owner, tmp_path, monkeypatch, stage):
    """An owner killed between accepting us and answering is reported as gone, not as a wrong
    session token or a transport error (races CI hit while a test killed the owner's proc)."""
    _, buf = owner.make(4096)
    path = str(tmp_path / "data.sock")
    dying = subprocess.Popen([sys.executable, "-c", _DIES_WHILE_WE_CONNECT, path, stage],
                             stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        assert dying.stdout.readline().strip() == "ready"
        doomed = pickle.loads(pickle.dumps(buf))
        doomed._h = dataclasses.replace(buf._h, pid=dying.pid, start_time=process_start_time(dying.pid),
                                        addresses=(f"unix:{path}",), secret=b"s" * 32)
        monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", "vm")
        with pytest.raises(RDMAOwnerDiedError, match=f"pid {dying.pid}.*exited while we connected"):
            doomed.read_into(torch.empty(4096, dtype=torch.uint8)).get(timeout=10)
    finally:
        dying.kill()
        dying.wait(timeout=10)
        dying.stdout.close()


@pytest.mark.timeout(60)
def test_wrong_secret_is_rejected_and_server_survives_garbage(owner, caplog):
    key, buf = owner.make(4096, seed=4)
    bad = pickle.loads(pickle.dumps(buf))
    bad._h = dataclasses.replace(buf._h, secret=b"x" * 32)
    os.environ["MONARCH_RDMA_TRANSPORT"] = "tcp"
    try:
        with pytest.raises(RDMAAuthError):
            bad.read_into(torch.empty(4096, dtype=torch.uint8)).get(timeout=10)
        # Raw junk on the TCP data port: dropped by the server, which keeps serving.
        host, port = buf._h.addresses[1].removeprefix("tcp:").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"\x00" * 200)
            s.settimeout(5)
            try:
                while s.recv(4096):
                    pass
            except OSError:
                pass
        dst = torch.empty(4096, dtype=torch.uint8)
        buf.read_into(dst).get(timeout=10)
        assert sha(dst) == owner.call("sha", key)
    finally:
        del os.environ["MONARCH_RDMA_TRANSPORT"]


def test_data_server_listens_only_on_loopback_and_a_private_dir():
    buf = RDMABuffer(torch.zeros(16, dtype=torch.uint8))
    unix, tcp = buf._h.addresses
    assert tcp.startswith("tcp:127.0.0.1:")
    sock_dir = os.path.dirname(unix.removeprefix("unix:"))
    assert os.stat(sock_dir).st_mode & 0o777 == 0o700
    buf.drop()


# -- transports: selection, fallback, ibverbs discovery -----------------------------------------
@pytest.mark.timeout(60)
def test_refused_process_vm_falls_back_to_sockets(owner, monkeypatch, caplog):
    key, buf = owner.make(1 << 20, seed=6)

    def refuse(*a, **k):
        raise vm.VMError(errno.EPERM, "process_vm_readv: Operation not permitted")

    monkeypatch.setattr(vm, "copy", refuse)
    monkeypatch.setattr(client, "_vm_refused", None)
    monkeypatch.delenv("MONARCH_RDMA_TRANSPORT", raising=False)
    dst = torch.empty(1 << 20, dtype=torch.uint8)
    with caplog.at_level(logging.WARNING, logger="runtime.rdma"):
        buf.read_into(dst).get(timeout=10)
    assert sha(dst) == owner.call("sha", key)
    assert buf.last_transport == "tcp"
    assert "falling back to data sockets" in caplog.text
    assert get_rdma_backend(buf) == "tcp"  # remembered for later transfers


def test_same_host_default_is_process_vm(owner, monkeypatch):
    monkeypatch.delenv("MONARCH_RDMA_TRANSPORT", raising=False)
    _, buf = owner.make(4096)
    assert get_rdma_backend(buf) == "vm"


def test_ibverbs_discovery_and_clean_fallback(monkeypatch):
    usable, why = ibverbs.probe()
    if usable:
        pytest.skip(f"this machine has an RDMA device: {why}")
    assert ibverbs.list_devices() == []
    assert ibverbs.open_context() is None
    assert "pyverbs" in why
    monkeypatch.delenv("MONARCH_RDMA_TRANSPORT", raising=False)
    assert get_rdma_backend() == "tcp"


@pytest.mark.timeout(60)
def test_forcing_ibverbs_without_a_device_is_a_clear_error(owner, monkeypatch):
    if ibverbs.probe()[0]:
        pytest.skip("this machine has an RDMA device")
    _, buf = owner.make(4096)
    monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", "ibverbs")
    with pytest.raises(RDMAError, match="no RDMA device"):
        buf.read_into(torch.empty(4096, dtype=torch.uint8)).get(timeout=10)


def test_unknown_transport_name_is_rejected(monkeypatch):
    buf = RDMABuffer(torch.zeros(8, dtype=torch.uint8))
    monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", "carrier-pigeon")
    with pytest.raises(RDMAError, match="carrier-pigeon"):
        buf.read_into(torch.empty(8, dtype=torch.uint8)).get(timeout=10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.timeout(90)
def test_cuda_tensors_on_both_sides(owner, transport):
    key, buf = owner.make(3 << 20, seed=21)
    dst = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
    buf.read_into(dst).get(timeout=30)
    assert sha(dst.cpu()) == owner.call("sha", key)
    src = pattern(3 << 20, 22).cuda()
    buf.write_from(src).get(timeout=30)
    assert owner.call("sha", key) == sha(src.cpu())
    own = torch.arange(1000, dtype=torch.float32, device="cuda")
    cbuf = RDMABuffer(own)
    out = torch.empty(1000, dtype=torch.float32)
    if transport == "vm":  # forced vm cannot read CUDA memory: a clear error, not a crash
        with pytest.raises(RDMAError, match="CUDA memory, which process_vm_readv cannot read"):
            cbuf.read_into(out).get(timeout=30)
        return
    cbuf.read_into(out).get(timeout=30)
    assert torch.equal(out, own.cpu())


@pytest.mark.timeout(60)
def test_owner_on_another_host_is_reached_over_tcp_data_sockets(owner, monkeypatch):
    """A handle whose host id differs (as after crossing hosts) must not use process_vm."""
    monkeypatch.delenv("MONARCH_RDMA_TRANSPORT", raising=False)
    key, buf = owner.make(6 << 20, seed=31)
    remote = pickle.loads(pickle.dumps(buf))
    remote._h = dataclasses.replace(buf._h, host_id="elsewhere/boot/pidns")
    assert get_rdma_backend(remote) == "tcp"
    dst = torch.empty(6 << 20, dtype=torch.uint8)
    remote.read_into(dst).get(timeout=30)
    assert remote.last_transport == "tcp"
    assert sha(dst) == owner.call("sha", key)


def test_timeout_must_be_positive():
    buf = RDMABuffer(torch.zeros(8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="timeout"):
        buf.read_into(torch.empty(8, dtype=torch.uint8), timeout=0)


@pytest.mark.timeout(60)
def test_an_address_taken_over_by_another_process_is_not_trusted(owner, monkeypatch):
    """A handle pointing at a data server that now belongs to someone else must not read it."""
    monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", "tcp")
    _, theirs = owner.make(4096, seed=1)
    mine = RDMABuffer(torch.zeros(4096, dtype=torch.uint8))  # this process's data server
    stale = pickle.loads(pickle.dumps(theirs))
    # same buffer id and secret as a live buffer here, but the owner identity of `theirs`
    stale._h = dataclasses.replace(theirs._h, addresses=mine._h.addresses, secret=mine._h.secret,
                                   buffer_id=mine._h.buffer_id, host_id="elsewhere/x/y")
    with pytest.raises(RDMAOwnerDiedError, match=f"belongs to pid {os.getpid()}"):
        stale.read_into(torch.empty(4096, dtype=torch.uint8)).get(timeout=10)
    mine.drop()


@pytest.mark.timeout(60)
def test_data_server_binds_where_configured(monkeypatch):
    """MONARCH_RDMA_HOST moves the TCP listener (here to another loopback address)."""
    o = Owner(env={"MONARCH_RDMA_HOST": "127.0.0.2"})
    try:
        key, buf = o.make(5 << 20, seed=41)
        assert buf._h.addresses[1].startswith("tcp:127.0.0.2:")
        remote = pickle.loads(pickle.dumps(buf))
        remote._h = dataclasses.replace(buf._h, host_id="elsewhere/boot/pidns")
        monkeypatch.delenv("MONARCH_RDMA_TRANSPORT", raising=False)
        dst = torch.empty(5 << 20, dtype=torch.uint8)
        remote.read_into(dst).get(timeout=30)
        assert remote.last_transport == "tcp"
        assert sha(dst) == o.call("sha", key)
    finally:
        o.kill()
