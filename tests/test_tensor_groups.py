"""The pure logic of the tensor engine's collectives: groups per mesh dimension, output
shapes, argument checks and to_mesh's rank pairing (no procs)."""

from __future__ import annotations

import pytest

from runtime.shapes import Shape
from runtime.tensor._groups import (MeshDimError, check_inplace, group_size, normalize_dims,
                                    reduce_groups, reduce_shape, transfer_pairs)

HG = Shape.from_sizes({"host": 2, "gpu": 3})


def test_groups_over_each_dimension_hold_procs_equal_elsewhere():
    # row-major local ranks: (h, g) -> 3h + g
    assert reduce_groups(HG, ("gpu",)) == [[0, 1, 2], [3, 4, 5]]
    assert reduce_groups(HG, ("host",)) == [[0, 3], [1, 4], [2, 5]]
    assert reduce_groups(HG, ("host", "gpu")) == [[0, 1, 2, 3, 4, 5]]
    assert group_size(HG, ("host",)) == 2 and group_size(HG, ("host", "gpu")) == 6


def test_groups_on_renamed_split_and_sliced_shapes():
    renamed = HG.rename(host="dp", gpu="tp")
    assert reduce_groups(renamed, ("dp",)) == reduce_groups(HG, ("host",))
    split = Shape.from_sizes({"host": 4, "gpu": 2}).split(host=("dp", "pp"), pp=2)
    assert split.labels == ("dp", "pp", "gpu")
    # (dp, pp, gpu) -> 4dp + 2pp + gpu
    assert reduce_groups(split, ("dp",)) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert reduce_groups(split, ("pp", "gpu")) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    sliced = HG.slice(gpu=slice(1, 3))
    assert reduce_groups(sliced, ("host",)) == [[0, 2], [1, 3]]


def test_normalize_dims_names_the_mesh_dims_in_errors():
    assert normalize_dims(HG, "host", "sum", False) == ("host",)
    assert normalize_dims(HG, (), "max", False) == ("host", "gpu")
    with pytest.raises(MeshDimError, match=r"no dimension 'dp'.*'host': 2, 'gpu': 3"):
        normalize_dims(HG, "dp", "sum", False)
    with pytest.raises(ValueError, match="reduction 'mean' is not supported"):
        normalize_dims(HG, "host", "mean", False)
    with pytest.raises(ValueError, match="twice"):
        normalize_dims(HG, ("host", "host"), "sum", False)
    with pytest.raises(ValueError, match="one dimension only"):
        normalize_dims(HG, ("host", "gpu"), "stack", False)
    with pytest.raises(ValueError, match="one dimension only"):
        normalize_dims(HG, ("host", "gpu"), "sum", True)


def test_output_shapes():
    assert reduce_shape((4, 5), 3, "sum", False) == (4, 5)
    assert reduce_shape((4, 5), 3, "stack", False) == (3, 4, 5)
    assert reduce_shape((3, 5), 3, "sum", True) == (5,)
    assert reduce_shape((3, 5), 3, "stack", True) == (3, 5)
    with pytest.raises(ValueError, match="outermost dimension.*group size 3"):
        reduce_shape((4, 5), 3, "sum", True)
    with pytest.raises(ValueError, match="outermost"):
        reduce_shape((), 2, "avg", True)


def test_inplace_needs_the_same_shape():
    check_inplace("sum", False)
    check_inplace("stack", True)
    with pytest.raises(ValueError, match="changes the shape"):
        check_inplace("sum", True)
    with pytest.raises(ValueError, match="adds a dimension"):
        check_inplace("stack", False)


def test_transfer_pairs_match_coordinates_and_broadcast():
    src = HG.slice(host=0)  # {gpu: 3}
    dst = HG.slice(host=1)
    assert transfer_pairs(src, dst) == [(0, 0), (1, 1), (2, 2)]
    # a destination dimension the source lacks: broadcast along it
    assert transfer_pairs(src, HG) == [(0, 0), (1, 1), (2, 2), (0, 3), (1, 4), (2, 5)]
    with pytest.raises(ValueError, match="size 3 on the source.*2 on the destination"):
        transfer_pairs(src, Shape.from_sizes({"gpu": 2}))
    with pytest.raises(MeshDimError, match="no dimension 'gpu'"):
        transfer_pairs(src, Shape.from_sizes({"procs": 3}))
