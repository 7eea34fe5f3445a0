"""Reductions, scans, softmax and sorting against torch 2.13 (CPU, `check`: forward and backward) and numpy
(`check_numpy`: the reduction computed in float64, wider int data, large and power-of-two sizes). A case both oracles
apply to is one test that runs both; the numpy-only cases are in the second half."""

import math

import numpy as np
import pytest
import torch

from tests.slow import fast_first
from tests.tensor.api_helpers import NP_OF, V, check, check_numpy, data, time_limit
from zeptograd import GlobalCounters, Tensor, dtypes
from zeptograd.helpers import prod
from zeptograd.uop.ops import AxisType, Ops

AXES = [None, 0, -1, (0, 1), 1]
INPUTS = {
    "2d": lambda s: V(data((3, 4), seed=s, distinct=True)),
    "3d": lambda s: V(data((2, 3, 4), seed=s, distinct=True)),
    "perm": lambda s: V(data((4, 3), seed=s, distinct=True), lambda x: x.permute(1, 0)),
    "slice": lambda s: V(data((5, 8), seed=s, distinct=True), lambda x: x[1:4, ::2]),
}


def _tdim(axis):
    return () if axis is None else axis


REDUCE = {  # zeptograd(x, axis, keepdim), torch(x, axis, keepdim)
    "sum": (lambda x, a, k: x.sum(a, keepdim=k), lambda x, a, k: x.sum(_tdim(a), keepdim=k)),
    "mean": (lambda x, a, k: x.mean(a, keepdim=k), lambda x, a, k: x.mean(_tdim(a), keepdim=k)),
    "prod": (
        lambda x, a, k: x.prod(a, keepdim=k),
        lambda x, a, k: (
            x.prod()
            if a is None
            else x.prod(a, keepdim=k)
            if isinstance(a, int)
            else x.prod(a[1], keepdim=k).prod(a[0], keepdim=k)
        ),
    ),
    "max": (lambda x, a, k: x.max(a, keepdim=k), lambda x, a, k: x.amax(_tdim(a), keepdim=k)),
    "min": (lambda x, a, k: x.min(a, keepdim=k), lambda x, a, k: x.amin(_tdim(a), keepdim=k)),
    "var": (lambda x, a, k: x.var(a, keepdim=k), lambda x, a, k: x.var(a, keepdim=k)),
    "std": (lambda x, a, k: x.std(a, keepdim=k), lambda x, a, k: x.std(a, keepdim=k)),
    "var0": (lambda x, a, k: x.var(a, keepdim=k, correction=0), lambda x, a, k: x.var(a, keepdim=k, correction=0)),
    "std_mean": (lambda x, a, k: x.std_mean(a, keepdim=k), lambda x, a, k: torch.std_mean(x, a, keepdim=k)),
    "var_mean": (
        lambda x, a, k: x.var_mean(a, keepdim=k, correction=2),
        lambda x, a, k: torch.var_mean(x, a, keepdim=k, correction=2),
    ),
    "logsumexp": (
        lambda x, a, k: x.logsumexp(a, keepdim=k),
        lambda x, a, k: x.logsumexp(tuple(range(x.ndim)) if a is None else a, keepdim=k),
    ),
}


@pytest.mark.parametrize("axis", fast_first(AXES))
@pytest.mark.parametrize("op", list(REDUCE))
def test_reduce(op, axis):
    zf, tf = REDUCE[op]
    check(lambda x: zf(x, axis, False), lambda x: tf(x, axis, False), INPUTS["2d"](1))
    if op in RED and axis == 1:  # the axis given positionally, against numpy
        x = data((3, 5), lo=-3, hi=3, seed=51)
        check_numpy(getattr(Tensor(x), op)(1), RED[op][1](x.astype(np.float64), axis=1).astype(np.float32))


@pytest.mark.slow
@pytest.mark.parametrize("inp", ["3d", "perm", "slice"])
@pytest.mark.parametrize("op", ["sum", "max", "mean", "std", "prod", "logsumexp"])
def test_reduce_keepdim_views(op, inp):
    zf, tf = REDUCE[op]
    check(lambda x: zf(x, 1, True), lambda x: tf(x, 1, True), INPUTS[inp](2))
    check(lambda x: zf(x, -1, False), lambda x: tf(x, -1, False), INPUTS[inp](3))
    if inp == "3d" and op in RED:
        _reduce_numpy(op, 1, True)
        _reduce_numpy(op, -1, False)


