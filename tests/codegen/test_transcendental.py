"""Vector exp2/log2/sin written as ALU ops: accurate to a few ulp, IEEE special values kept."""

import numpy as np
import pytest

from tests.slow import fast_first
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


@pytest.mark.parametrize(
    "name,lo,hi,n",
    fast_first([("exp2", -160, 140, 4112), ("log2", 0, 1e6, 4128), ("sin", -1e4, 1e4, 4144)], unpack=True),
)
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


def _ulps(out: np.ndarray, x: np.ndarray, name: str) -> np.ndarray:
    ref = getattr(np, name)(x.astype(np.float64))
    return np.abs(out.astype(np.float64) - ref) / np.spacing(np.abs(ref.astype(np.float32))).astype(np.float64)


def _trig_inputs(lo: float, hi: float, n: int) -> np.ndarray:
    """n float32s (a multiple of 16): half uniform in [lo, hi), half the nearest to multiples of pi/2 in it"""
    k = np.arange(np.ceil(lo / (np.pi / 2)), hi / (np.pi / 2))
    near = (k * (np.pi / 2)).astype(np.float32)
    near = near[np.linspace(0, len(near) - 1, n // 2).astype(int)]
    x = np.random.default_rng(n).uniform(lo, hi, n - len(near)).astype(np.float32)
    return np.concatenate([x, near])


@pytest.mark.parametrize("name", ["sin", "cos", "tan"])
def test_vector_trig_leaves_no_libm_call(name):
    """LLVM's 16-lane sin/cos/tan become ALU ops: a reduction by pi/2 and a series"""
    from zeptograd.codegen import full_rewrite
    from zeptograd.renderer.llvmir import LLVMRenderer

    x = _trig_inputs(-1e5, 1e5, 2064)
    (item,) = getattr(Tensor(x), name)().schedule()
    uops, _ = full_rewrite(item.ast, LLVMRenderer())
    assert not any(u.op in (Ops.SIN, Ops.COS, Ops.TAN) for u in uops)
    assert any(u.op is Ops.MUL and u.dtype.scalar.name == "ulong" for u in uops)  # Payne-Hanek's 64-bit products
    assert _ulps(getattr(Tensor(x), name)().numpy(), x, name).max() <= 2


@pytest.mark.parametrize("limit,n", [(6433.0, 1040), (4096.0, 1056)])
def test_cody_waite_and_payne_hanek_agree_where_both_apply(monkeypatch, limit, n):
    """On [4096, 6433) both reductions are valid (Cody-Waite needs q < 2**12, Payne-Hanek x >= 2**12): moving the
    threshold sends the same arguments through one or the other; each within 2 ulp at the near-multiples of pi/2."""
    from zeptograd.codegen import transcendental

    monkeypatch.setattr(transcendental, "CW_LIMIT", limit)
    x = _trig_inputs(4096, 6433, n)  # distinct sizes: distinct kernels, each built under its threshold
    for name in ("sin", "cos", "tan"):
        assert _ulps(getattr(Tensor(x), name)().numpy(), x, name).max() <= 2, (name, limit)


@pytest.mark.parametrize("device", ["PYTHON", "CPU:C"])
def test_trig_alu_ops_on_scalar_backends(monkeypatch, device):
    """The ALU sin/cos/tan as scalars: the reference interpreter checks the 64-bit integer wraparound and the exact
    products without a fused multiply-add (PYTHON rounds every op; C's MULACC is a*b+c)."""
    from zeptograd.codegen import full_rewrite
    from zeptograd.renderer import Renderer

    monkeypatch.setattr(Renderer, "alu_trig", True)
    x = np.concatenate([_trig_inputs(-300, 300, 304), (10 ** np.linspace(3, 38.5, 301)).astype(np.float32)])
    x = np.concatenate([x, -x[-150:], np.float32([0.0, -0.0, np.inf, -np.inf, np.nan])])
    from zeptograd import Device

    (item,) = Tensor(x, device=device).tan().schedule()
    uops, _ = full_rewrite(item.ast, Device[device].renderer)
    assert not any(u.op is Ops.TAN for u in uops)
    for name in ("sin", "cos", "tan"):
        out = getattr(Tensor(x, device=device), name)().numpy()
        with np.errstate(all="ignore"):
            err = _ulps(out[:-5], x[:-5], name)
        assert err.max() <= 2, (name, x[:-5][np.argmax(err)])
        assert np.all(np.isnan(out[-3:])) and out[-5] == (name == "cos") and (name == "cos" or np.signbit(out[-4]))
