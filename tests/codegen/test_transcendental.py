"""Vector exp2/log2/sin written as ALU ops: accurate to a few ulp, IEEE special values kept."""

import re

import numpy as np
import pytest

from tests.slow import fast_first
from zeptograd import Tensor
from zeptograd.renderer.cstyle import CStyleRenderer
from zeptograd.uop.ops import GroupOp, Ops

SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 3e-45, 127.9, 128.0, 200.0, -149.5, -126.2, -1000.0, 1.0, 0.5]


@pytest.fixture
def alu_transcendentals(monkeypatch):
    monkeypatch.setattr(CStyleRenderer, "alu_transcendentals", frozenset(GroupOp.Approximated))


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


def test_exp2_below_the_subnormals_selects_zero_computed_from_x_zero():
    """Below -150, 2**x is 0: the range reduction runs on 0 there and the result selects 0, so no product underflows
    (an underflowing multiply takes a microcode assist on x86: exp2 over 2**20 floats of -1000 ran 3.4x slower than
    of -3). Values vs float64 at and around the edge, on the vector backends."""
    from zeptograd.codegen.transcendental import xexp2
    from zeptograd.dtype import dtypes
    from zeptograd.uop.ops import UOp

    x_var = UOp(Ops.DEFINE_VAR, dtypes.float32, (), ("x", -1000.0, 200.0))
    graph = xexp2(x_var).toposort()
    below = [u for u in graph if u.op is Ops.CMPLT and u.src[0] is x_var and u.src[1].arg == -150.0]
    assert len(below) == 1
    selects = [u for u in graph if u.op is Ops.WHERE and u.src[0] is below[0]]
    assert selects and all(u.src[1].op is Ops.CONST and u.src[1].arg == 0.0 for u in selects), selects
    x = np.float32([-1000, -200, -150.5, -150, -149.6, -149, -140, -126.5, -1, 0, 1, 127.9, 128.5, np.inf, -np.inf, 0])
    for device in ("CPU", "CPU:C"):
        out = Tensor(np.tile(x, 2), device=device).exp2().numpy()
        with np.errstate(over="ignore"):
            ref = np.exp2(np.tile(x, 2).astype(np.float64)).astype(np.float32)
        np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_exp_of_nan_is_nan_folded_or_run(device):
    """2**nan is nan, in constant folding (uop/ops.py's python_alu: it gave inf for a constant nan's exp) and on
    the PYTHON device, as everywhere else."""
    import math

    assert np.isnan(Tensor.full((4,), math.nan, device=device).exp().numpy()).all()
    assert np.isnan(Tensor(np.float32([np.nan, np.nan]), device=device).exp2().numpy()).all()


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


def _per_lane_select(ax, axis):
    """the reduction as it was before the branch: both reductions on every lane, one chosen per lane by a WHERE"""
    from zeptograd.codegen import transcendental as T

    small = T._lt(ax, T._c(ax, T.CW_LIMIT))
    return tuple(T._where(small, a, b) for a, b in zip(T._reduce_cody_waite(ax), T._reduce_payne_hanek(ax)))


def _mixed_trig_inputs() -> np.ndarray:
    """vectors of 16 with no huge lane, one, a few, all of them; nan and inf alone in a vector of small values"""
    rng = np.random.default_rng(16)
    x = rng.uniform(-4000, 4000, 16 * 64).astype(np.float32)
    huge = (10 ** rng.uniform(3.62, 38.5, 16 * 64) * rng.choice([-1, 1], 16 * 64)).astype(np.float32)
    for v in range(8, 64):  # vector v: none, 1, 2, ... 16 huge lanes (in a rotating position), then all
        k = v % 17
        lanes = (np.arange(k) * 5 + v) % 16
        x[16 * v + lanes] = huge[16 * v + lanes]
    x[16 * 3 + 7], x[16 * 4 + 2], x[16 * 5 + 15] = np.nan, np.inf, -np.inf
    x[16 * 6 : 16 * 7] = np.float32([4095.9998, 4096.0, -4096.0005, 6433.0] * 4)  # at the threshold
    return x


@pytest.mark.parametrize("name", fast_first(["sin", "cos", "tan"]))  # sin's third output has a cos too
def test_trig_branch_equals_the_per_lane_select_bit_for_bit(monkeypatch, name):
    """Payne-Hanek runs only in vectors with a lane >= CW_LIMIT (a branch): every lane's bits equal those of both
    reductions run on every lane and selected per lane, whichever lanes share its vector; also inside a reduce and
    two trig functions in one kernel"""
    from zeptograd.codegen import transcendental
    from zeptograd.engine import kernels, realize

    x = _mixed_trig_inputs()
    t = Tensor(x)

    def run():
        fn = getattr(t, name)
        return [fn().numpy(), fn().reshape(64, 16).sum(1).numpy(), (fn() + t.cos() * 2).numpy()]

    branch = run()
    monkeypatch.setattr(transcendental, "_reduce_half_pi", _per_lane_select)
    cache: dict = {}  # the same kernel graphs: compile them again
    monkeypatch.setattr(kernels, "_kernel_cache", cache)  # (get_kernel's, and _run_plan's in realize)
    monkeypatch.setattr(realize, "_kernel_cache", cache)
    select = run()
    for got, want in zip(branch, select):
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    # a lane's value does not depend on its neighbours: each value alone in a vector of its own kind gives the same
    alone = getattr(Tensor(np.repeat(x, 16)), name)().numpy()[::16]
    np.testing.assert_array_equal(branch[0].view(np.uint32), alone.view(np.uint32))
    assert _ulps(branch[0][np.isfinite(x)], x[np.isfinite(x)], name).max() <= 2


