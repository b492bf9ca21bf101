"""Pure shape logic: slicing, points, rank arithmetic, rename, split, flatten."""

import pickle

import pytest

from runtime.shapes import Point, Shape, ShapeError
from runtime.value_mesh import ValueMesh


def test_dense_shape_ranks_and_coords():
    s = Shape.from_sizes({"hosts": 2, "procs": 3})
    assert len(s) == 6 and s.sizes == {"hosts": 2, "procs": 3}
    assert s.coords_of(4) == {"hosts": 1, "procs": 1}
    assert s.local_rank({"hosts": 1, "procs": 2}) == 5
    assert s.global_ranks() == list(range(6))


def test_int_drops_dimension_slice_keeps_it():
    s = Shape.from_sizes({"hosts": 2, "procs": 4})
    a = s.slice(procs=1)
    assert a.labels == ("hosts",) and a.global_ranks() == [1, 5]
    b = s.slice(procs=slice(0, 2))
    assert b.sizes == {"hosts": 2, "procs": 2} and b.global_ranks() == [0, 1, 4, 5]
    c = s.slice(hosts=1, procs=slice(1, 4, 2))
    assert c.global_ranks() == [5, 7]
    assert s.slice(procs=-1).global_ranks() == [3, 7]


def test_slice_of_slice_composes():
    s = Shape.from_sizes({"x": 8})
    t = s.slice(x=slice(2, 8)).slice(x=slice(1, None, 2))
    assert t.global_ranks() == [3, 5, 7]


@pytest.mark.parametrize("sel,msg", [
    ({"nope": 1}, "no dimension 'nope'"),
    ({"procs": 9}, "out of range"),
    ({"procs": slice(3, 1)}, "selects nothing"),
    ({"procs": "a"}, "int or a slice"),
])
def test_bad_slices_name_the_problem(sel, msg):
    s = Shape.from_sizes({"procs": 4})
    with pytest.raises(ShapeError, match=msg):
        s.slice(**sel)


def test_rename_split_flatten():
    s = Shape.from_sizes({"hosts": 2, "gpus": 8})
    r = s.rename(gpus="g")
    assert r.labels == ("hosts", "g")
    sp = s.split(gpus=("dp", "tp"), tp=2)
    assert sp.sizes == {"hosts": 2, "dp": 4, "tp": 2}
    # the split keeps rank order
    assert sp.global_ranks() == s.global_ranks()
    assert sp.slice(tp=1).global_ranks() == [1, 3, 5, 7, 9, 11, 13, 15]
    f = sp.flatten("all")
    assert f.sizes == {"all": 16} and f.global_ranks() == list(range(16))
    with pytest.raises(ShapeError, match="not divisible"):
        s.split(gpus=("a", "b"), b=3)
    with pytest.raises(ShapeError, match="non-contiguous"):
        s.slice(gpus=slice(0, 4)).flatten("z")
    assert s.slice(gpus=slice(0, 8, 2)).flatten("z").global_ranks() == list(range(0, 16, 2))


def test_points():
    s = Shape.from_sizes({"hosts": 2, "procs": 2})
    p = Point(3, s)
    assert p.rank == 3 and p["hosts"] == 1 and p.procs == 1
    assert dict(p) == {"hosts": 1, "procs": 1}
    assert pickle.loads(pickle.dumps(p)) == p
    with pytest.raises(AttributeError):
        p.gpus


def test_value_mesh_slicing_and_items():
    vm = ValueMesh(Shape.from_sizes({"hosts": 2, "procs": 3}), list("abcdef"))
    assert len(vm) == 6
    assert vm.item(hosts=1, procs=0) == "d"
    assert list(vm.slice(procs=2).values()) == ["c", "f"]
    pts = [(dict(p), v) for p, v in vm.slice(hosts=1).items()]
    assert pts == [({"procs": 0}, "d"), ({"procs": 1}, "e"), ({"procs": 2}, "f")]
    assert pickle.loads(pickle.dumps(vm)) == vm
    with pytest.raises(ShapeError):
        vm.item(hosts=0)
