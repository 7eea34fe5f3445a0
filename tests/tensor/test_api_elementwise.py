"""Elementwise ops against torch 2.13 (CPU): forward values and dtypes, and gradients where differentiable, on plain,
0-d, zero-size, broadcast and non-contiguous (permuted or sliced) inputs."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.tensor.api_helpers import V, check, data
from zeptograd import Tensor, dtypes

# shape variants for one input; each is (make the input from data of a domain)
SHAPES = {
    "2d": lambda lo, hi, s: V(data((3, 4), lo=lo, hi=hi, seed=s)),
    "0d": lambda lo, hi, s: V(data((), lo=lo, hi=hi, seed=s)),
    "empty": lambda lo, hi, s: V(data((0, 3), lo=lo, hi=hi, seed=s)),
    "perm": lambda lo, hi, s: V(data((4, 3), lo=lo, hi=hi, seed=s), view=lambda x: x.permute(1, 0)),
    "slice": lambda lo, hi, s: V(data((5, 6), lo=lo, hi=hi, seed=s), view=lambda x: x[1:4, ::2]),
}

# name: (zeptograd fn, torch fn, domain)
UNARY = {
    "neg": (lambda x: -x, lambda x: -x, (-2, 2)),
    "exp": (Tensor.exp, torch.exp, (-2, 2)),
    "exp2": (Tensor.exp2, torch.exp2, (-2, 2)),
    "log": (Tensor.log, torch.log, (0.1, 3)),
    "log2": (Tensor.log2, torch.log2, (0.1, 3)),
    "log10": (Tensor.log10, torch.log10, (0.1, 3)),
    "sqrt": (Tensor.sqrt, torch.sqrt, (0.1, 3)),
    "rsqrt": (Tensor.rsqrt, torch.rsqrt, (0.1, 3)),
    "reciprocal": (Tensor.reciprocal, torch.reciprocal, (0.5, 3)),
    "square": (Tensor.square, torch.square, (-2, 2)),
    "sin": (Tensor.sin, torch.sin, (-3, 3)),
    "cos": (Tensor.cos, torch.cos, (-3, 3)),
    "tan": (Tensor.tan, torch.tan, (-1.2, 1.2)),
    "asin": (Tensor.asin, torch.asin, (-0.9, 0.9)),
    "acos": (Tensor.acos, torch.acos, (-0.9, 0.9)),
    "atan": (Tensor.atan, torch.atan, (-4, 4)),
    "sinh": (Tensor.sinh, torch.sinh, (-2, 2)),
    "cosh": (Tensor.cosh, torch.cosh, (-2, 2)),
    "tanh": (Tensor.tanh, torch.tanh, (-3, 3)),
    "asinh": (Tensor.asinh, torch.asinh, (-3, 3)),
    "acosh": (Tensor.acosh, torch.acosh, (1.2, 3)),
    "atanh": (Tensor.atanh, torch.atanh, (-0.9, 0.9)),
    "floor": (Tensor.floor, torch.floor, (-3, 3)),
    "ceil": (Tensor.ceil, torch.ceil, (-3, 3)),
    "round": (Tensor.round, torch.round, (-3, 3)),
    "trunc": (Tensor.trunc, torch.trunc, (-3, 3)),
    "sign": (Tensor.sign, torch.sign, (-2, 2)),
    "abs": (Tensor.abs, torch.abs, (-2, 2)),
    "erf": (Tensor.erf, torch.erf, (-2.5, 2.5)),
    "relu": (Tensor.relu, torch.relu, (-2, 2)),
    "relu6": (Tensor.relu6, F.relu6, (-3, 9)),
    "leaky_relu": (lambda x: x.leaky_relu(0.1), lambda x: F.leaky_relu(x, 0.1), (-2, 2)),
    "elu": (lambda x: x.elu(0.7), lambda x: F.elu(x, 0.7), (-2, 2)),
    "celu": (lambda x: x.celu(1.3), lambda x: F.celu(x, 1.3), (-2, 2)),
    "selu": (Tensor.selu, F.selu, (-2, 2)),
    "gelu_tanh": (Tensor.gelu, lambda x: F.gelu(x, approximate="tanh"), (-3, 3)),
    "gelu": (lambda x: x.gelu("none"), F.gelu, (-3, 3)),
    "quick_gelu": (Tensor.quick_gelu, lambda x: x * torch.sigmoid(1.702 * x), (-3, 3)),
    "sigmoid": (Tensor.sigmoid, torch.sigmoid, (-4, 4)),
    "hardsigmoid": (Tensor.hardsigmoid, F.hardsigmoid, (-4, 4)),
    "hardswish": (Tensor.hardswish, F.hardswish, (-4, 4)),
    "hardtanh": (lambda x: x.hardtanh(-0.5, 1.5), lambda x: F.hardtanh(x, -0.5, 1.5), (-2, 2)),
    "silu": (Tensor.silu, F.silu, (-3, 3)),
    "swish": (Tensor.swish, F.silu, (-3, 3)),
    "mish": (Tensor.mish, F.mish, (-3, 3)),
    "softplus": (lambda x: x.softplus(2.0), lambda x: F.softplus(x, 2.0), (-3, 3)),
    "softsign": (Tensor.softsign, F.softsign, (-3, 3)),
    "logsigmoid": (Tensor.logsigmoid, F.logsigmoid, (-4, 4)),
}
EDGE_OPS = ["exp", "log", "sqrt", "sin", "tanh", "abs", "round", "sigmoid", "gelu_tanh", "erf"]


@pytest.mark.parametrize("op", list(UNARY))
def test_unary(op):
    zfn, tfn, (lo, hi) = UNARY[op]
    check(zfn, tfn, SHAPES["2d"](lo, hi, 1), atol=1e-6 if op not in ("sinh", "cosh") else 1e-5)


@pytest.mark.parametrize("shape", ["0d", "empty", "perm", "slice"])
@pytest.mark.parametrize("op", EDGE_OPS)
def test_unary_shapes(op, shape):
    zfn, tfn, (lo, hi) = UNARY[op]
    check(zfn, tfn, SHAPES[shape](lo, hi, 2))


@pytest.mark.parametrize("op", ["exp", "sqrt", "sin", "log", "abs", "sign", "floor", "round", "sigmoid"])
@pytest.mark.parametrize("dtype", ["int32", "int64", "bool", "float16", "float64"])
def test_unary_dtypes(op, dtype):
    """int/bool inputs give float32 for transcendentals (as torch); the rest keep the dtype."""
    if dtype == "bool" and op in ("abs", "sign", "floor", "round"):
        pytest.skip("torch: not implemented for bool")
    zfn, tfn, (lo, hi) = UNARY[op]
    x = data((2, 5), dtype, lo=max(lo, 0) if op in ("sqrt", "log") else lo, hi=hi, seed=3)
    if dtype != "bool" and op in ("sqrt", "log"):
        x = np.where(x <= 0, 1, x).astype(x.dtype)
    tol = dict(atol=2e-3, rtol=2e-3) if dtype == "float16" else {}
    check(zfn, tfn, V(x), grad=dtype == "float64", **tol)


def test_special_values():
    x = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 2.5, -2.5, 0.5, -0.5, 1.5], np.float32)
    for zfn, tfn in [
        (Tensor.isnan, torch.isnan),
        (Tensor.isinf, torch.isinf),
        (Tensor.isfinite, torch.isfinite),
        (lambda t: t.isinf(detect_negative=False), torch.isposinf),
        (lambda t: t.isinf(detect_positive=False), torch.isneginf),
        (Tensor.round, torch.round),
        (Tensor.floor, torch.floor),
        (Tensor.ceil, torch.ceil),
        (Tensor.trunc, torch.trunc),
        (Tensor.sign, torch.sign),
        (Tensor.abs, torch.abs),
        (Tensor.relu, torch.relu),
        (Tensor.sigmoid, torch.sigmoid),
        (Tensor.exp, torch.exp),
        (Tensor.sqrt, torch.sqrt),
        (Tensor.log, torch.log),
        (Tensor.tanh, torch.tanh),
    ]:
        check(zfn, tfn, V(x), grad=False)


# ----------------------------------------------------------------------------- binary

BINARY = {
    "add": (lambda a, b: a + b, (-2, 2)),
    "sub": (lambda a, b: a - b, (-2, 2)),
    "mul": (lambda a, b: a * b, (-2, 2)),
    "div": (lambda a, b: a / b, (0.5, 2)),
    "pow": (lambda a, b: a**b, (0.5, 2)),
    "maximum": (lambda a, b: a.maximum(b) if isinstance(a, Tensor) else torch.maximum(a, b), (-2, 2)),
    "minimum": (lambda a, b: a.minimum(b) if isinstance(a, Tensor) else torch.minimum(a, b), (-2, 2)),
    "mod": (lambda a, b: a % b, (0.5, 3)),
    "fmod": (lambda a, b: a.fmod(b), (0.5, 3)),
    "floordiv": (lambda a, b: a // b, (0.5, 3)),
    "div_trunc": (lambda a, b: a.div(b, rounding_mode="trunc"), (0.5, 3)),
    "copysign": (lambda a, b: a.copysign(b), (-2, 2)),
    "logaddexp": (lambda a, b: a.logaddexp(b), (-2, 2)),
    "lerp": (lambda a, b: a.lerp(b, 0.3), (-2, 2)),
    "lt": (lambda a, b: a < b, (-2, 2)),
    "le": (lambda a, b: a <= b, (-2, 2)),
    "gt": (lambda a, b: a > b, (-2, 2)),
    "ge": (lambda a, b: a >= b, (-2, 2)),
    "eq": (lambda a, b: a == b, (-2, 2)),
    "ne": (lambda a, b: a != b, (-2, 2)),
}
PAIRS = {  # shapes of (a, b), with views
    "same": ((3, 4), (3, 4), None, None),
    "bcast": ((3, 1), (1, 4), None, None),
    "bcast_rank": ((2, 3, 4), (4,), None, None),
    "0d": ((), (), None, None),
    "0d_vs_2d": ((), (3, 4), None, None),
    "empty": ((0, 4), (1, 4), None, None),
    "perm": ((4, 3), (3, 4), lambda x: x.permute(1, 0), None),
    "slice": ((5, 8), (3, 4), lambda x: x[1:4, ::2], None),
}


def _with_ties(a, b):
    """b with every third element equal to a's, so that comparisons and max/min meet ties"""
    b = b.copy()
    b.reshape(-1)[::3] = a.reshape(-1)[::3]
    return b


