"""What a call sends back besides its value's pickle: the reply header's echo of its call
(`reply_extra`), and an endpoint's return value encoded for the reply (`encode_result`: plain,
pickled, or its large buffers left on the data plane; `UnsendableResult` when it cannot).

Layer 6 (process roles, under `_actor_instance`): imports transport and the basics.
"""

from __future__ import annotations

from typing import Any, Optional

from ..config import config
from ..errors import ActorError
from ..transport.framing import Header, extra_get
from ..transport import bulk, cuda_tensors
from ..transport.serialization import dumps, dumps_plain

__all__ = ["reply_extra", "UnsendableResult", "encode_result"]


def reply_extra(h: Header) -> Optional[dict]:
    """What a reply echoes of its call's header: the batch id of a call whose replies a
    host agent gathers (runtime/host/gather.py), else nothing."""
    if h.extra is None:
        return None
    g = extra_get(h, "g")
    return None if g is None else {"g": g}


class UnsendableResult(Exception):
    """An endpoint's return value cannot travel: `error` goes to the caller instead;
    `unpicklable` when it could not be pickled (counted as the endpoint's error)."""

    def __init__(self, error: ActorError, unpicklable: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.unpicklable = unpicklable


def encode_result(h: Header, name: str, result: Any, mesh: str,
                  rank: int) -> tuple[bytes, tuple, list]:
    """(body, buffers, left) of endpoint `name`'s return value for the reply to `h` (its
    actor: rank `rank` of `mesh`); UnsendableResult says why it cannot travel. Over the
    message limit, its large buffers stay on this proc's data plane for the caller
    (runtime/transport/bulk.py): `left` holds them (RDMABuffers the caller drops once it
    has read them; empty otherwise)."""
    plain = dumps_plain(result)  # plain data: no buffers, no CUDA tensors to see to
    if plain is not None and len(plain) <= config.max_message_bytes:
        return plain, (), []
    caller = h.reply if h.extra is None else extra_get(h, "caller", h.reply)
    keep: Optional[list] = [] if str(caller).startswith("ipc://") else None  # same host
    try:
        with cuda_tensors.sending(keep, release_on_pull=True):  # one receiver: it drops
            data, bufs = dumps(result, f"the return value of {name}()")
    except Exception as e:
        cuda_tensors.release(keep or [])
        raise UnsendableResult(ActorError(
            f"endpoint {name}() returned a value that cannot be pickled: {e}",
            mesh=mesh, rank=rank, endpoint=name), unpicklable=True) from None
    total = len(data) + sum(memoryview(b).nbytes for b in bufs)
    if total > config.max_message_bytes:
        moved = bulk.offload(data, bufs, config.max_message_bytes, drop_on_read=True)
        if moved is None:
            cuda_tensors.release(keep or [])
            raise UnsendableResult(ActorError(
                f"endpoint {name}() returned {total} bytes, over the message limit of "
                f"{config.max_message_bytes}, and its pickled part alone is too large to "
                "leave its arrays on the data plane", mesh=mesh, rank=rank,
                endpoint=name), unpicklable=False)
        data, bufs, held = moved  # the caller drops each buffer once it has read it
        return data, tuple(bufs), [x.buf for x in held]
    return data, tuple(bufs), []
