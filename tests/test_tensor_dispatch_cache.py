"""The pure logic of the controller's per-op dispatch: the metadata cache's op kinds and
keys, the fast path's key (equal to the general path's), and the worker's flat argument
resolution (no procs)."""

from __future__ import annotations

import pickle

import pytest
import torch

from runtime.tensor import _metacache as mc
from runtime.tensor import _tensor
from runtime.tensor._tensor import Tensor, _prepare
from runtime.tensor._worker import Ref, _flat_args

aten = torch.ops.aten


def test_op_kinds_from_schemas():
    assert mc.kind(aten.add.Tensor) == "f"
    assert mc.kind(aten.view.default) == "v"
    assert mc.kind(aten.add_.Tensor) == "i"
    assert mc.kind(aten._local_scalar_dense.default) is None  # returns a Scalar
    assert mc.kind(aten.split.Tensor) == "v"
    assert mc.op_info(aten.add.Tensor) == ("f", "aten::add.Tensor")


def test_keys_tell_metadata_apart_and_match_equal_metadata():
    a, b = torch.zeros(4, 4), torch.ones(4, 4)
    k = mc.cache_key(aten.add.Tensor, (a, 1), {}, False)
    assert k == mc.cache_key(aten.add.Tensor, (b, 1), {}, False)  # values do not count
    others = [
        mc.cache_key(aten.add.Tensor, (torch.zeros(4, 5), 1), {}, False),
        mc.cache_key(aten.add.Tensor, (torch.zeros(4, 4, dtype=torch.int64), 1), {}, False),
        mc.cache_key(aten.add.Tensor, (torch.zeros(4, 4).t(), 1), {}, False),  # strides
        mc.cache_key(aten.add.Tensor, (a, 1.0), {}, False),  # an int and a float
        mc.cache_key(aten.add.Tensor, (a, True), {}, False),
        mc.cache_key(aten.add.Tensor, (a, 1), {"alpha": 2}, False),
        mc.cache_key(aten.sub.Tensor, (a, 1), {}, False),
    ]
    assert all(o is not None and o != k for o in others)
    assert len(set(others)) == len(others)


def test_uncacheable_calls_have_no_key():
    a = torch.zeros(2)
    assert mc.cache_key(aten._local_scalar_dense.default, (a,), {}, True) is None
    assert mc.cache_key(aten.add_.Tensor, (a, 1), {}, False) is None  # not a mesh tensor
    assert mc.cache_key(aten.add_.Tensor, (a, 1), {}, True) is not None
    assert mc.cache_key(aten.add.Tensor, (a, object()), {}, False) is None
    assert mc.lookup(None) is None


def test_make_key_equals_cache_key():
    a = torch.zeros(3, 2)
    args, kwargs = (a, 2.5, [a, 1]), {"alpha": 3, "dtype": torch.float16}
    parts = (mc.tensor_key(a), mc.atom_key(2.5), mc.key_of([a, 1]))
    kparts = (("alpha", mc.atom_key(3)), ("dtype", mc.atom_key(torch.float16)))
    assert mc.make_key("aten::add.Tensor", parts, kparts) == \
        mc.cache_key(aten.add.Tensor, args, kwargs, False)


def test_remember_and_lookup(monkeypatch):
    monkeypatch.setattr(mc, "cache", {})
    meta = torch.empty(2, 3, device="meta")
    mc.remember("k1", meta)
    assert mc.lookup("k1") == ([((2, 3), (3, 1), torch.float32)], "")
    mc.remember("k2", (meta, meta))
    assert mc.lookup("k2")[1] == "tuple" and len(mc.lookup("k2")[0]) == 2
    mc.remember("k3", meta[1:])  # an output at an offset is not remembered
    assert mc.lookup("k3") is None
    mc.remember_inplace("k4")
    assert mc.lookup("k4") == ((), "inplace")
    monkeypatch.setattr(mc, "CACHE_MAX", 3)
    mc.remember("k5", meta)  # full: cleared first
    assert list(mc.cache) == ["k5"]


@pytest.fixture
def mesh_tensor():
    """A mesh tensor with no mesh behind it (its free is dropped: no engine to send to)."""
    t = Tensor((4, 4), (4, 1), 0, torch.float32, None, None, torch.device("cpu"), None, (),
               None)
    _tensor._live.pop(t.ref)
    return t


def test_fast_path_key_equals_general_key(mesh_tensor):
    t = mesh_tensor
    for func, args, kwargs in [(aten.add.Tensor, (t, 1), {}),
                               (aten.add.Tensor, (t, t), {"alpha": 2}),
                               (aten.add_.Tensor, (t, 0.5), {}),
                               (aten.to.dtype, (t, torch.float64), {})]:
        kind, name = mc.op_info(func)
        wire, wkw, found, local, ckey, plain = _prepare(name, kind, args, kwargs)
        assert plain and not local and found == [x for x in args if x is t]
        assert ckey == mc.cache_key(func, args, kwargs, True)
        assert [type(w) for w in wire] == [Ref if a is t else type(a) for a in args]
        assert set(wkw) == set(kwargs)
    assert t._mkey == mc.tensor_key(t)


def test_general_path_for_local_tensors_and_nesting(mesh_tensor):
    t = mesh_tensor
    for args in [(t, torch.ones(4, 4)), ([t, t], 0)]:
        wire, _, found, _, ckey, plain = _prepare("aten::add.Tensor", "f", args, {})
        assert not plain and ckey is _tensor._LATER and t in found
    # an in-place op on a local tensor with a mesh tensor argument: no key
    *_, ckey, plain = _prepare("aten::add_.Tensor", "i", (torch.ones(4, 4), t),
                              {})
    assert ckey is _tensor._LATER and not plain


def test_plain_commands_pickle_with_the_c_pickler():
    cmd = [("op", "aten::add.Tensor", (Ref(3), 1, torch.float16, torch.device("cpu")), {},
            [4]), ("free", (3,))]
    back = pickle.loads(pickle.dumps(cmd, 5))
    assert back[0][2][0].id == 3 and back[0][2][2] is torch.float16 and back[1] == cmd[1]


def test_worker_flat_args():
    x = torch.zeros(2)
    refs = {1: x}
    assert _flat_args((Ref(1), 2, None), refs) == [x, 2, None]
    assert _flat_args((Ref(2), 2), refs) is None  # not here: the general path fails the op
    assert _flat_args(([Ref(1)], 0), refs) is None  # nested