@pytest.mark.parametrize("op", list(BINARY))
def test_binary(op):
    fn, (lo, hi) = BINARY[op]
    a, b = data((3, 4), lo=lo, hi=hi, seed=5), data((3, 4), lo=lo, hi=hi, seed=6)
    cmp = op in ("lt", "le", "gt", "ge", "eq", "ne")
    check(fn, fn, V(a), V(_with_ties(a, b) if cmp else b), grad=op != "floordiv")  # torch: no floor_divide backward


@pytest.mark.parametrize("pair", [p for p in PAIRS if p != "same"])
@pytest.mark.parametrize("op", ["add", "mul", "div", "maximum", "lt", "pow"])
def test_binary_shapes(op, pair):
    fn, (lo, hi) = BINARY[op]
    sa, sb, va, vb = PAIRS[pair]
    check(fn, fn, V(data(sa, lo=lo, hi=hi, seed=7), va), V(data(sb, lo=lo, hi=hi, seed=8), vb))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow", "mod", "floordiv", "lt", "eq", "maximum", "minimum"])
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("scalar", [2, 1.5, -0.5])
def test_binary_python_scalar(op, side, scalar):
    fn, (lo, hi) = BINARY[op]
    if op == "pow" and side == "right":
        lo, hi = 0.5, 2
    if op in ("mod", "floordiv", "div") and side == "right":
        lo, hi = 0.5, 3
    x = V(data((2, 3), lo=lo, hi=hi, seed=9))
    if op in ("maximum", "minimum"):  # torch.maximum takes no Python scalar: clamp is the same op
        tfn = (lambda a: torch.clamp(a, min=scalar)) if op == "maximum" else (lambda a: torch.clamp(a, max=scalar))
        check(lambda a: fn(a, scalar), tfn, x)
    elif side == "left":
        check(lambda a: fn(a, scalar), lambda a: fn(a, scalar), x, grad=op not in ("floordiv", "mod"))
    else:  # a negative base to a fractional power is nan, and so is torch's gradient there
        grad = op not in ("floordiv", "mod") and not (op == "pow" and scalar < 0)
        check(lambda a: fn(scalar, a), lambda a: fn(scalar, a), x, grad=grad)


