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
