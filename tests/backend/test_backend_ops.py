"""A representative set of Tensor ops on every device, checked against numpy and against the PYTHON device.

Each case is (inputs, zeptograd function, numpy function). A device's output must match numpy (loosely) and the
PYTHON interpreter's output of the same kernels (floats to 1e-6 relative, everything else exactly). Shapes are
small: PYTHON interprets every UOp.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from tests.slow import fast_first
from zeptograd import Tensor, dtypes

from .conftest import REFERENCE, unavailable

rng = np.random.default_rng(0)
F = rng.uniform(-3, 3, size=(3, 5)).astype(np.float32)
G = rng.uniform(-3, 3, size=(5,)).astype(np.float32)
POS = rng.uniform(0.1, 4, size=(3, 5)).astype(np.float32)
I = rng.integers(-50, 50, size=(3, 5)).astype(np.int32)
J = rng.integers(1, 7, size=(3, 5)).astype(np.int32)
U8 = rng.integers(0, 256, size=(4, 4)).astype(np.uint8)
I8 = rng.integers(-128, 128, size=(4, 4)).astype(np.int8)
H = rng.uniform(-2, 2, size=(2, 6)).astype(np.float16)
B = rng.random((3, 5)) > 0.5
X3 = rng.uniform(-2, 2, size=(2, 3, 4)).astype(np.float32)
MA = rng.uniform(-1, 1, size=(4, 6)).astype(np.float32)
MB = rng.uniform(-1, 1, size=(6, 5)).astype(np.float32)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """numpy float32 -> the nearest bfloat16 (ties to even), as float32."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return u.view(np.float32)


def np_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def softmax(t: Tensor, axis: int) -> Tensor:
    e = (t - t.max(axis=axis, keepdim=True)).exp()
    return e / e.sum(axis=axis, keepdim=True)


