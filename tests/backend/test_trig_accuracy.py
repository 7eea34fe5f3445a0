"""sin, cos and tan within 2 ulp of numpy's float64 result rounded to the dtype, for finite inputs of every size.

The ulp is that of the rounded reference (for tan near its poles, sin/cos near their zeros: the ulp of the small
result, libm's criterion). Inputs: a log sweep to float32's largest, the floats nearest to multiples of pi/2 (where
the reduced argument is smallest and a short pi constant shows), near-zeros of sin/cos found among large floats,
and the special values. The PYTHON device interprets every op in Python: its sweep is a few thousand points.
"""

from __future__ import annotations

import numpy as np
import pytest

from zeptograd import Tensor

FNS = ["sin", "cos", "tan"]
F32_MAX = float(np.finfo(np.float32).max)


def ulp_error(out: np.ndarray, ref64: np.ndarray, dtype) -> np.ndarray:
    """|out - ref| in ulps of ref rounded to dtype; 0 where both are nan or out is ref's overflow to inf"""
    with np.errstate(all="ignore"):
        rounded = ref64.astype(dtype)
        err = np.abs(out.astype(np.float64) - ref64) / np.spacing(np.abs(rounded)).astype(np.float64)
    same = (np.isnan(out) & np.isnan(ref64)) | (np.isinf(rounded) & (out == rounded))
    return np.where(same, 0.0, err)


def near_multiples_of_half_pi(kmax: int) -> np.ndarray:
    """the float32s nearest to k*pi/2 for k < kmax, and their neighbours one and two ulps away"""
    x = (np.arange(1, kmax, dtype=np.float64) * (np.pi / 2)).astype(np.float32)
    up1 = np.nextafter(x, np.float32(np.inf))
    dn1 = np.nextafter(x, np.float32(0))
    return np.concatenate([x, up1, dn1, np.nextafter(up1, np.float32(np.inf)), np.nextafter(dn1, np.float32(0))])


def large_near_zeros(n: int, rng) -> np.ndarray:
    """among 2**20 random float32s up to 3.4e38, the n nearest to a multiple of pi/2 (smallest |sin*cos|)"""
    x = (10 ** rng.uniform(3, 38.53, 1 << 20)).astype(np.float32)
    x = x[np.isfinite(x)]
    closeness = np.abs(np.sin(2 * x.astype(np.float64)))  # sin(2x) = 2 sin x cos x: 0 at every multiple of pi/2
    return x[np.argsort(closeness)[:n]]


SPECIAL = [0.0, -0.0, 1e-45, -1e-45, 1.1754944e-38, 1e-20, 0.7853981, 0.7853982, 1.5707964, 3.1415927, 4095.9998]
SPECIAL += [4096.0, 4096.0005, 6433.0, 8388608.0, 16777216.0, 1e10, F32_MAX, -F32_MAX, np.inf, -np.inf, np.nan]


def float32_inputs(device: str) -> np.ndarray:
    rng = np.random.default_rng(2024)
    small = device == "PYTHON"
    n = 1500 if small else 40000
    sweep = (10 ** rng.uniform(-8, 38.53, n) * rng.choice([-1, 1], n)).astype(np.float32)
    sweep = sweep[np.isfinite(sweep)]
    parts = [sweep, near_multiples_of_half_pi(200 if small else 4200), large_near_zeros(200 if small else 4000, rng)]
    x = np.concatenate([*parts, -parts[1], np.float32(SPECIAL)]).astype(np.float32)
    return np.concatenate([x, np.zeros((-len(x)) % 16, np.float32)])  # a multiple of 16: vector kernels


@pytest.mark.slow
@pytest.mark.parametrize("fn", FNS)
def test_float32_within_2_ulp(device, fn):
    x = float32_inputs(device)
    out = getattr(Tensor(x, device=device), fn)().numpy()
    with np.errstate(all="ignore"):
        ref = getattr(np, fn)(x.astype(np.float64))
    err = ulp_error(out, ref, np.float32)
    worst = int(np.argmax(err))
    assert err[worst] <= 2.0, f"{fn}({x[worst]!r}) = {out[worst]!r}, numpy {ref[worst]!r}: {err[worst]:.2f} ulp"
    # odd functions keep the sign of zero; inf and nan give nan
    zeros = out[np.isin(np.arange(len(x)), np.flatnonzero((x == 0) & np.signbit(x)))]
    assert fn == "cos" or (zeros.size and np.all(np.signbit(zeros)))
    assert np.all(np.isnan(out[~np.isfinite(x)]))


def test_large_arguments_issue_values(device):
    """the values the wrong reductions gave: sin at 1e6..4e6, cos even at +-1e6"""
    x = np.float32([1e6, 2e6, 3e6, 4e6])
    np.testing.assert_array_max_ulp(
        Tensor(x, device=device).sin().numpy(), np.sin(x.astype(np.float64)).astype(np.float32), 2
    )
    c = Tensor(np.float32([1e6, -1e6]), device=device).cos().numpy()
    assert c[0] == c[1]
    np.testing.assert_array_max_ulp(c, np.cos(np.float32([1e6, 1e6]).astype(np.float64)).astype(np.float32), 2)


@pytest.mark.parametrize("fn", FNS)
def test_float16_every_finite_value(device, fn):
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    x = x[np.isfinite(x)]
    if device == "PYTHON":
        x = x[::20]
    out = getattr(Tensor(x, device=device), fn)().numpy()
    assert out.dtype == np.float16
    err = ulp_error(out, getattr(np, fn)(x.astype(np.float64)), np.float16)
    worst = int(np.argmax(err))
    assert err[worst] <= 1.0, f"{fn}({x[worst]!r}) = {out[worst]!r}: {err[worst]:.2f} ulp"


@pytest.mark.parametrize("fn", FNS)
def test_float64(device, fn):
    rng = np.random.default_rng(64)
    n = 300 if device == "PYTHON" else 4000
    x = np.concatenate([10 ** rng.uniform(-8, 300, n) * rng.choice([-1, 1], n), rng.uniform(-10, 10, n)])
    out = getattr(Tensor(x, device=device), fn)().numpy()
    assert out.dtype == np.float64
    err = ulp_error(out, getattr(np, fn)(x), np.float64)
    # numpy's float64 libm result is within 1 ulp itself; OpenCL allows its own tan 5 ulp (PoCL: 2.6 measured)
    limit = 4.0 if device == "CL" and fn == "tan" else 2.0
    worst = int(np.argmax(err))
    assert err[worst] <= limit, f"{fn}({x[worst]!r}) = {out[worst]!r}: {err[worst]:.2f} ulp"


def test_gradients_match_torch(device):
    """d sin = cos, d cos = -sin, d tan = 1 + tan**2, also at large arguments"""
    import torch

    x = np.float32([0.3, -2.5, 1e6, -7e30, 1.5])
    t = Tensor(x, device=device, requires_grad=True)
    (t.sin() + t.cos() * 2 + t.tan() * 3).sum().backward()
    tt = torch.tensor(x, requires_grad=True)
    (tt.sin() + tt.cos() * 2 + tt.tan() * 3).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=2e-6)