@pytest.mark.parametrize("op", fast_first(["sum", "max", "mean", "prod", "min"]))
def test_reduce_0d(op):
    zf, tf = REDUCE[op]
    check(lambda x: zf(x, None, False), lambda x: tf(x, None, False), V(data((), seed=4)))
    check(lambda x: zf(x, 0, True), lambda x: tf(x, 0, True), V(data((), seed=4)))
    if op in RED:
        check_numpy(getattr(Tensor(2.5), op)(), np.array(2.5, np.float32))
        check_numpy(getattr(Tensor(2.5), op)(keepdim=True), np.array(2.5, np.float32))


ZERO_SIZE = {
    "sum0": (lambda t: t.sum(0), lambda t: t.sum(0)),
    "sum": (lambda t: t.sum(), lambda t: t.sum()),
    "prod0": (lambda t: t.prod(0), lambda t: t.prod(0)),
    "max1": (lambda t: t.max(1), lambda t: t.amax(1)),
    "sum1_keepdim": (lambda t: t.sum(1, keepdim=True), lambda t: t.sum(1, keepdim=True)),
    "any0": (lambda t: t.any(0), lambda t: t.any(0)),
    "all0": (lambda t: t.all(0), lambda t: t.all(0)),
}


@pytest.mark.parametrize("op", fast_first(list(ZERO_SIZE)))
def test_reduce_zero_size(op):
    check(*ZERO_SIZE[op], V(data((0, 3), seed=5)))


REDUCE_OF_DTYPE = {
    "sum": (lambda t: t.sum(), lambda t: t.sum()),
    "sum1": (lambda t: t.sum(1), lambda t: t.sum(1)),
    "prod0": (lambda t: t.prod(0), lambda t: t.prod(0)),
    "max1": (lambda t: t.max(1), lambda t: t.amax(1)),
    "min": (lambda t: t.min(), lambda t: t.amin()),
    "any1": (lambda t: t.any(1), lambda t: t.any(1)),
    "all0": (lambda t: t.all(0), lambda t: t.all(0)),
    "argmax1": (lambda t: t.argmax(1), lambda t: t.argmax(1)),
}


@pytest.mark.parametrize("op", fast_first(list(REDUCE_OF_DTYPE)))
@pytest.mark.parametrize("dtype", ["int32", "int8", "bool", "int64", "float16", "uint8"])
def test_reduce_dtypes(dtype, op):
    """sum/prod of ints and bools are int64, of halves half; max/min keep the dtype; any/all are bool"""
    if dtype == "bool" and op == "argmax1":
        pytest.skip("torch: no argmax of bools")
    x = data((3, 5), dtype, -4, 4, seed=6)
    check(*REDUCE_OF_DTYPE[op], V(x), grad=False, **(dict(atol=1e-2) if dtype == "float16" else {}))


def test_sum_dtype_arg():
    x = data((3, 4), "int32", -9, 9, seed=7)

    check(lambda t: t.sum(1, dtype=dtypes.int32), lambda t: t.sum(1, dtype=torch.int32), V(x))
    check(lambda t: t.sum(dtype=dtypes.float64), lambda t: t.sum(dtype=torch.float64), V(x))


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("axis", fast_first([None, 0, 1, -1]))
def test_argmax_argmin(axis, keepdim):
    x = data((4, 5), "int32", -3, 3, seed=8)  # ties: the first one wins, as torch
    for zf, tf in [(Tensor.argmax, torch.argmax), (Tensor.argmin, torch.argmin)]:
        if axis is None and keepdim:
            check(lambda t: zf(t, None, True), lambda t: tf(t, None, True), V(x))
        else:
            check(lambda t: zf(t, axis, keepdim), lambda t: tf(t, axis, keepdim), V(x))
    check(lambda t: t.argmax(0), lambda t: t.argmax(0), V(data((3, 4), seed=9), lambda t: t.permute(1, 0)))
    check(lambda t: t.argmax(), lambda t: t.argmax(), V(data((), seed=9)))


def test_any_all():
    x = data((3, 4), "int32", 0, 1, seed=10)
    x[0] = 1
    x[1] = 0
    for a in (None, 0, 1):
        check(lambda t: t.any(a), lambda t: t.any() if a is None else t.any(a), V(x))
        check(lambda t: t.all(a), lambda t: t.all() if a is None else t.all(a), V(x))
        check(lambda t: t.any(a), lambda t: t.any() if a is None else t.any(a), V(data((3, 4), seed=11)))


