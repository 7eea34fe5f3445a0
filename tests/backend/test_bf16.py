"""Every dtype, bfloat16 first among them, through every op family on every device, against numpy (ml_dtypes).

bfloat16 is its raw 16 bits to the renderers (C, OpenCL, CUDA have no bf16 type; LLVM's i16): its math must run in
float32 and round back, vectors and reduce accumulators included, or `t + 1` adds integers to the bits. Inputs are
(3, 37): vector loops and their tails. The reference is numpy on the float64 values, rounded once to the dtype: exact
families (add, mul, where, compare, casts, max, gather, scatter) must match bit for bit, the others to a few ulps.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.slow import fast_first
from zeptograd import Tensor, dtypes
from zeptograd.dtype import to_numpy_dtype

ml_dtypes = pytest.importorskip("ml_dtypes")

FLOATS = [dtypes.bfloat16, dtypes.float16, dtypes.float32, dtypes.float64]
INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint32]
ALL = FLOATS + INTS
SHAPE = (3, 37)
ULPS = {dtypes.bfloat16: 2.0**-7, dtypes.float16: 2.0**-10, dtypes.float32: 2.0**-22, dtypes.float64: 2.0**-48}


def npdt(dt) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16 if dt == dtypes.bfloat16 else to_numpy_dtype(dt))


def inputs(dt, seed: int, positive: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtypes.is_float(dt):
        x = rng.uniform(0.1 if positive else -4, 4, size=SHAPE)
        x[0, :4] = [0.25 if positive else 0.0, 1.0, 0.5 if positive else -0.5, 2.0]  # exact values among them
        return x.astype(npdt(dt))
    lo = 1 if positive else (0 if dtypes.is_unsigned(dt) else -9)
    return rng.integers(lo, 10, size=SHAPE).astype(npdt(dt))


def tensor(a: np.ndarray, dt, device: str) -> Tensor:
    """a as a Tensor of dt (a bf16 array enters as float32 and is cast: exact, its values are bf16's)."""
    return Tensor(a.astype(np.float32) if dt == dtypes.bfloat16 else a, device=device).cast(dt)


def host(t: Tensor) -> np.ndarray:
    return t.cast(dtypes.float32).numpy() if t.dtype == dtypes.bfloat16 else t.numpy()


def wide(a: np.ndarray) -> np.ndarray:
    """a's values in float64 (floats) or int64 (ints) for the reference"""
    return a.astype(np.float64) if a.dtype.kind in "fV" or a.dtype == npdt(dtypes.bfloat16) else a.astype(np.int64)


def check(got: Tensor, want: np.ndarray, dt, what: str, device: str, ulps: float = 0):
    """got (a Tensor of dtype dt) against want (float64/int64/bool values) rounded once to dt."""
    g = host(got)
    msg = f"{what} on {device}, {dt.name}"
    if want.dtype == np.bool_ or g.dtype == np.bool_:
        np.testing.assert_array_equal(g, want, err_msg=msg)
        return
    w = want.astype(npdt(dt)) if dt != dtypes.bool else want
    if ulps == 0 or not dtypes.is_float(dt):
        np.testing.assert_array_equal(g.astype(np.float64), w.astype(np.float64), err_msg=msg)
    else:
        rtol = ulps * ULPS[dt]
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=0, err_msg=msg)


@pytest.mark.slow
@pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
def test_unary(device, dt):
    a, p = inputs(dt, 1), inputs(dt, 2, positive=True)
    x, xp = tensor(a, dt, device), tensor(p, dt, device)
    cases = {"relu": (x.relu(), np.maximum(wide(a), 0), 0)}
    if not dtypes.is_unsigned(dt):
        cases |= {"neg": (-x, -wide(a), 0), "abs": (x.abs(), np.abs(wide(a)), 0)}
    if dtypes.is_float(dt):
        cases |= {
            "exp": (x.exp(), np.exp(wide(a)), 4),
            "log": (xp.log(), np.log(wide(p)), 4),
            "sqrt": (xp.sqrt(), np.sqrt(wide(p)), 1),
            "sin": (x.sin(), np.sin(wide(a)), 4),
            "floor": (x.floor(), np.floor(wide(a)), 0),
            "trunc": (x.trunc(), np.trunc(wide(a)), 0),
            "reciprocal": (xp.reciprocal(), 1 / wide(p), 1),
        }
    Tensor.realize(*[t for t, _, _ in cases.values()])
    for k, (t, w, ulps) in cases.items():
        check(t, w, dt, k, device, ulps)


