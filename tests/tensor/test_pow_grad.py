"""pow's values and gradients against torch 2.13 (CPU) on the grid of special values: tensor ** tensor,
tensor ** const and const ** tensor, float32 and float64. Values, nan positions, infs and signs of zero must match;
a mismatch names the base and the exponent."""

import math

import numpy as np
import pytest
import torch

from tests.slow import fast_first
from zeptograd import Tensor, dtypes

GRID = [-math.inf, -2.0, -1.5, -1.0, -0.3, -0.0, 0.0, 0.3, 1.0, 1.1, 2.0, math.inf, math.nan]
DTYPES = {"float32": (torch.float32, dtypes.float32, 2e-6), "float64": (torch.float64, dtypes.float64, 1e-12)}


def _check(what: str, z: np.ndarray, t: np.ndarray, bases, exps, rtol: float):
    z, t = np.asarray(z, np.float64), np.asarray(t, np.float64)
    assert z.shape == t.shape
    with np.errstate(invalid="ignore"):
        close = (z == t) | (np.abs(z - t) <= rtol * np.abs(t))
    ok = np.where(np.isnan(t), np.isnan(z), close & ((t != 0) | (np.signbit(z) == np.signbit(t))))
    bad = [
        f"base={b!r} exp={e!r}: zeptograd {zv!r}, torch {tv!r}"
        for b, e, zv, tv, o in zip(bases, exps, z, t, ok)
        if not o
    ]
    assert not bad, f"{what} differs from torch at:\n" + "\n".join(bad)


@pytest.mark.parametrize("dt", fast_first(DTYPES))
@pytest.mark.parametrize("e", GRID, ids=repr)
def test_tensor_pow_tensor(dt, e):
    tdt, zdt, rtol = DTYPES[dt]
    exps = [e] * len(GRID)
    tb, te = torch.tensor(GRID, dtype=tdt, requires_grad=True), torch.tensor(exps, dtype=tdt, requires_grad=True)
    zb, ze = Tensor(GRID, dtype=zdt, requires_grad=True), Tensor(exps, dtype=zdt, requires_grad=True)
    tout, zout = tb**te, zb**ze
    tout.sum().backward()
    zout.sum().backward()
    assert zout.dtype == zdt
    _check("b**e", zout.numpy(), tout.detach().numpy(), GRID, exps, rtol)
    _check("d(b**e)/db", zb.grad.numpy(), tb.grad.numpy(), GRID, exps, rtol)
    _check("d(b**e)/de", ze.grad.numpy(), te.grad.numpy(), GRID, exps, rtol)


@pytest.mark.slow
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("e", GRID, ids=repr)
def test_tensor_pow_const(dt, e):
    tdt, zdt, rtol = DTYPES[dt]
    tb, zb = torch.tensor(GRID, dtype=tdt, requires_grad=True), Tensor(GRID, dtype=zdt, requires_grad=True)
    tout, zout = tb**e, zb**e
    tout.sum().backward()
    zout.sum().backward()
    assert zout.dtype == zdt
    _check("b**c", zout.numpy(), tout.detach().numpy(), GRID, [e] * len(GRID), rtol)
    _check("d(b**c)/db", zb.grad.numpy(), tb.grad.numpy(), GRID, [e] * len(GRID), rtol)


@pytest.mark.slow
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("b", GRID, ids=repr)
def test_const_pow_tensor(dt, b):
    tdt, zdt, rtol = DTYPES[dt]
    te, ze = torch.tensor(GRID, dtype=tdt, requires_grad=True), Tensor(GRID, dtype=zdt, requires_grad=True)
    tout, zout = b**te, b**ze
    tout.sum().backward()
    zout.sum().backward()
    assert zout.dtype == zdt
    _check("c**e", zout.numpy(), tout.detach().numpy(), [b] * len(GRID), GRID, rtol)
    _check("d(c**e)/de", ze.grad.numpy(), te.grad.numpy(), [b] * len(GRID), GRID, rtol)


@pytest.mark.parametrize("e", fast_first([0, 0.0, 1, 0.5, -0.5, 2, 3, -1, -2, 1.5, 7]), ids=repr)
def test_const_powers_torch_special_cases(e):
    """torch computes x**0.5 as sqrt, x**-1 as 1/x, x**2 as x*x, ...: their values at -0.0 and -inf, and the
    gradient at 0 (x**0 too: 0, and x stays in the graph)."""
    xs = [-math.inf, -3.0, -0.0, 0.0, 0.5, 2.0, math.inf, math.nan]
    tx, zx = torch.tensor(xs, requires_grad=True), Tensor(xs, requires_grad=True)
    (tx**e).sum().backward()
    (zg,) = (zx**e).sum().gradient(zx)
    _check("x**c", (zx**e).numpy(), (tx**e).detach().numpy(), xs, [e] * len(xs), 2e-6)
    _check("d(x**c)/dx", zg.numpy(), tx.grad.numpy(), xs, [e] * len(xs), 2e-6)


@pytest.mark.slow
def test_pow_grad_broadcast_upstream():
    """A base (3, 1) and an exponent (1, 4), a random upstream gradient: the gradients sum over the broadcast."""
    rng = np.random.default_rng(0)
    b, e, g = rng.uniform(0.1, 2, (3, 1)), rng.uniform(-2, 2, (1, 4)), rng.standard_normal((3, 4))
    tb, te = torch.tensor(b, requires_grad=True), torch.tensor(e, requires_grad=True)
    zb, ze = Tensor(b, requires_grad=True), Tensor(e, requires_grad=True)
    (tb**te).backward(torch.tensor(g))
    (zb**ze).backward(Tensor(g))
    np.testing.assert_allclose(zb.grad.numpy(), tb.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(ze.grad.numpy(), te.grad.numpy(), rtol=1e-12)


def test_int_pow_unchanged():
    x = np.array([-3, -1, 0, 2, 5], np.int32)
    np.testing.assert_equal((Tensor(x) ** 3).numpy(), (torch.tensor(x) ** 3).numpy())
    np.testing.assert_equal((2 ** Tensor(np.abs(x))).numpy(), (2 ** torch.tensor(np.abs(x))).numpy())
    np.testing.assert_equal(
        (Tensor(x) ** Tensor(np.abs(x))).numpy(), (torch.tensor(x) ** torch.tensor(np.abs(x))).numpy()
    )
    np.testing.assert_allclose((Tensor(x) ** 0.5).numpy(), (torch.tensor(x) ** 0.5).numpy(), rtol=1e-6)
    with pytest.raises(ValueError):
        Tensor(x) ** -1
