"""Receiving: a message's frames off a socket, checked, then handed to the loop's handler.

A coalesced frame (several one-frame messages a thread sent in a burst,
runtime/transport/senders.py) is unpacked here and each of its messages is checked and
handled as if it had come alone. Anything that does not parse, or carries another session's
token, is dropped with a log line before anything is unpickled.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import zmq

from . import framing

log = logging.getLogger("runtime.transport")

# plain ints: pyzmq's enum flags make `&` a slow Python call
_EVENTS, _POLLIN, _RCVMORE = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.RCVMORE)
_NOBLOCK = int(zmq.NOBLOCK)
COALESCED = framing.COALESCED
CLEN = len(COALESCED)


def receive(sock: zmq.Socket) -> Optional[list]:
    """One message's frames, or None when none waits: the head frame copied (small: faster
    as bytes), the body and buffers without a copy."""
    try:
        frames = [sock.recv(_NOBLOCK)]
    except zmq.Again:
        return None
    if sock.getsockopt(_RCVMORE):
        frames += sock.recv_multipart(flags=_NOBLOCK, copy=False)
    return frames


def drain(loop: Any, sock: zmq.Socket) -> None:
    """Receive and dispatch what waits in `sock` (`loop`'s thread: a transport.loop.IOLoop)."""
    for i in range(1000):
        # most wake-ups bring one message: ask zmq once (half the cost of zmq.Again)
        if i == 1 and not sock.getsockopt(_EVENTS) & _POLLIN:
            return
        frames = receive(sock)
        if frames is None:
            return
        if len(frames) == 1 and frames[0][:CLEN] == COALESCED:
            for one in unpack(loop, frames[0]):
                dispatch(loop, [one])
        else:
            dispatch(loop, frames)


def unpack(loop: Any, frame: bytes) -> list[bytes]:
    """The messages of a coalesced frame; none, with a log line, if it does not add up."""
    try:
        return framing.unpack_coalesced(frame)
    except framing.FrameError as e:
        loop.stats.dropped += 1
        log.warning("%s: dropped a coalesced frame (%s): %s", loop.name, e,
                    framing.summarize([frame]))
        return []


def dispatch(loop: Any, frames: list) -> None:
    """Check one received message and hand it to `loop.on_message`."""
    try:
        header, body, buffers = framing.parse(frames, loop.tokens)
    except framing.FrameError as e:
        if frames == [b""]:  # a reply inbox's wake-up (transport.inbox.WAKE)
            return
        loop.stats.dropped += 1
        log.warning("%s: dropped a message that is not from this session (%s): %s",
                    loop.name, e, framing.summarize(frames))
        return
    loop.stats.received += 1
    try:
        loop.on_message(header, body, buffers)
    except Exception:
        log.exception("%s: handler failed for message kind %s", loop.name, header.kind)
