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


def test_exp2_rounds_with_two_adds_and_stays_exact_at_ties():
    """exp2's range reduction rounds x to an integer as (x + 1.5*2**23) - 1.5*2**23 (2 ops) instead of
    floor(x + 0.5) (cast, cast, compare, select, add, sub); at halves both leave |f| <= 0.5."""
    from zeptograd.codegen.transcendental import ROUND_MAGIC, xexp2
    from zeptograd.dtype import dtypes
    from zeptograd.uop.ops import UOp

    lane = UOp(Ops.DEFINE_VAR, dtypes.float32, (), ("x", -200.0, 200.0))
    graph = xexp2(UOp(Ops.VECTORIZE, dtypes.float32.vec(16), (lane,) * 16)).toposort()
    assert any(u.op is Ops.CONST and u.arg == ROUND_MAGIC for u in graph)
    assert sum(u.op is Ops.CAST for u in graph) == 1  # only n's cast to int; the old floor cast twice more
    x = np.concatenate([np.arange(-149.5, 128, 0.5, dtype=np.float32), np.float32([0.49999997, -0.49999997])])
    x = np.concatenate([x, np.zeros((-len(x)) % 16, np.float32)])
    out = Tensor(x).exp2().numpy()
    ref = np.exp2(x.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(out, ref, rtol=3e-7, atol=0)