# ----------------------------------------------------------------------------- scans

SCANS = {
    "cumsum": (lambda x, a: x.cumsum(a), lambda x, a: x.cumsum(a)),
    "cumprod": (lambda x, a: x.cumprod(a), lambda x, a: x.cumprod(a)),
    "cummax": (lambda x, a: x.cummax(a), lambda x, a: tuple(torch.cummax(x, a))),
    "cummin": (lambda x, a: x.cummin(a), lambda x, a: tuple(torch.cummin(x, a))),
    "logcumsumexp": (lambda x, a: x.logcumsumexp(a), lambda x, a: x.logcumsumexp(a)),
}


@pytest.mark.slow
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("op", list(SCANS))
def test_scan(op, axis):
    zf, tf = SCANS[op]
    check(lambda x: zf(x, axis), lambda x: tf(x, axis), INPUTS["2d"](12))


@pytest.mark.slow
@pytest.mark.parametrize("op", list(SCANS))
def test_scan_shapes(op):
    zf, tf = SCANS[op]
    check(lambda x: zf(x, 0), lambda x: tf(x, 0), INPUTS["perm"](13))
    check(lambda x: zf(x, 1), lambda x: tf(x, 1), INPUTS["slice"](14))
    check(lambda x: zf(x, 0), lambda x: tf(x, 0), V(data((), seed=15)))
    check(lambda x: zf(x, 1), lambda x: tf(x, 1), V(data((0, 3), seed=16)))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["int32", "bool", "int8"])
def test_scan_int(dtype):
    x = data((3, 5), dtype, -3, 3, seed=17)
    check(lambda t: t.cumsum(1), lambda t: t.cumsum(1), V(x))
    if dtype != "bool":
        check(lambda t: t.cumprod(0), lambda t: t.cumprod(0), V(x))
        check(lambda t: t.cummax(1), lambda t: tuple(torch.cummax(t, 1)), V(x))  # ties: the last index, as torch


@pytest.mark.parametrize("n", fast_first([65, 100, 1000]))  # ~1 s each (kernels per block shape): 65 is the edge
def test_long_scans_run_in_blocks(n):
    """Over more than 16 elements a scan runs in blocks of 16 (tensor/reduce.py: _blocked_scan), each block the sum
    of its shifted copies: no n x n (or n x sqrt(n)) windows are built, the largest broadcast is the blocks' offsets
    over their elements; the values agree with torch for sums, products and maxima (ints exactly), along either
    axis."""
    x = data((3, n), seed=18)
    check(lambda t: t.cumsum(1), lambda t: t.cumsum(1), V(x))
    check(lambda t: t.cumprod(1), lambda t: t.cumprod(1), V(data((3, n), "float32", 0.9, 1.1, seed=19)))
    check(lambda t: t.cummax(1), lambda t: tuple(torch.cummax(t, 1)), V(x))
    check(lambda t: t.cumsum(0), lambda t: t.cumsum(0), V(data((n, 2), "int32", -3, 3, seed=20)))
    biggest = max(prod(u.tensor_shape) for u in Tensor(x).cumsum(1).uop.toposort() if u.op is Ops.EXPAND)
    assert biggest <= 3 * (n + 15) // 16 * 16


def _reduce_work(items) -> int:
    """The iterations the kernels' reduces run: each REDUCE's own loop counts times the kernel's output loops."""
    work = 0
    for item in items:
        nodes = item.ast.toposort()
        outputs = prod(u.src[0].arg for u in nodes if u.op is Ops.RANGE and u.arg[1] is AxisType.LOOP)
        for u in nodes:
            if u.op is Ops.REDUCE:
                work += outputs * prod(r.src[0].arg for r in u.src[1:] if r.op is Ops.RANGE)
    return work