@pytest.mark.parametrize("dt", fast_first(ALL), ids=lambda d: d.name)
def test_binary_where_compare(device, dt):
    a, b = inputs(dt, 3), inputs(dt, 4)
    x, y = tensor(a, dt, device), tensor(b, dt, device)
    wa, wb = wide(a), wide(b)
    cases = {
        "add": (x + y, wa + wb, 0),
        "sub": (x - y, wa - wb, 0),
        "mul": (x * y, wa * wb, 0),
        "add_const": (x + 1, wa + 1, 0),
        "maximum": (x.maximum(y), np.maximum(wa, wb), 0),
        "minimum": (x.minimum(y), np.minimum(wa, wb), 0),
        "where": ((x > y).where(x, y), np.where(wa > wb, wa, wb), 0),
        "where_const": ((x < 1).where(x, 2), np.where(wa < 1, wa, 2), 0),
        "lt": (x < y, wa < wb, 0),
        "eq": (x == y, wa == wb, 0),
        "ne": (x != x, wa != wa, 0),
        "ge": (x >= y, wa >= wb, 0),
        "gt_const": (x > 1, wa > 1, 0),
    }
    if dtypes.is_float(dt):
        cases["div"] = (x / (y.abs() + 1), wa / (np.abs(wb) + 1), 1)
    Tensor.realize(*[t for t, _, _ in cases.values()])
    for k, (t, w, ulps) in cases.items():
        check(t, w, dt, k, device, ulps)


CAST_TARGETS = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.float16, dtypes.bfloat16, dtypes.float32]
BITS = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}


@pytest.mark.slow
@pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
def test_cast_and_bitcast(device, dt):
    a = inputs(dt, 5)
    x = tensor(a, dt, device)
    cases = {}
    for to in CAST_TARGETS:
        src = x.abs() if dtypes.is_unsigned(to) and not dtypes.is_unsigned(dt) else x  # no negative -> unsigned
        vals = np.abs(wide(a)) if dtypes.is_unsigned(to) and not dtypes.is_unsigned(dt) else wide(a)
        want = vals != 0 if to == dtypes.bool else vals.astype(npdt(to)) if dtypes.is_float(to) else np.trunc(vals)
        cases[f"to_{to.name}"] = (src.cast(to), to, want)
        # into dt from float32 / int32: values exact in every dtype here (small integers and halves)
        f = np.round(wide(a) * 2) / 2 if dtypes.is_float(dt) else wide(a)
        cases["from_float32"] = (Tensor(f.astype(np.float32), device=device).cast(dt), dt, f)
    bits = BITS[dt.itemsize]
    raw = a.view(npdt(bits))
    cases["bitcast"] = (x.bitcast(bits), bits, raw.astype(np.int64))
    back = Tensor(raw, device=device).bitcast(dt)
    cases["bitcast_back"] = (back, dt, wide(a))
    Tensor.realize(*[t for t, _, _ in cases.values()])
    for k, (t, to, w) in cases.items():
        check(t, w, to, k, device)


@pytest.mark.parametrize("dt", fast_first(ALL), ids=lambda d: d.name)
def test_reduce_and_cumsum(device, dt):
    a = inputs(dt, 6)
    x, wa = tensor(a, dt, device), wide(a)
    ulps = 40 if dtypes.is_float(dt) else 0  # a sum's rounding depends on its order: a few ulps of the largest term
    cases = {
        "max": (x.max(), wa.max(), 0),
        "max_axis": (x.max(axis=1), wa.max(axis=1), 0),
        "min_axis0": (x.min(axis=0), wa.min(axis=0), 0),
        "sum_axis": (x.sum(axis=1), wa.sum(axis=1), ulps),
        "cumsum": (x.cumsum(axis=1), np.cumsum(wa, axis=1), ulps),
    }
    Tensor.realize(*[t for t, _, _ in cases.values()])
    for k, (t, w, u) in cases.items():
        out_dt = t.dtype
        if u and dtypes.is_float(dt):  # compare to the largest partial sum's ulp, not each value's own
            g = host(t).astype(np.float64)
            tol = u * ULPS[dt] * np.abs(np.cumsum(np.abs(wa), axis=1)).max()
            assert np.abs(g - w).max() <= tol, f"{k} on {device}, {dt.name}: {np.abs(g - w).max()} > {tol}"
        else:
            check(t, w, out_dt, k, device)