# name -> (inputs, zeptograd fn, numpy fn[, rtol])
CASES = {
    # elementwise and broadcasting
    "add_bcast": ((F, G), lambda a, b: a + b, lambda a, b: a + b),
    "sub_mul_div": ((F, POS), lambda a, b: (a - b) * a / b, lambda a, b: (a - b) * a / b),
    "scalar_ops": ((F,), lambda a: 2.5 * a - 1 + a * a, lambda a: 2.5 * a - 1 + a * a),
    "max_min_where": (
        (F, POS),
        lambda a, b: (a < 0).where(a.maximum(b), a.minimum(-b)),
        lambda a, b: np.where(a < 0, np.maximum(a, b), np.minimum(a, -b)),
    ),
    "compare": (
        (F, G),
        lambda a, b: (a < b).float() + (a == a).float() * 2 + (a != b).float() * 4,
        lambda a, b: (a < b) + (a == a) * 2.0 + (a != b) * 4.0,
    ),
    "relu_abs_neg": ((F,), lambda a: a.relu() + a.abs() - (-a), lambda a: np.maximum(a, 0) + np.abs(a) + a),
    # transcendentals
    "exp_log": ((POS,), lambda a: a.exp() + a.log(), lambda a: np.exp(a) + np.log(a), 1e-5),
    "sin_cos": ((F,), lambda a: a.sin() * 2 + a.cos(), lambda a: np.sin(a) * 2 + np.cos(a), 1e-5),
    "sqrt_recip": ((POS,), lambda a: a.sqrt() + a.reciprocal(), lambda a: np.sqrt(a) + 1 / a, 1e-5),
    "trunc_floor": ((F,), lambda a: a.trunc() * 10 + a.floor(), lambda a: np.trunc(a) * 10 + np.floor(a)),
    # integers and bools
    "int_arith": ((I, J), lambda a, b: a * 3 - b + a * b, lambda a, b: a * 3 - b + a * b),
    "int_div_mod": ((np.abs(I),), lambda a: a // 7 + (a % 5) * 100, lambda a: a // 7 + (a % 5) * 100),
    "int_bitwise": ((I, J), lambda a, b: (a & b) | (a ^ 5) | (b << 2), lambda a, b: (a & b) | (a ^ 5) | (b << 2)),
    "int_shr_max": ((np.abs(I), J), lambda a, b: (a >> 1).maximum(b), lambda a, b: np.maximum(a >> 1, b)),
    "int8_wrap": ((I8,), lambda a: a + a * 3, lambda a: a + a * np.int8(3)),
    "uint8_wrap": ((U8,), lambda a: a * 7 + 200, lambda a: a * np.uint8(7) + np.uint8(200)),
    "bool_ops": (
        (B, B[::-1].copy()),
        lambda a, b: (a & b) | (a ^ b).logical_not(),
        lambda a, b: (a & b) | np.logical_not(a ^ b),
    ),
    # casts
    "cast_half": (
        (F,),
        lambda a: (a.half() * 3).float(),
        lambda a: (a.astype(np.float16) * np.float16(3)).astype(np.float32),
    ),
    "half_math": (
        (H,),
        lambda a: a * a + a.exp(),
        lambda a: a * a + np.exp(a.astype(np.float32)).astype(np.float16),
        2e-3,
    ),
    "cast_bf16": ((F,), lambda a: a.bfloat16().float() * 2, lambda a: bf16_round(a) * 2),
    "cast_bool": ((F,), lambda a: a.bool().float() + (a > 1).int(), lambda a: (a != 0) + (a > 1).astype(np.int32)),
    "cast_int64": ((F * 1000,), lambda a: a.long() * 3, lambda a: a.astype(np.int64) * 3),
    "cast_uint8": ((I,), lambda a: a.cast(dtypes.uint8).float(), lambda a: a.astype(np.uint8).astype(np.float32)),
    "cast_int_float": (
        (I, U8[:3, :1].copy()),
        lambda a, b: a.float() / 3 + b.float(),
        lambda a, b: a.astype(np.float32) / 3 + b.astype(np.float32),
    ),
    # movement
    "pad": ((F,), lambda a: a.pad(((1, 2), (0, 3))) + 1, lambda a: np.pad(a, ((1, 2), (0, 3))) + 1),
    "flip": ((X3,), lambda a: a.flip(1) * 2, lambda a: a[:, ::-1] * 2),
    "shrink": ((X3,), lambda a: a.shrink(((0, 2), (1, 3), (1, 4))) + 0, lambda a: a[:, 1:3, 1:4] + 0),
    "permute_expand": (
        (X3, G[:4].copy()),
        lambda a, b: a.permute(2, 0, 1) * b.reshape(4, 1, 1),
        lambda a, b: a.transpose(2, 0, 1) * b.reshape(4, 1, 1),
    ),
    "pad_flip_shrink": (
        (F,),
        lambda a: a.flip(0).pad(((2, 0), (1, 1))).shrink(((1, 5), (0, 6))).exp(),
        lambda a: np.exp(np.pad(a[::-1], ((2, 0), (1, 1)))[1:5, 0:6]),
        1e-5,
    ),
    # reductions
    "sum_axes": (
        (X3,),
        lambda a: a.sum(axis=1) + a.sum(axis=(0, 1)).reshape(1, 4) + a.sum(axis=(0, 2)).sum(),
        lambda a: a.sum(axis=1) + a.sum(axis=(0, 1)).reshape(1, 4) + a.sum(axis=(0, 2)).sum(),
    ),
    "sum_all": ((X3,), lambda a: a.sum(), lambda a: a.sum()),
    "max_min": (
        (X3,),
        lambda a: a.max(axis=2) - a.min(axis=0).sum(axis=1).reshape(1, 3),
        lambda a: a.max(axis=2) - a.min(axis=0).sum(axis=1).reshape(1, 3),
    ),
    "mean": ((X3,), lambda a: a.mean(axis=(0, 1)), lambda a: a.mean(axis=(0, 1))),
    "sum_0d": ((np.array(3.5, np.float32),), lambda a: a.sum() * 2, lambda a: a.sum() * 2),
    "sum_zero_size": ((np.zeros((3, 0), np.float32),), lambda a: a.sum(axis=1) + 1, lambda a: a.sum(axis=1) + 1),
    "int_sum": ((I,), lambda a: a.sum(axis=0), lambda a: a.sum(axis=0, dtype=np.int64)),
    "softmax": ((X3,), lambda a: softmax(a, 2), lambda a: np_softmax(a, 2), 1e-5),
    "matmul": ((MA, MB), lambda a, b: (a.reshape(4, 1, 6) * b.T.reshape(1, 5, 6)).sum(2), lambda a, b: a @ b, 1e-5),
}


def run_case(name: str, device: str) -> np.ndarray:
    inputs, fn = CASES[name][0], CASES[name][1]
    return fn(*[Tensor(x, device=device) for x in inputs]).numpy()


@functools.cache
def reference(name: str) -> np.ndarray:
    return run_case(name, REFERENCE)


# devices whose compiler fuses a*b+c into one rounding where the kernel didn't ask for it (cc -ffp-contract=fast,
# NVRTC's default --fmad=true): after a cancellation their result is off by an absolute ~1 ulp of the terms, not of
# the result
FP_CONTRACTING = {"CPU:C", "CUDA"}


def same(got: np.ndarray, ref: np.ndarray, what: str, atol: float = 0.0):
    assert (got.shape, got.dtype) == (ref.shape, ref.dtype), f"{what}: {got.shape} {got.dtype}, {ref.shape} {ref.dtype}"
    if np.issubdtype(got.dtype, np.floating):
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=atol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, ref, err_msg=what)


@pytest.mark.parametrize("name", fast_first(list(CASES)))
def test_op(device, name):
    inputs, _, np_fn = CASES[name][:3]
    rtol = CASES[name][3] if len(CASES[name]) > 3 else 1e-6
    got = run_case(name, device)
    want = np.asarray(np_fn(*inputs))
    assert got.shape == want.shape, f"shape {got.shape} vs numpy {want.shape}"
    if np.issubdtype(want.dtype, np.floating):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)
    if device != REFERENCE and unavailable(REFERENCE) is None:
        same(got, reference(name), f"{device} vs {REFERENCE}", atol=1e-6 if device in FP_CONTRACTING else 0.0)