@pytest.mark.parametrize(
    "op", ["add", "sub", "mul", "div", "mod", "floordiv", "div_trunc", "fmod", "maximum", "minimum", "lt", "eq", "pow"]
)
@pytest.mark.parametrize("dtype", ["int32", "int8", "int64"])
def test_binary_int(op, dtype):
    fn, _ = BINARY[op]
    a = data((3, 5), dtype, -7, 7, seed=10)
    b = data((3, 5), dtype, -4, 4, seed=11)
    b = np.where(b == 0, 3, b).astype(b.dtype)
    if op == "pow":
        a, b = np.abs(a) % 4, np.abs(b) % 4
    check(fn, fn, V(a), V(b))
    if op not in ("maximum", "minimum"):  # torch.maximum takes no Python scalar
        check(lambda x: fn(x, 3), lambda x: fn(x, 3), V(a))


@pytest.mark.parametrize(
    "a,b",
    [
        ("int32", "int64"),
        ("uint8", "int8"),
        ("float16", "float32"),
        ("int32", "float16"),
        ("bool", "int32"),
        ("bool", "float32"),
        ("int64", "float32"),
        ("uint8", "int16"),
        ("float32", "float64"),
        ("int8", "bool"),
    ],
)
def test_promotion(a, b):
    x, y = data((2, 3), a, 0, 5, seed=12), data((2, 3), b, 1, 5, seed=13)
    for fn in (lambda p, q: p + q, lambda p, q: p * q, lambda p, q: p == q):
        check(fn, fn, V(x), V(y), grad=False, atol=1e-2)
    if b != "bool":
        check(lambda p, q: p / q, lambda p, q: p / q, V(x), V(y), grad=False, atol=1e-2)


