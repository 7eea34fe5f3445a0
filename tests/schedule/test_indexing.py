"""schedule/indexing.py's RESHAPE translation: the source index read at every in-range output index is numpy's."""

import itertools

import numpy as np
import pytest

from zeptograd.dtype import dtypes
from zeptograd.schedule.indexing import reshape_index
from zeptograd.uop.ops import AxisType, Ops, UOp

RESHAPES = [
    ((6, 4), (2, 3, 4)),  # a split
    ((2, 3, 4), (6, 4)),  # a merge
    ((2, 3, 4), (4, 6)),  # no common boundary inside: one group
    ((2, 1, 12), (2, 3, 4, 1)),  # size-1 dims on both sides
    ((1, 5, 1), (5,)),
    ((3, 4), (3, 4)),
    ((2, 6, 5), (2, 3, 2, 5, 1)),
    ((24,), (2, 3, 4)),
    ((2, 3, 4), (1, 24, 1)),
]


@pytest.mark.parametrize("shape,src_shape", RESHAPES)
def test_reshape_index_is_numpys(shape, src_shape):
    idx = tuple(UOp.range(s, i, AxisType.LOOP) if s != 1 else UOp.const(dtypes.index, 0) for i, s in enumerate(shape))
    new = reshape_index(idx, shape, src_shape)
    assert len(new) == len(src_shape)
    for point in itertools.product(*[range(s) for s in shape]):
        consts = {r: UOp.const(dtypes.index, p) for r, p in zip(idx, point) if r.op is Ops.RANGE}
        got = [i.substitute(consts).simplify() for i in new]
        assert all(g.op is Ops.CONST for g in got), got
        want = np.unravel_index(np.ravel_multi_index(point, shape), src_shape)
        assert [g.arg for g in got] == [int(w) for w in want], (point, shape, src_shape)


def test_a_padded_read_keeps_no_divmod_of_other_dimensions():
    """(c, y-1, x-1) read through a reshape that only adds size-1 dims: each source index is its own dimension's
    index (the flat index c*3136 + (y-1)*56 + (x-1) can be negative where the pad masks the read, so its divmods
    could not be simplified away)."""
    c, y, x = (UOp.range(s, i, AxisType.LOOP) for i, s in enumerate((64, 58, 58)))
    idx = (c, y - 1, x - 1)
    new = reshape_index(idx, (64, 56, 56), (1, 64, 56, 56, 1))
    assert new[1] is c and all(Ops.IDIV not in {u.op for u in i.toposort()} for i in new)
