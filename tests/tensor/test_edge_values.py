"""Values and gradients at the edges (bounds, ties, inf, nan, zeros, integer inputs) against torch 2.13 (CPU):
clamp/maximum/minimum gradients, isclose, normalize, interpolate of integer tensors, argmax/sort/topk with nan."""

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.backend.conftest import unavailable
from tests.slow import fast_first
from zeptograd import Tensor, dtypes

NAN, INF = math.nan, math.inf


def _grads(zfn, tfn, *inputs, upstream=None):
    """(zeptograd output, its input gradients), (torch output, its input gradients) of fn(*inputs)."""
    zs = [Tensor(np.asarray(x, np.float32), requires_grad=True) for x in inputs]
    ts = [torch.tensor(np.asarray(x, np.float32), requires_grad=True) for x in inputs]
    zo, to = zfn(*zs), tfn(*ts)
    g = np.ones(to.shape, np.float32) if upstream is None else np.asarray(upstream, np.float32)
    zo.backward(Tensor(g))
    # torch's reference: sum(to * g) sends exactly g back to `to` (1 * g); to.backward(g) would give the same, but
    # torch's first backward with a gradient argument imports sympy (~1 s, once per process)
    (to * torch.tensor(g)).sum().backward()
    return (zo.numpy(), [z.grad.numpy() for z in zs]), (to.detach().numpy(), [t.grad.numpy() for t in ts])


def _assert_same(z, t, rtol=1e-6):
    (zo, zg), (to, tg) = z, t
    np.testing.assert_allclose(zo, to, rtol=rtol, equal_nan=True)
    for a, b in zip(zg, tg):
        np.testing.assert_allclose(a, b, rtol=rtol, equal_nan=True)


# ***** clamp / maximum / minimum gradients *****
@pytest.mark.slow
def test_clip_gradient_at_the_bounds():
    xs = [-3.0, -2.5, 0.0, 1.5, 2.0]
    z, t = _grads(lambda x: x.clip(-2.5, 1.5), lambda x: x.clip(-2.5, 1.5), xs)
    _assert_same(z, t)
    np.testing.assert_equal(z[1][0], [0, 1, 1, 1, 0])  # the bounds get all of it, not maximum's half


@pytest.mark.slow
@pytest.mark.parametrize("lo,hi", [(-2.5, None), (None, 1.5), (-2.5, 1.5), (1.5, -2.5), (0.0, 0.0)], ids=repr)
def test_clamp_scalar_bounds(lo, hi):
    xs = [-INF, -3.0, -2.5, 0.0, 1.5, 2.0, INF, NAN]
    _assert_same(*_grads(lambda x: x.clamp(lo, hi), lambda x: x.clamp(lo, hi), xs, upstream=np.arange(1.0, 9.0)))


@pytest.mark.slow
@pytest.mark.parametrize("which", ["both", "min", "max"])
def test_clamp_tensor_bounds(which):
    """Tensor bounds get the gradient where they clamp (hi everywhere when lo > hi), x inside them; broadcast."""
    xs, lo, hi = [[0.0, 2.0, 3.0, 0.0, NAN, -1.0]], [[0.0], [5.0]], [[1.0], [2.0]]
    if which == "both":
        fns = (lambda x, a, b: x.clamp(a, b), lambda x, a, b: x.clamp(a, b))
        z, t = _grads(*fns, xs, lo, hi, upstream=np.arange(12.0).reshape(2, 6))
    else:
        bound = lo if which == "min" else hi

        def zfn(x, b):
            return x.clamp(b, None) if which == "min" else x.clamp(None, b)

        def tfn(x, b):
            return x.clamp(b, None) if which == "min" else x.clamp(None, b)

        z, t = _grads(zfn, tfn, xs, bound, upstream=np.arange(12.0).reshape(2, 6))
    _assert_same(z, t)


def test_clamp_nan_bounds_and_explicit_maximum_minimum():
    """A nan bound gives nan (torch); maximum(...).minimum(...) written out keeps maximum's tie rule (0.5 at the
    bounds, as torch), clamp's own rule does not leak into it."""
    xs = [1.0, NAN, -3.0, 5.0]
    for lo, hi in ((NAN, None), (None, NAN), (0.0, NAN)):
        np.testing.assert_equal(Tensor(xs).clamp(lo, hi).numpy(), torch.tensor(xs).clamp(lo, hi).numpy())
    z, t = _grads(
        lambda x: x.maximum(-2.5).minimum(1.5),
        lambda x: x.maximum(torch.tensor(-2.5)).minimum(torch.tensor(1.5)),
        [-2.5, 0.0, 1.5],
    )
    _assert_same(z, t)
    np.testing.assert_equal(z[1][0], [0.5, 1, 0.5])