@pytest.mark.parametrize(
    "a,b",
    [
        ("float32", "float64"),
        ("int32", "float64"),
        ("float16", "float64"),  # double -> half goes through float32 (codegen/lower.py)
        ("int8", "int64"),
        ("bool", "int64"),
        ("float32", "int64"),
    ],
)
def test_promotion_0d(a, b):
    """torch: a 0-d tensor only decides the dtype when it is of a higher kind than the dimensioned one"""
    x, y = data((2, 3), a, 0, 5, seed=14), data((), b, 1, 5, seed=15)
    check(lambda p, q: p + q, lambda p, q: p + q, V(x), V(y), grad=False, atol=1e-2)
    check(lambda p, q: q * p, lambda p, q: q * p, V(x), V(y), grad=False, atol=1e-2)


@pytest.mark.parametrize(
    "dtype,scalar",
    [("bool", 3), ("bool", 2.5), ("int8", 3), ("uint8", 1.5), ("float16", 2.5), ("int64", 2), ("int32", True)],
)
def test_promotion_python_scalar(dtype, scalar):
    x = data((5,), dtype, 0, 9, seed=16)
    check(lambda t: t + scalar, lambda t: t + scalar, V(x), grad=False, atol=1e-2)
    check(lambda t: scalar * t, lambda t: scalar * t, V(x), grad=False, atol=1e-2)


@pytest.mark.parametrize("op", ["and", "or", "xor", "lshift", "rshift", "invert"])
@pytest.mark.parametrize("dtype", ["int32", "uint8", "bool", "int64"])
def test_bitwise(op, dtype):
    if dtype == "bool" and op in ("lshift", "rshift"):
        pytest.skip("torch: no shifts of bools")
    fns = {
        "and": lambda a, b: a & b,
        "or": lambda a, b: a | b,
        "xor": lambda a, b: a ^ b,
        "lshift": lambda a, b: a << b,
        "rshift": lambda a, b: a >> b,
        "invert": lambda a, b: ~a,
    }
    a = data((3, 4), dtype, 0, 100, seed=17)
    b = data((3, 4), dtype, 0, 5, seed=18)
    check(fns[op], fns[op], V(a), V(b))
    if op not in ("invert",) and dtype != "bool":
        check(lambda x: fns[op](x, 3), lambda x: fns[op](x, 3), V(a))
        bcast = lambda x, y: fns[op](x[:, None], y[None, :2])  # noqa: E731
        check(bcast, bcast, V(a[0]), V(b[0]))


def test_bitwise_float_raises():
    with pytest.raises(TypeError):
        Tensor([1.0]) & Tensor([2.0])


def test_logical():
    a, b = data((3, 4), "bool", seed=19), data((3, 4), "bool", seed=20)
    for zf, tf in [
        (Tensor.logical_not, torch.logical_not),
        (lambda x, y: x.logical_and(y), torch.logical_and),
        (lambda x, y: x.logical_or(y), torch.logical_or),
        (lambda x, y: x.logical_xor(y), torch.logical_xor),
    ]:
        check(zf, tf, V(a), V(b)) if zf is not Tensor.logical_not else check(zf, tf, V(a))