@pytest.mark.parametrize("shape,axis", [((64, 256), 1), ((64, 256), 0), ((256, 1024), -1), ((1 << 16,), 0)])
def test_cumsum_is_a_blocked_scan_without_windows(shape, axis):
    """cumsum along rows or columns: the blocks' totals are the only reduce (one pass over the input: n loads), each
    block is scanned as the sum of its shifted copies (elementwise: vectors along the output, no horizontal sum per
    element, no chain of dependent adds), the totals' scan has n/16 elements; a kernel per level of 16 and one for
    the combine. Windows of n x 16 (or n x n) per output, the form before, reduced 16+ times the input's work."""
    x = Tensor(data(shape, seed=21))
    items = x.cumsum(axis).schedule()
    n = prod(shape)
    assert _reduce_work(items) <= n + n // 8
    levels = math.ceil(math.log(shape[axis], 16))
    assert len(items) <= 2 * levels + 1


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2])
def test_blocked_scans_against_torch(axis):
    """The blocked form (scans of more than 16 elements) on every axis of a 3-d tensor, forward and gradient (a
    reversed scan), for sums, products, maxima and minima; a length that is no multiple of 16 pads its last block."""
    x = data((17, 2, 40), seed=22) if axis in (0, -3) else data((3, 33, 40), seed=22)
    for name in ("cumsum", "cumprod", "cummax", "cummin"):
        zf, tf = SCANS[name]
        inp = x if name != "cumprod" else 1 + x / 20
        check(lambda t: zf(t, axis), lambda t: tf(t, axis), V(inp))


@pytest.mark.parametrize("dtype", ["int32", "int8", "bool", "float16"])
def test_blocked_scans_of_other_dtypes(dtype):
    """ints and bools accumulate in int64 (torch's cumsum dtype) exactly; a half cumsum as torch's, in half."""
    x = data((3, 50), dtype, -3, 3, seed=23)
    check(lambda t: t.cumsum(1), lambda t: t.cumsum(1), V(x), atol=2e-2, rtol=2e-2)
    check(lambda t: t.cumsum(0), lambda t: t.cumsum(0), V(data((50, 3), dtype, -3, 3, seed=24)), atol=2e-2, rtol=2e-2)
    if dtype not in ("bool", "float16"):
        check(lambda t: t.cumprod(1), lambda t: t.cumprod(1), V(data((2, 40), dtype, -1, 1, seed=25)))


def test_blocked_scans_of_empty_dims():
    """A scan of more than 16 elements over a tensor with an empty other dim is empty; a 0-d tensor is itself."""
    check(lambda t: t.cumsum(1), lambda t: t.cumsum(1), V(data((0, 40), seed=26)))
    check(lambda t: t.cumsum(0), lambda t: t.cumsum(0), V(data((40, 0), seed=27)))
    check(lambda t: t.cumprod(-1), lambda t: t.cumprod(-1), V(data((2, 0, 40), seed=28)))


def test_long_cumsum_error_against_float64():
    """A million float32 elements in [0, 1): against a float64 cumsum the blocked scan is within 2 ulps of the
    running total, 0.45 ulp rms (tensor/reduce.py: _blocked_scan adds its terms from the smallest, so one add
    rounds at the total's magnitude; a level by level combine, or the sqrt(n) windows before, rounded there once per
    level: 2.1-2.9 ulps, 0.54 rms; a float32 running sum one by one is ~100x worse)."""
    x = np.random.default_rng(29).random(10**6, dtype=np.float32)
    ref = np.cumsum(x.astype(np.float64))
    err = Tensor(x).cumsum(0).numpy().astype(np.float64) - ref
    ulp = np.spacing(np.float32(ref[-1]))
    assert np.abs(err).max() <= 2 * ulp
    assert np.sqrt(np.mean(err**2)) <= 0.45 * ulp


# ----------------------------------------------------------------------------- softmax

SOFT = {
    "softmax": (lambda x, a: x.softmax(a), lambda x, a: x.softmax(a)),
    "log_softmax": (lambda x, a: x.log_softmax(a), lambda x, a: x.log_softmax(a)),
    "softmin": (lambda x, a: x.softmin(a), lambda x, a: torch.nn.functional.softmin(x, a)),
}


@pytest.mark.slow
@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("inp", list(INPUTS))
@pytest.mark.parametrize("op", list(SOFT))
def test_softmax(op, inp, axis):
    zf, tf = SOFT[op]
    check(lambda x: zf(x, axis), lambda x: tf(x, axis), INPUTS[inp](18))