@pytest.mark.slow  # torch's backward of clamp with tensor bounds imports sympy: 2+ s in the process that runs it first
def test_clamp_gradient_with_nan_tensor_bounds():
    xs, lo, hi = [1.0, NAN, -3.0, 5.0], [0.0, NAN, 0.0, NAN], [NAN, 0.0, 2.0, 2.0]
    _assert_same(*_grads(lambda x, a, b: x.clamp(a, b), lambda x, a, b: x.clamp(a, b), xs, lo, hi))


@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_maximum_minimum_gradient_ties_and_nan(op):
    """A tie splits the gradient 0.5/0.5; a nan on either side gives both sides all of it (torch)."""
    a, b = [1.0, 2.0, NAN, 3.0, NAN, -0.0, INF], [1.0, 1.0, 1.0, NAN, NAN, 0.0, INF]
    z, t = _grads(lambda x, y: getattr(x, op)(y), lambda x, y: getattr(x, op)(y), a, b, upstream=np.arange(1.0, 8.0))
    _assert_same(z, t)


# ***** isclose *****
_CLOSE_VALUES = [INF, -INF, NAN, 0.0, -0.0, 1.0, 1.0 + 1e-6, 1e30, -1e30, 1e-9]


@pytest.mark.parametrize("equal_nan", [False, True])
@pytest.mark.parametrize(
    "rtol,atol", fast_first([(1e-5, 1e-8), (0.0, 0.0), (0.5, 0.0), (0.0, 2.0)], unpack=True), ids=repr
)
def test_isclose_matches_torch(equal_nan, rtol, atol):
    pairs = list(itertools.product(_CLOSE_VALUES, repeat=2))
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    z = Tensor(a).isclose(Tensor(b), rtol=rtol, atol=atol, equal_nan=equal_nan).numpy()
    t = torch.tensor(a).isclose(torch.tensor(b), rtol=rtol, atol=atol, equal_nan=equal_nan).numpy()
    bad = [(x, y, zz, tt) for x, y, zz, tt in zip(a, b, z, t) if zz != tt]
    assert not bad, f"isclose(a, b) differs from torch at (a, b, zeptograd, torch): {bad}"


@pytest.mark.slow
def test_isclose_edges_named_in_the_issue():
    assert not Tensor([INF]).isclose(Tensor([-INF])).item()
    assert not Tensor([0.0]).isclose(Tensor([INF])).item()
    assert Tensor([INF]).isclose(Tensor([INF])).item()
    assert not Tensor([NAN]).isclose(Tensor([NAN])).item()
    assert Tensor([NAN]).isclose(Tensor([NAN]), equal_nan=True).item()


def test_isclose_ints_do_not_wrap_and_bad_tolerances():
    a, b = np.array([-128, 127, 5, 0], np.int8), np.array([127, -128, 5, 1], np.int8)
    z = Tensor(a).isclose(Tensor(b), atol=1).numpy()
    np.testing.assert_equal(z, torch.tensor(a).isclose(torch.tensor(b), atol=1).numpy())
    with pytest.raises(ValueError, match="rtol"):
        Tensor([1.0]).isclose(Tensor([1.0]), rtol=-1)


# ***** normalize *****
_NORM_X = np.array([[1.0, 0.0, 2.0], [0.0, 0.0, 0.0], [-3.0, 4.0, 0.5]], np.float32)


@pytest.mark.parametrize("p", fast_first([0, 1, 2, 3, 0.5, INF, -INF, -1, -2.5]), ids=repr)
@pytest.mark.parametrize("dim", [0, 1])
def test_normalize_orders(p, dim):
    """Values and gradients of F.normalize for each order, with a zero row/column and zero elements."""
    z, t = _grads(
        lambda x: x.normalize(p=p, dim=dim),
        lambda x: F.normalize(x, p=p, dim=dim),
        _NORM_X,
        upstream=np.arange(9.0).reshape(3, 3),
    )
    _assert_same(z, t, rtol=1e-5)


def test_normalize_p0_named_in_the_issue():
    np.testing.assert_equal(Tensor([[1.0, 0.0, 2.0]]).normalize(p=0).numpy(), [[0.5, 0.0, 1.0]])


# ***** interpolate of uint8 tensors *****
# (C, H, W) -> (H', W'). torch takes a different (non-vectorized) path for more than 4 channels; with W = 1 there
# it repeats the first output row of each column (a torch anomaly), so that case is not compared.
_RESIZES = [(1, 1, 2, 1, 4), (3, 2, 3, 3, 7), (4, 5, 4, 7, 11), (2, 7, 9, 4, 5), (5, 3, 3, 8, 8), (8, 10, 13, 6, 29)]
_RESIZES += [(1, 4, 4, 16, 3), (3, 1, 5, 3, 1), (6, 9, 9, 9, 4), (4, 6, 1, 2, 1), (1, 3, 3, 3, 3)]


