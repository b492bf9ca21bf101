"""Host agents on the namespaced hosts accept only peers holding the cluster key."""
from __future__ import annotations

import time

import pytest
import zmq

pytestmark = pytest.mark.timeout(60)


def test_agent_refuses_key_file_others_can_read(cluster, agents, key_file):
    key_file.chmod(0o644)
    with pytest.raises(RuntimeError, match="readable by others"):
        agents.start(cluster.nodes[0])


def _send(addr: str, frames: list, keys: tuple[bytes, bytes] | None, server_key: bytes | None):
    """Try to send `frames` to the agent as a stranger; return once the agent has refused
    the handshake and dropped the connection (as zmq's monitor of this socket reports)."""
    from zmq.utils.monitor import recv_monitor_message

    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 0)
    mon = s.get_monitor_socket()
    if keys is not None:
        s.curve_publickey, s.curve_secretkey = keys
        s.curve_serverkey = server_key
    s.connect(addr)
    try:
        s.send_multipart(frames, flags=zmq.NOBLOCK)
    except zmq.Again:
        pass  # no connection completed the handshake: nothing could be queued
    seen = []
    deadline = time.monotonic() + 20
    try:
        while zmq.EVENT_DISCONNECTED not in seen or not any(
                e in seen for e in (zmq.EVENT_HANDSHAKE_FAILED_AUTH,
                                    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                                    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)):
            assert time.monotonic() < deadline, f"the agent did not drop us: {seen}"
            if mon.poll(100):
                seen.append(recv_monitor_message(mon)["event"])
    finally:
        s.disable_monitor()
        mon.close()
        s.close()
        ctx.term()


def test_agent_drops_peers_without_the_cluster_key(cluster, agents, key_file):
    from runtime.transport.auth import read_key_file
    from runtime.transport.framing import Header, Kind, build

    node = cluster.nodes[0]
    addr = agents.start(node)
    assert addr.startswith(f"tcp://{cluster.addr(node)}:")
    stop = build(b"\0" * 16, Header(Kind.AGENT_STOP), b"")
    # a stranger with its own keypair who knows the server's public key
    server_pub = read_key_file(str(key_file)).public
    _send(addr, stop, zmq.curve_keypair(), server_pub)
    # a plain TCP peer (no CurveZMQ at all)
    _send(addr, stop, None, None)
    assert agents.procs[node].poll() is None, "the agent obeyed an unauthenticated peer"
    assert "rejected a CurveZMQ peer" in agents.log(node)