@pytest.mark.parametrize(
    "shapes", [((3, 4), (3, 4), (3, 4)), ((3, 1), (1, 4), ()), ((), (2, 3), (3,)), ((0, 2), (1, 2), (0, 1))]
)
def test_where(shapes):
    c, a, b = data(shapes[0], "bool", seed=21), data(shapes[1], seed=22), data(shapes[2], seed=23)
    check(lambda c, a, b: c.where(a, b), lambda c, a, b: torch.where(c, a, b), V(c), V(a), V(b))
    check(lambda c, a: c.where(a, 0.5), lambda c, a: torch.where(c, a, 0.5), V(c), V(a))
    check(lambda c, b: c.where(2, b), lambda c, b: torch.where(c, 2, b), V(c), V(b))
    check(lambda c: c.where(1.0, 0), lambda c: torch.where(c, 1.0, 0), V(c))


def test_where_int_dtypes():
    c, a, b = data((4,), "bool", seed=24), data((4,), "int32", -5, 5, seed=25), data((4,), "int64", -5, 5, seed=26)
    check(lambda c, a, b: c.where(a, b), lambda c, a, b: torch.where(c, a, b), V(c), V(a), V(b))
    check(lambda c, a: c.where(a, 7), lambda c, a: torch.where(c, a, 7), V(c), V(a))


@pytest.mark.parametrize("lo,hi", [(-0.5, 1.0), (None, 0.3), (-0.2, None), (1.0, -1.0)])
def test_clamp(lo, hi):
    x = data((3, 5), seed=27)
    check(lambda t: t.clamp(lo, hi), lambda t: torch.clamp(t, lo, hi), V(x))
    check(lambda t: t.clip(lo, hi), lambda t: torch.clip(t, lo, hi), V(x, lambda t: t.permute(1, 0)))


def test_clamp_tensor_bounds_and_int():
    x, lo, hi = data((3, 4), seed=28), data((3, 4), -1, 0, seed=29), data((4,), 0, 1, seed=30)
    check(lambda t, a, b: t.clamp(a, b), lambda t, a, b: torch.clamp(t, a, b), V(x), V(lo), V(hi))
    xi = data((3, 4), "int32", -9, 9, seed=31)
    check(lambda t: t.clamp(-3, 4), lambda t: t.clamp(-3, 4), V(xi))
    check(lambda t: t.clamp(-2.5, 4), lambda t: t.clamp(-2.5, 4), V(xi))
    with pytest.raises(ValueError):
        Tensor([1.0]).clamp()


def test_isclose_allclose():
    a = data((3, 4), seed=32)
    b = a + np.where(data((3, 4), seed=33) > 0, 1e-6, 1e-2).astype(np.float32)
    b[0, 0], a[0, 1], b[0, 1], a[1, 1], b[1, 1] = np.nan, np.inf, np.inf, np.nan, np.nan
    for kw in ({}, {"rtol": 1e-2}, {"atol": 1e-5}, {"equal_nan": True}):
        check(lambda x, y: x.isclose(y, **kw), lambda x, y: torch.isclose(x, y, **kw), V(a), V(b))
    assert Tensor(a[2:]).allclose(Tensor(a[2:] + 1e-9)).item() is True
    assert Tensor(a).allclose(Tensor(b)).item() is False
    assert isinstance(Tensor(a).allclose(Tensor(a)), Tensor)


def test_pow_special():
    x = np.array([-2.0, -1.5, 0.0, 0.5, 2.0, -3.0], np.float32)
    e = np.array([2.0, 0.5, 0.0, -1.0, 3.0, 3.0], np.float32)
    check(lambda a, b: a**b, lambda a, b: a**b, V(x), V(e), grad=False)
    for p in (0, 1, 2, 3, -1, -2, 0.5, -0.5, 2.5):
        check(lambda a: a**p, lambda a: a**p, V(data((2, 3), lo=0.5, hi=2, seed=34)))
    check(lambda a: 2**a, lambda a: 2**a, V(data((2, 3), seed=35)))
    xi = data((5,), "int32", -3, 3, seed=36)
    check(lambda a: a**3, lambda a: a**3, V(xi))
    check(lambda a: a**2.0, lambda a: a**2.0, V(xi))