def test_interpolate_uint8_named_in_the_issue():
    out = Tensor(np.array([[[[20, 10]]]], np.uint8)).interpolate(size=(1, 4), mode="linear")
    assert out.dtype == dtypes.uint8
    np.testing.assert_equal(out.numpy(), [[[[20, 18, 13, 10]]]])


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("c,h,w,oh,ow", fast_first(_RESIZES, unpack=True), ids=repr)
def test_interpolate_uint8_bilinear(c, h, w, oh, ow, align_corners):
    """torch's uint8 bilinear: fixed-point weights, the last dim first, rounded to uint8 in between."""
    x = np.random.default_rng(h * 100 + w).integers(0, 256, (2, c, h, w), dtype=np.uint8)
    z = Tensor(x).interpolate((oh, ow), mode="linear", align_corners=align_corners)
    t = F.interpolate(torch.tensor(x), size=(oh, ow), mode="bilinear", align_corners=align_corners)
    assert z.dtype == dtypes.uint8
    np.testing.assert_equal(z.numpy(), t.numpy())


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize("c,h,w,oh,ow", fast_first(_RESIZES, unpack=True), ids=repr)
def test_interpolate_uint8_nearest(c, h, w, oh, ow, mode):
    x = np.random.default_rng(h * 100 + w).integers(0, 256, (2, c, h, w), dtype=np.uint8)
    z = Tensor(x).interpolate((oh, ow), mode=mode)
    assert z.dtype == dtypes.uint8
    np.testing.assert_equal(z.numpy(), F.interpolate(torch.tensor(x), size=(oh, ow), mode=mode).numpy())


def test_interpolate_linear_other_ints_raise_as_torch():
    with pytest.raises(TypeError, match="uint8"):
        Tensor(np.zeros((1, 1, 2, 2), np.int32)).interpolate((3, 3), mode="linear")


# ***** nan in argmax / argmin / max / min / sort / topk (nan is above +inf, as torch) *****
_NAN_ROWS = np.array(
    [[1.0, NAN, 3.0, 2.0, INF], [NAN, -INF, INF, NAN, 7.0], [5.0, 4.0, 3.0, 2.0, 1.0], [0.0, -1.0, NAN, 1.0, NAN]],
    np.float32,
)
NAN_DEVICES = ["CPU", "CPU:C", "PYTHON"]


@pytest.fixture(params=NAN_DEVICES)
def device(request) -> str:
    if (why := unavailable(request.param)) is not None:
        pytest.skip(why)
    return request.param


@pytest.mark.slow
@pytest.mark.parametrize("width", [4, 5])  # a power of two, and one the sort pads
def test_argmax_argmin_max_min_with_nan(device, width):
    """The index of the first nan (not one past the row), for argmax and argmin, per row, per column and over all;
    max/min of a row with a nan is nan."""
    x = _NAN_ROWS[:, :width]
    z, t = Tensor(x, device=device), torch.tensor(x)
    for axis in (0, 1):
        np.testing.assert_equal(z.argmax(axis).numpy(), t.argmax(axis).numpy())
        np.testing.assert_equal(z.argmin(axis).numpy(), t.argmin(axis).numpy())
        np.testing.assert_equal(z.max(axis).numpy(), t.amax(axis).numpy())
        np.testing.assert_equal(z.min(axis).numpy(), t.amin(axis).numpy())
    assert z.argmax().item() == t.argmax().item() and z.argmin().item() == t.argmin().item()
    assert math.isnan(z.max().item()) and math.isnan(z.min().item())


@pytest.mark.slow
@pytest.mark.parametrize("width", [4, 5])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_with_nan(device, width, descending):
    """nan sorts last ascending, first descending; no value is lost or turned into nan; the indices are torch's
    stable ones."""
    x = _NAN_ROWS[:, :width]
    zv, zi = Tensor(x, device=device).sort(1, descending=descending)
    tv, ti = torch.tensor(x).sort(dim=1, descending=descending, stable=True)
    np.testing.assert_equal(zv.numpy(), tv.numpy())
    np.testing.assert_equal(zi.numpy(), ti.numpy())


@pytest.mark.slow
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_topk_with_nan(device, largest, k):
    """torch's values (nan the largest); the indices point at them (torch orders tied indices its own way)."""
    zv, zi = Tensor(_NAN_ROWS, device=device).topk(k, 1, largest=largest)
    tv, _ = torch.tensor(_NAN_ROWS).topk(k, 1, largest=largest)
    np.testing.assert_equal(zv.numpy(), tv.numpy())
    np.testing.assert_equal(np.take_along_axis(_NAN_ROWS, zi.numpy(), 1), tv.numpy())
    assert all(len(set(row)) == k for row in zi.numpy().tolist())
