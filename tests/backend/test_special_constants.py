"""Constants a renderer must write correctly: negative, -0.0, NaN, +-inf, denormals, each dtype's extremes.

Each constant meets a tensor in several ops (`x - c` is where `(val0--1.5f)` once failed to compile), in a kernel of
7 and of 37 elements (a vector loop and its scalar tail), on every device, against numpy (ml_dtypes for bfloat16),
bit for bit: the sign of a zero counts, NaN equals NaN. CUDA is compile-checked with NVRTC (no GPU needed).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from zeptograd import Tensor, dtypes
from zeptograd.dtype import to_numpy_dtype

ml_dtypes = pytest.importorskip("ml_dtypes")

FLOATS = [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]
INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64]


def np_dtype(dt):
    return np.dtype(ml_dtypes.bfloat16 if dt == dtypes.bfloat16 else to_numpy_dtype(dt))


def float_constants(dt) -> list[float]:
    fi = ml_dtypes.finfo(np_dtype(dt))
    tiny = float(fi.smallest_subnormal)
    return [-1.5, -0.0, 0.0, math.nan, math.inf, -math.inf, tiny, -tiny, 3 * tiny, float(fi.max), -float(fi.max)]


def int_constants(dt) -> list[int]:
    lo, hi = dtypes.min(dt), dtypes.max(dt)
    return sorted(v for v in {lo, lo + 1, -3, -1, 0, 1, 5, hi - 1, hi} if lo <= v <= hi)


def float_cases(c: float):
    """name -> (zeptograd fn, numpy fn of an array of the dtype and the constant as that dtype)"""
    return {
        "sub": (lambda x: x - c, lambda a, k: a - k),
        "rsub": (lambda x: c - x, lambda a, k: k - a),
        "mul": (lambda x: x * c, lambda a, k: a * k),
        "add": (lambda x: x + c, lambda a, k: a + k),
        "where": (lambda x: (x > 0).where(c, x), lambda a, k: np.where(a > 0, k, a)),
        "max": (lambda x: x.maximum(c), lambda a, k: np.maximum(a, k)),
        "lt": (lambda x: x < c, lambda a, k: a < k),
        "eq": (lambda x: x == c, lambda a, k: a == k),
    }


def int_cases(c: int):
    return {
        "sub": (lambda x: x - c, lambda a, k: a - k),
        "rsub": (lambda x: c - x, lambda a, k: k - a),
        "mul": (lambda x: x * c, lambda a, k: a * k),
        "where": (lambda x: (x > 2).where(c, x), lambda a, k: np.where(a > 2, k, a)),
        "max": (lambda x: x.maximum(c), lambda a, k: np.maximum(a, k)),
        "lt": (lambda x: x < c, lambda a, k: a < k),
    }


def same_bits(got: np.ndarray, want: np.ndarray, msg: str, signed_zeros: bool = True):
    if got.dtype == np.bool_:
        np.testing.assert_array_equal(got, want, err_msg=msg)
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    assert np.array_equal(g, w, equal_nan=True), f"{msg}\ngot  {g}\nwant {w}"
    signs = ~np.isnan(w) if signed_zeros else w != 0
    assert np.array_equal(np.signbit(g[signs]), np.signbit(w[signs])), f"{msg}: the sign of a zero\n{g}\n{w}"


def xs(dt, n: int) -> np.ndarray:
    if dtypes.is_float(dt):
        base = np.array([-2.5, -1.0, -0.0, 0.0, 0.5, 1.0, 3.0], dtype=np.float64)
    else:
        lo, hi = dtypes.min(dt), dtypes.max(dt)
        return np.resize(np.array([v for v in [lo, -2, -1, 0, 1, 3, hi] if lo <= v <= hi], dtype=np_dtype(dt)), n)
    return np.resize(base, n).astype(np_dtype(dt))


@pytest.mark.slow
@pytest.mark.parametrize("n", [7, 37])
@pytest.mark.parametrize("dt", FLOATS + INTS, ids=lambda d: d.name)
def test_constants(device, dt, n):
    is_float = dtypes.is_float(dt)
    a = xs(dt, n)
    for c in float_constants(dt) if is_float else int_constants(dt):
        cases = float_cases(c) if is_float else int_cases(c)
        x = Tensor(a.astype(np.float32) if dt == dtypes.bfloat16 else a, device=device).cast(dt)
        outs = {k: f(x) for k, (f, _) in cases.items()}
        Tensor.realize(*outs.values())
        k_np = np_dtype(dt).type(c)
        with np.errstate(all="ignore"):
            for k, (_, f) in cases.items():
                got = outs[k].numpy() if outs[k].dtype != dtypes.bfloat16 else outs[k].float().numpy()
                # max(-0.0, 0.0): numpy returns its first operand, IEEE maximum +0.0; either is a max
                msg = f"{k} with {c!r} on {device}, {dt.name}, n={n}"
                same_bits(got, f(a, k_np), msg, signed_zeros=k != "max")


@pytest.mark.slow
def test_constants_compile_for_cuda():
    """Every constant and op above, rendered as CUDA C and compiled by NVRTC."""
    from zeptograd.codegen import full_rewrite, kernel_name
    from zeptograd.engine.realize import schedule_tensors
    from zeptograd.renderer.gpu import CUDARenderer
    from zeptograd.runtime import ops_cuda

    try:
        ops_cuda.nvrtc()
    except ops_cuda.DeviceUnavailable as e:
        pytest.skip(str(e))
    renderer = CUDARenderer()
    for dt in FLOATS + INTS:
        is_float = dtypes.is_float(dt)
        x = Tensor.empty(37, dtype=dt, device="PYTHON")
        outs = [
            f(x)
            for c in (float_constants(dt) if is_float else int_constants(dt))
            for f, _ in (float_cases(c) if is_float else int_cases(c)).values()
        ]
        for item in schedule_tensors(outs):
            uops, _ = full_rewrite(item.ast, renderer)
            spec = renderer.render(kernel_name(item.ast), uops)
            try:
                binary = ops_cuda.nvrtc_compile(spec.src, "sm_90")
            except Exception as e:
                raise AssertionError(f"{dt.name}: {e}\n{spec.src}") from e
            assert binary[:4] == b"\x7fELF", dt.name