@pytest.mark.slow
def test_softmax_edge():
    check(lambda x: x.softmax(0), lambda x: x.softmax(0), V(data((), seed=19)))
    check(lambda x: x.softmax(1), lambda x: x.softmax(1), V(data((0, 3), seed=19)))
    check(lambda x: x.softmax(-1), lambda x: x.softmax(-1), V(data((2, 3), lo=50, hi=90, seed=19)))  # large: stable

    check(
        lambda x: x.softmax(-1, dtype=dtypes.float64),
        lambda x: x.softmax(-1, dtype=torch.float64),
        V(data((2, 3), seed=19)),
    )
    check(lambda x: x.softmax(-1), lambda x: x.float().softmax(-1), V(data((2, 3), "int32", -3, 3, seed=19)))


def test_softmax_kernel_count():
    x = Tensor(data((8, 16), seed=20)).realize()
    GlobalCounters.reset()
    x.softmax(-1).realize()
    assert GlobalCounters.kernel_count == 1  # per row: max, sum of exp, then the divided row


# ----------------------------------------------------------------------------- sort / topk


@pytest.mark.parametrize(
    "f",
    [
        lambda x, mx, mn: mx(x.logsumexp(1, keepdim=True), 1),  # a max over one element of a reduce
        lambda x, mx, mn: mx(x.log_softmax(2), 0),
        lambda x, mx, mn: mn(x.softmax(-1), 0),
        lambda x, mx, mn: mn(x.flip(1).logsumexp(1, keepdim=True), 1),
    ],
    ids=["lse_max", "log_softmax_max", "softmax_min", "flip_lse_min"],
)
def test_max_gradient_of_a_value_computed_with_transcendentals_and_reduces(f):
    """The max's gradient compares x with the max (`x == max`). Recomputed in another kernel, x with an exp, a log or
    a reduce came out an ulp off the value the max was taken of (a vector polynomial against a scalar call, another
    order of adds) and matched no element: a zero gradient, where torch gives all of it. x is stored once now."""
    xn = np.random.default_rng(3).standard_normal((3, 4, 5)).astype(np.float32)
    xt = torch.tensor(xn, requires_grad=True)
    yt = f(xt, lambda t, d: t.amax(d, keepdim=True), lambda t, d: t.amin(d, keepdim=True))
    yt.square().sum().backward()
    x = Tensor(xn, requires_grad=True)
    y = f(x, lambda t, d: t.max(d, keepdim=True), lambda t, d: t.min(d, keepdim=True))
    y.square().sum().backward()
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_a_max_whose_gradient_is_not_taken_stores_nothing_more():
    """softmax, logsumexp and argmax take a max of x that no gradient flows through: x is not stored for it."""
    x = Tensor(np.random.default_rng(0).standard_normal((64, 100)).astype(np.float32), requires_grad=True)
    y = (x * 2).detach()
    for f in (lambda t: t.log_softmax(-1), lambda t: t.logsumexp(-1), lambda t: (t * 2).argmax(-1)):
        assert len(f(x * 2).schedule()) == len(f(y).schedule())


@pytest.mark.slow
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("shape,dim", [((7,), 0), ((3, 5), -1), ((3, 5), 0), ((2, 3, 4), 1), ((8,), 0), ((1, 4), 0)])
def test_sort(shape, dim, descending):
    check(
        lambda x: x.sort(dim, descending),
        lambda x: tuple(torch.sort(x, dim, descending)),
        V(data(shape, seed=21, distinct=True)),
    )
    check(
        lambda x: x.argsort(dim, descending),
        lambda x: torch.argsort(x, dim=dim, descending=descending),
        V(data(shape, seed=22, distinct=True)),
    )


@pytest.mark.slow
def test_sort_views_ints_and_ties():
    check(lambda x: x.sort(0), lambda x: tuple(torch.sort(x, 0)), INPUTS["perm"](23))
    check(lambda x: x.sort(-1, True), lambda x: tuple(torch.sort(x, -1, True)), INPUTS["slice"](24))
    x = data((2, 9), "int32", -20, 20, seed=25)
    check(lambda t: t.sort(-1)[0], lambda t: torch.sort(t, -1)[0], V(x))
    ties = np.array([3, 1, 3, 2, 1, 3], np.float32)  # equal values keep their order: torch's stable sort
    check(lambda t: t.sort(0), lambda t: tuple(torch.sort(t, dim=0, stable=True)), V(ties), grad=False)
    check(lambda t: t.sort(0), lambda t: tuple(torch.sort(t, 0)), V(data((0,), seed=26)))
    check(lambda t: t.sort(0), lambda t: tuple(torch.sort(t, 0)), V(data((), seed=26)))


