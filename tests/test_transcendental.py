"""Vector exp2/log2/sin written as ALU ops: accurate to a few ulp, IEEE special values kept."""

import numpy as np
import pytest

from zeptograd import Tensor
from zeptograd.renderer.cstyle import CStyleRenderer
from zeptograd.uop.ops import Ops

SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 3e-45, 127.9, 128.0, 200.0, -149.5, -126.2, -1000.0, 1.0, 0.5]


@pytest.fixture
def alu_transcendentals(monkeypatch):
    monkeypatch.setattr(CStyleRenderer, "alu_transcendentals", True)


def inputs(lo, hi, n, seed):
    """n values (a multiple of 16, so the kernel is vectorized): uniform in [lo, hi), then the special ones"""
    special = np.array(SPECIAL * 16, np.float32)
    x = np.random.default_rng(seed).uniform(lo, hi, n - len(special)).astype(np.float32)
    return np.concatenate([x, special])


@pytest.mark.parametrize("name,lo,hi,n", [("exp2", -160, 140, 4112), ("log2", 0, 1e6, 4128), ("sin", -1e4, 1e4, 4144)])
def test_vector_transcendental_accuracy(alu_transcendentals, name, lo, hi, n):
    x = inputs(lo, hi, n, seed=n)
    if name == "log2":
        x = np.concatenate([x[:-32], np.abs(x[-32:]) * -1])  # negatives give nan
    (item,) = getattr(Tensor(x, device="CPU:C"), name)().schedule()
    from zeptograd.codegen import full_rewrite

    uops, _ = full_rewrite(item.ast, CStyleRenderer())
    assert not any(u.op in (Ops.EXP2, Ops.LOG2, Ops.SIN) for u in uops)  # no libm call left
    out = getattr(Tensor(x, device="CPU:C"), name)().numpy()
    with np.errstate(all="ignore"):
        ref = getattr(np, name)(x.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(out, ref, rtol=3e-6, atol=1e-7, equal_nan=True)