@pytest.mark.parametrize("op", ["iadd", "isub", "imul", "itruediv", "ipow", "imod", "ifloordiv"])
def test_inplace_float(op):
    import operator

    fn = getattr(operator, op)
    a, b = data((3, 4), 0.5, 2, seed=37), data((3, 4), 0.5, 2, seed=38)
    za, ta = Tensor(a), torch.tensor(a)
    alias = za  # the same Python object sees the update
    za2 = fn(za, Tensor(b))
    ta = fn(ta, torch.tensor(b))
    assert za2 is alias
    np.testing.assert_allclose(alias.numpy(), ta.numpy(), atol=1e-6, rtol=1e-3)
    za3 = fn(za2, 2)
    ta = fn(ta, 2)
    np.testing.assert_allclose(za3.numpy(), ta.numpy(), atol=1e-6, rtol=1e-3)


@pytest.mark.parametrize("op", ["iand", "ior", "ixor", "ilshift", "irshift", "iadd", "imul", "isub"])
def test_inplace_int(op):
    import operator

    fn = getattr(operator, op)
    a, b = data((6,), "int32", 0, 50, seed=39), data((6,), "int32", 0, 3, seed=40)
    za, ta = Tensor(a), torch.tensor(a)
    fn(za, Tensor(b))
    ta = fn(ta, torch.tensor(b))
    np.testing.assert_array_equal(za.numpy(), ta.numpy())
    assert za.dtype == dtypes.int32


def test_inplace_on_buffer_stays_one_kernel():
    from zeptograd import GlobalCounters

    t = Tensor.empty(8)
    t.assign(Tensor.arange(8).float())
    t += 1
    t *= 2
    GlobalCounters.reset()
    t.realize()
    assert GlobalCounters.kernel_count == 1
    np.testing.assert_allclose(t.numpy(), (np.arange(8) + 1) * 2)


# ----------------------------------------------------------------------------- casts


@pytest.mark.parametrize(
    "src,dst",
    [
        ("float32", "int32"),
        ("float32", "int8"),
        ("int32", "float32"),
        ("int64", "float16"),
        ("float32", "bool"),
        ("bool", "float32"),
        ("uint8", "int64"),
        ("float64", "float32"),
        ("int32", "bool"),
    ],
)
def test_cast(src, dst):
    x = data((3, 4), src, -100 if src != "uint8" else 0, 100, seed=41)
    from tests.tensor.api_helpers import TORCH_OF, ZEPTO_OF

    check(lambda t: t.cast(ZEPTO_OF[dst]), lambda t: t.to(TORCH_OF[dst]), V(x), grad=False)


def test_cast_grad_and_shorthands():
    x = data((3, 4), seed=42)
    check(lambda t: t.double() * 2, lambda t: t.double() * 2, V(x))
    check(lambda t: t.half().float() * 2, lambda t: t.half().float() * 2, V(x), atol=2e-3)
    for z, t in [
        ("float", "float"),
        ("half", "half"),
        ("double", "double"),
        ("int", "int"),
        ("long", "long"),
        ("short", "short"),
        ("bool", "bool"),
    ]:
        check(lambda v: getattr(v, z)(), lambda v: getattr(v, t)(), V(x), grad=False, atol=2e-3)


@pytest.mark.parametrize(
    "src,dst",
    [("float32", "int32"), ("int32", "float32"), ("int16", "uint16"), ("float16", "int16"), ("int64", "float64")],
)
def test_bitcast(src, dst):
    x = data((2, 5), src, -50, 50, seed=43)
    tdst = {"uint16": torch.uint16}.get(dst) or getattr(torch, dst)
    z = Tensor(x).bitcast(getattr(dtypes, dst))
    assert z.dtype == getattr(dtypes, dst)
    np.testing.assert_array_equal(z.numpy().view(np.uint8), torch.tensor(x).view(tdst).numpy().view(np.uint8))
    with pytest.raises(TypeError):
        Tensor(x).bitcast(dtypes.int8)


def test_composite_expression_grad():
    """a longer chain mixing ops: gradients flow through every primitive"""
    a, b = data((4, 5), seed=44), data((5,), 0.5, 2, seed=45)

    def fn(x, y):
        return (((x * y).exp() + 1).log() * (x - y).sigmoid() / y.sqrt()).maximum(x.tanh())

    check(fn, fn, V(a), V(b))