@pytest.mark.slow
@pytest.mark.parametrize("k,dim,largest", [(3, -1, True), (1, 0, True), (2, -1, False), (5, 1, True), (0, -1, True)])
def test_topk(k, dim, largest):
    check(
        lambda x: x.topk(k, dim, largest),
        lambda x: tuple(torch.topk(x, k, dim, largest)),
        V(data((3, 5), seed=27, distinct=True)),
    )


def test_topk_too_large_raises():
    with pytest.raises(ValueError):
        Tensor([1.0, 2.0]).topk(3)


@pytest.mark.slow
def test_sort_kernel_count():
    x = Tensor(data((4, 8), seed=28, distinct=True)).realize()
    GlobalCounters.reset()
    values, idx = x.sort(-1)
    Tensor.realize(values, idx)
    assert GlobalCounters.kernel_count <= 13  # 6 compare-exchange steps for 8 elements, then the indices


# ======================================================= numpy: what the torch cases above do not cover

RED = {
    "sum": (lambda t, **k: t.sum(**k), np.sum),
    "max": (lambda t, **k: t.max(**k), np.max),
    "min": (lambda t, **k: t.min(**k), np.min),
    "mean": (lambda t, **k: t.mean(**k), np.mean),
}


def _reduce_numpy(op, axis, keepdim):
    x = data((2, 3, 4), lo=-3, hi=3, seed=50)
    t = RED[op][0](Tensor(x), axis=axis, keepdim=keepdim)
    e = RED[op][1](x.astype(np.float64), axis=axis, keepdims=keepdim).astype(np.float32)
    check_numpy(t, e, "float32")


# (1, True) and (-1, False) of sum, max, mean: in test_reduce_keepdim_views
REDUCE_NUMPY_CASES = [
    (op, axis, keepdim)
    for op in RED
    for axis, keepdim in [(None, False), (0, False), (1, True), (-1, False), ((0, 2), True)]
    if op == "min" or (axis, keepdim) not in [(1, True), (-1, False)]
]


@pytest.mark.parametrize("op,axis,keepdim", fast_first(REDUCE_NUMPY_CASES, unpack=True))
def test_reduce_float(op, axis, keepdim):
    _reduce_numpy(op, axis, keepdim)


def test_reduce_defaults():
    x = data((3, 5), seed=52)
    t = Tensor(x)
    assert t.sum().shape == ()
    assert t.max(axis=0).shape == (5,)
    check_numpy(t.sum(), np.array(x.sum(dtype=np.float64), np.float32))
    check_numpy(t.mean(axis=(0, 1)), np.array(x.mean(dtype=np.float64), np.float32))


@pytest.mark.parametrize("dtype", fast_first(["int32", "int64", "int8", "uint8"]))
def test_reduce_int(dtype):
    x = data((3, 4), dtype, -20, 20, seed=53)
    t = Tensor(x)
    np.testing.assert_array_equal(t.sum().numpy(), x.sum(dtype=np.int64))
    np.testing.assert_array_equal(t.sum(axis=0).numpy(), x.sum(axis=0, dtype=np.int64))
    np.testing.assert_array_equal(t.sum(axis=1, keepdim=True).numpy(), x.sum(axis=1, keepdims=True, dtype=np.int64))
    check_numpy(t.max(axis=1), x.max(axis=1), dtype)
    check_numpy(t.min(), np.array(x.min()), dtype)
    check_numpy(t.min(axis=0, keepdim=True), x.min(axis=0, keepdims=True), dtype)


def test_reduce_bool_sum():
    x = data((5, 6), "bool", seed=54)
    np.testing.assert_array_equal(Tensor(x).sum().numpy(), x.sum())
    np.testing.assert_array_equal(Tensor(x).sum(axis=1).numpy(), x.sum(axis=1))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_reduce_other_floats(dtype):
    x = data((4, 8), dtype, -2, 2, seed=55)
    # float16: the accumulator precision is not specified, allow a few half ulps
    tol = dict(rtol=5e-3, atol=1e-2) if dtype == "float16" else dict(rtol=1e-7, atol=1e-9)
    check_numpy(Tensor(x).sum(axis=1), x.astype(np.float64).sum(axis=1).astype(NP_OF[dtype]), dtype, **tol)
    check_numpy(Tensor(x).mean(), np.array(x.astype(np.float64).mean(), NP_OF[dtype]), dtype, **tol)
    check_numpy(Tensor(x).max(axis=0), x.max(axis=0), dtype, rtol=0, atol=0)


