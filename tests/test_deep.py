"""No recursion on graph depth: 10^5-node graphs build, schedule, compile and run."""

import numpy as np

from zeptograd import Tensor
from zeptograd.dtype import dtypes
from zeptograd.uop.ops import UOp


def test_chain_of_100k_adds_realizes():
    x, y = Tensor([1.0, 2.0]), Tensor([0.5, 0.25])
    z = x
    for _ in range(100_000):
        z = z + y
    np.testing.assert_allclose(z.numpy(), [1.0 + 50_000, 2.0 + 25_000])


def test_deep_uop_chain_walks():
    v = UOp.variable("v", 0, 10)
    u = v
    for _ in range(100_000):
        u = u + 1
    assert len(u.toposort()) == 100_000 + 2  # v, the constant 1, and each add
    assert (u.vmin, u.vmax) == (100_000, 100_010)
    assert u.simplify() is v + 100_000
    assert u.dtype == dtypes.int32