@pytest.mark.parametrize("dt", fast_first(ALL), ids=lambda d: d.name)
def test_matmul_gather_scatter(device, dt):
    a, b = inputs(dt, 7)[:, :6], inputs(dt, 8)[:2, :5].repeat(3, axis=0)  # (3, 6) @ (6, 5): small int sums
    x, y = tensor(a, dt, device), tensor(b, dt, device)
    idx = np.random.default_rng(9).integers(0, 6, size=(3, 4)).astype(np.int32)
    i = Tensor(idx, device=device)
    src = tensor(inputs(dt, 10)[:, :4], dt, device)
    mm, g, s = x @ y, x.gather(1, i), x.scatter(1, i, src)
    Tensor.realize(mm, g, s)
    want_mm = wide(a) @ wide(b)
    if dtypes.is_float(dt):
        tol = 8 * ULPS[dt] * (np.abs(wide(a)) @ np.abs(wide(b))).max()
        assert np.abs(host(mm).astype(np.float64) - want_mm).max() <= tol, f"matmul on {device}, {dt.name}"
    else:
        check(mm, want_mm, mm.dtype, "matmul", device)
    check(g, np.take_along_axis(wide(a), idx, 1), dt, "gather", device)
    want_s = wide(a).copy()
    srcv = wide(inputs(dt, 10)[:, :4])
    for r in range(3):
        for c in range(4):  # torch leaves the winner of a repeated index unspecified: the last one, as ours
            want_s[r, idx[r, c]] = srcv[r, c]
    check(s, want_s, dt, "scatter", device)


# float32 bit patterns at bfloat16's rounding edges: ties to even (down and up), just past a tie, the largest float
# (rounds to inf), the largest that stays finite, -0, subnormals, a tie in the subnormals, infinities
EDGES = [0x3F808000, 0x3F818000, 0x3F808001, 0xBF817FFF, 0x7F7FFFFF, 0x7F7F7FFF, 0x80000000, 0x00000001]
EDGES += [0x00008000, 0x00018000, 0x807FFFFF, 0x7F800000, 0xFF800000, 0x3F800000, 0x4049_0FDB, 0xC2C8_0000]
NANS = [0x7FFFFFFF, 0x7F800001, 0xFFC00000, 0x7FC00001]  # rounding 0x7fffffff's payload up would carry into -0


def test_float32_to_bf16_rounds_to_nearest_even_bit_for_bit(device):
    """float32 -> bf16 as numpy's ml_dtypes, bit for bit (37 values: a vector loop and its tail); a NaN stays NaN"""
    bits = np.array((EDGES + NANS) * 2 + EDGES[:5], dtype=np.uint32)
    got = Tensor(bits, device=device).bitcast(dtypes.float32).cast(dtypes.bfloat16).bitcast(dtypes.uint16).numpy()
    with np.errstate(invalid="ignore"):  # numpy warns on the NaNs
        want = bits.view(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    nan = np.isnan(bits.view(np.float32))
    np.testing.assert_array_equal(got[~nan], want[~nan], err_msg=f"on {device}")
    assert np.isnan((got[nan].astype(np.uint32) << 16).view(np.float32)).all(), (device, [hex(b) for b in got[nan]])


def test_bf16_to_float32_is_exact_for_every_bit_pattern(device):
    """bf16 -> float32 puts the 16 bits on top of 16 zero bits: all 65536 patterns, NaNs and subnormals included. A
    signaling NaN need only stay a NaN: the PYTHON device holds float32 values as Python floats, which quiet it"""
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = Tensor(bits, device=device).bitcast(dtypes.bfloat16).cast(dtypes.float32).bitcast(dtypes.uint32).numpy()
    want = bits.astype(np.uint32) << 16
    signaling = (want & 0x7FC00000) == 0x7F800000
    signaling &= (want & 0x003FFFFF) != 0
    np.testing.assert_array_equal(got[~signaling], want[~signaling], err_msg=f"on {device}")
    assert np.isnan(got[signaling].view(np.float32)).all(), device