@pytest.mark.parametrize("op", fast_first(["sum", "mean", "max", "min"]))
def test_reduce_1_element_and_negative(op):
    x = np.array([[-5.0, -3.0, -7.0]], dtype=np.float32)
    check_numpy(getattr(Tensor(x), op)(axis=0), RED[op][1](x, axis=0).astype(np.float32))
    check_numpy(getattr(Tensor(x), op)(), np.array(RED[op][1](x), np.float32))


def test_reduce_empty():
    x = np.zeros((0, 3), np.float32)
    check_numpy(Tensor(x).sum(), np.array(0.0, np.float32))
    check_numpy(Tensor(x).sum(axis=0), np.zeros(3, np.float32))
    check_numpy(Tensor(x).sum(axis=0, keepdim=True), np.zeros((1, 3), np.float32))
    check_numpy(Tensor(x).sum(axis=1), np.zeros(0, np.float32))
    check_numpy(Tensor(x).max(axis=1), np.zeros(0, np.float32))
    y = np.zeros((2, 0, 4), np.float32)
    check_numpy(Tensor(y).sum(axis=1), np.zeros((2, 4), np.float32))
    check_numpy(Tensor(y).sum(axis=(0, 1), keepdim=True), np.zeros((1, 1, 4), np.float32))
    check_numpy(Tensor(y).max(axis=2), np.zeros((2, 0), np.float32))
    check_numpy(Tensor(y).mean(axis=2), np.zeros((2, 0), np.float32))
    np.testing.assert_array_equal(Tensor(np.zeros((0, 3), np.int32)).sum(axis=0).numpy(), np.zeros(3))


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("op", fast_first(list(RED)))
def test_reduce_pow2(op, axis):
    x = data((16, 32), seed=59)
    check_numpy(
        RED[op][0](Tensor(x), axis=axis),
        RED[op][1](x.astype(np.float64), axis=axis).astype(np.float32),
        rtol=1e-5,
        atol=1e-5,
    )
    xi = data((16, 32), "int32", -50, 50, seed=62)
    if op in ("max", "min"):
        check_numpy(RED[op][0](Tensor(xi), axis=axis), RED[op][1](xi, axis=axis), "int32")


def test_mean_over_empty_axis_is_nan():
    # torch/numpy: the mean of zero elements is nan
    with time_limit(10):
        out = Tensor.zeros(0).mean().numpy()
    assert out.shape == () and np.isnan(out)
    with time_limit(10):
        out = Tensor.zeros(2, 0).mean(axis=1).numpy()
    assert out.shape == (2,) and np.isnan(out).all()
    with time_limit(10):
        out = Tensor(np.zeros((2, 0, 4), np.float32)).mean(axis=1, keepdim=True).numpy()
    assert out.shape == (2, 1, 4) and np.isnan(out).all()


def test_reduce_large_sum():
    x = data((1000, 37), seed=56)
    # float32 accumulation over 1000 / 37000 terms: allow for summation order
    check_numpy(Tensor(x).sum(axis=0), x.astype(np.float64).sum(axis=0).astype(np.float32), rtol=1e-5, atol=1e-3)
    check_numpy(Tensor(x).sum(), np.array(x.astype(np.float64).sum(), np.float32), rtol=1e-5, atol=2e-2)
    xi = data((1000, 37), "int32", -1000, 1000, seed=57)
    np.testing.assert_array_equal(Tensor(xi).sum().numpy(), xi.sum(dtype=np.int64))


def test_reduce_then_elementwise():
    x = data((4, 5), seed=58)
    t = Tensor(x)
    e = x - x.max(axis=1, keepdims=True)
    check_numpy(t - t.max(axis=1, keepdim=True), e)
    sm = np.exp(e.astype(np.float64))
    sm = (sm / sm.sum(axis=1, keepdims=True)).astype(np.float32)
    tt = (t - t.max(axis=1, keepdim=True)).exp()
    check_numpy(tt / tt.sum(axis=1, keepdim=True), sm, rtol=1e-4)
    check_numpy(t.mean() + t.sum(axis=0), x.mean(dtype=np.float64) + x.sum(axis=0, dtype=np.float64), "float32")