@pytest.mark.parametrize("renderer", ["LLVM", "OpenCL"])
def test_payne_hanek_runs_inside_a_branch(renderer):
    """the 64-bit products of Payne-Hanek are all inside a loop whose count is whether some lane needs them (once
    or never), opened after Cody-Waite's result is computed"""
    from zeptograd.codegen import full_rewrite
    from zeptograd.renderer.gpu import OpenCLRenderer
    from zeptograd.renderer.llvmir import LLVMRenderer

    (item,) = Tensor(_mixed_trig_inputs()).sin().schedule()
    uops, _ = full_rewrite(item.ast, LLVMRenderer() if renderer == "LLVM" else OpenCLRenderer())
    wide = [i for i, u in enumerate(uops) if u.op is Ops.MUL and u.dtype.scalar.name == "ulong"]
    branch = [i for i, u in enumerate(uops) if u.op is Ops.RANGE and u.src[0].op is not Ops.CONST]
    assert len(branch) == 1 and wide
    (start,) = branch
    end = next(i for i, u in enumerate(uops) if u.op is Ops.END and uops[start] in u.src[1:])
    assert start < min(wide) and max(wide) < end
    cond = uops[start].src[0]
    assert cond.op is Ops.CAST and cond.src[0].dtype.name == "bool" and (cond.vmin, cond.vmax) == (0, 1)


@pytest.mark.parametrize("device", ["CPU", "CL"])
def test_trig_branch_inside_and_after_reduces(device):
    """the Payne-Hanek branch is a loop of its own: inside a reduce's loop (copies of it next to each other in one
    reduce: their accumulators lowered first) and on a reduced value (its count reads the reduce, computed before)"""
    from zeptograd.device import Device

    try:
        Device[device]
    except Exception as e:
        pytest.skip(f"{device}: {e}")
    rng = np.random.default_rng(7)
    x = (10 ** rng.uniform(-2, 6, (48, 56)) * rng.choice([-1, 1], (48, 56))).astype(np.float32)
    t = Tensor(x, device=device)
    ref = np.sin(x.astype(np.float64))
    np.testing.assert_allclose(t.sin().sum(0).numpy(), ref.sum(0), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(t.cos().sum(1).numpy(), np.cos(x.astype(np.float64)).sum(1), rtol=1e-5, atol=1e-4)
    sums = t.sum(1)
    assert _ulps(sums.sin().numpy(), sums.numpy(), "sin").max() <= 2
    y = t.reshape(56, 48)[:, :7]
    assert _ulps((y.sum(1) * 1e3).tan().numpy(), (y.sum(1) * 1e3).numpy(), "tan").max() <= 2


def test_c_vector_transcendentals_are_alu_ops_without_lanes():
    """CPU:C writes a vector's exp2, log2 and sin as their polynomials, and gcc keeps them vectors: their integer,
    compare and select steps are C vectors too (a call per lane, exp2f or log2f, was 4x slower on x.exp(), x.log())"""
    from zeptograd.codegen import full_rewrite, kernel_name

    x = np.random.default_rng(0).uniform(-20, 20, 4096).astype(np.float32)
    renderer = CStyleRenderer()
    for op, fn, call in (("exp", np.exp, "exp2f("), ("log", np.log, "log2f("), ("sin", np.sin, "sinf(")):
        t = getattr(Tensor(np.abs(x) if op == "log" else x, device="CPU:C"), op)()
        (item,) = t.schedule()
        uops, _ = full_rewrite(item.ast, renderer)
        assert any(u.dtype.count > 1 for u in uops)  # the kernel is vectorized
        src = renderer.render(kernel_name(item.ast), uops).src
        loop = src[src.index("for (") :]
        assert call not in src, src
        # no lane of a vector read, but the last step of sin's "does any lane need the long reduction" (an OR of
        # the lanes, halving the vector: two lanes at the end)
        assert len(re.findall(r"\w\[\d+\]", loop)) <= (2 if op == "sin" else 0), src
        ref = fn(np.abs(x) if op == "log" else x)
        np.testing.assert_allclose(t.numpy(), ref, rtol=3e-6, atol=1e-6 if op == "sin" else 0)
