"""Elementwise ops (unary, binary, casts, promotion, where, bitwise, in-place) against torch 2.13 (CPU, `check`:
forward values and dtypes, and gradients where differentiable) and numpy (`check_numpy`: the result computed in
float64 and rounded, and dtypes torch lacks), on plain, 0-d, zero-size, broadcast and non-contiguous inputs. A case
both oracles apply to is one test that runs both; the numpy-only cases are in the second half."""

import operator

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.slow import fast_first
from tests.tensor.api_helpers import NP_OF, TORCH_OF, ZEPTO_OF, V, check, check_numpy, data, tol_for
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


@pytest.mark.parametrize("op", fast_first(list(UNARY)))
def test_unary(op):
    zfn, tfn, (lo, hi) = UNARY[op]
    check(zfn, tfn, SHAPES["2d"](lo, hi, 1), atol=1e-6 if op not in ("sinh", "cosh") else 1e-5)
    if op in NP_UNARY:
        _unary_numpy(op, (4, 6))


@pytest.mark.parametrize("shape", fast_first(["0d", "empty", "perm", "slice"]))
@pytest.mark.parametrize("op", EDGE_OPS)
def test_unary_shapes(op, shape):
    zfn, tfn, (lo, hi) = UNARY[op]
    check(zfn, tfn, SHAPES[shape](lo, hi, 2))
    if op in NP_UNARY and shape in ("0d", "empty"):
        _unary_numpy(op, {"0d": (), "empty": (2, 0, 4)}[shape])


@pytest.mark.parametrize("op", fast_first(["exp", "sqrt", "sin", "log", "abs", "sign", "floor", "round", "sigmoid"]))
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
    if op in ("exp", "sqrt", "sin") and dtype in ("float16", "float64"):
        _unary_other_float_numpy(op, dtype)


SPECIAL = {
    "isnan": (Tensor.isnan, torch.isnan),
    "isinf": (Tensor.isinf, torch.isinf),
    "isfinite": (Tensor.isfinite, torch.isfinite),
    "isposinf": (lambda t: t.isinf(detect_negative=False), torch.isposinf),
    "isneginf": (lambda t: t.isinf(detect_positive=False), torch.isneginf),
    "round": (Tensor.round, torch.round),
    "floor": (Tensor.floor, torch.floor),
    "ceil": (Tensor.ceil, torch.ceil),
    "trunc": (Tensor.trunc, torch.trunc),
    "sign": (Tensor.sign, torch.sign),
    "abs": (Tensor.abs, torch.abs),
    "relu": (Tensor.relu, torch.relu),
    "sigmoid": (Tensor.sigmoid, torch.sigmoid),
    "exp": (Tensor.exp, torch.exp),
    "sqrt": (Tensor.sqrt, torch.sqrt),
    "log": (Tensor.log, torch.log),
    "tanh": (Tensor.tanh, torch.tanh),
}


@pytest.mark.parametrize("op", fast_first(list(SPECIAL)))
def test_special_values(op):
    x = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 2.5, -2.5, 0.5, -0.5, 1.5], np.float32)
    check(*SPECIAL[op], V(x), grad=False)


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


@pytest.mark.parametrize("op", fast_first(list(BINARY)))
def test_binary(op):
    fn, (lo, hi) = BINARY[op]
    a, b = data((3, 4), lo=lo, hi=hi, seed=5), data((3, 4), lo=lo, hi=hi, seed=6)
    cmp = op in ("lt", "le", "gt", "ge", "eq", "ne")
    check(fn, fn, V(a), V(_with_ties(a, b) if cmp else b), grad=op != "floordiv")  # torch: no floor_divide backward
    if op in NP_BINARY:
        _binary_numpy(op, "float32")


@pytest.mark.parametrize("pair", fast_first([p for p in PAIRS if p != "same"]))
@pytest.mark.parametrize("op", ["add", "mul", "div", "maximum", "lt", "pow"])
def test_binary_shapes(op, pair):
    fn, (lo, hi) = BINARY[op]
    sa, sb, va, vb = PAIRS[pair]
    check(fn, fn, V(data(sa, lo=lo, hi=hi, seed=7), va), V(data(sb, lo=lo, hi=hi, seed=8), vb))
    if pair == "0d" and op in ("add", "div", "maximum", "lt"):
        _binary_shape_numpy(op, ())


@pytest.mark.parametrize(
    "op", fast_first(["add", "sub", "mul", "div", "pow", "mod", "floordiv", "lt", "eq", "maximum", "minimum"])
)
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
    if op in ("add", "sub", "mul", "div", "lt", "eq"):  # the same expression on numpy, in float64
        x64, z = x.arr.astype(np.float64), Tensor(x.arr)
        expected, result = (fn(x64, scalar), fn(z, scalar)) if side == "left" else (fn(scalar, x64), fn(scalar, z))
        check_numpy(result, np.asarray(expected).astype(np.bool_ if op in ("lt", "eq") else np.float32))


@pytest.mark.parametrize(
    "op",
    fast_first(
        ["add", "sub", "mul", "div", "mod", "floordiv", "div_trunc", "fmod", "maximum", "minimum", "lt", "eq", "pow"]
    ),
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
    if dtype == "int32" and op in NP_BINARY:
        _binary_numpy(op, dtype)
    if dtype in ("int8", "int64") and op in ("add", "mul", "maximum"):
        _binary_other_dtype_numpy(op, dtype)


PROMOTION = [  # a, b, the dtype of a + b that numpy's check expects (None: torch only)
    ("int32", "int64", "int64"),
    ("uint8", "int8", "int16"),
    ("float16", "float32", "float32"),
    ("int32", "float16", "float16"),
    ("bool", "int32", "int32"),
    ("bool", "float32", "float32"),
    ("int64", "float32", "float32"),
    ("uint8", "int16", None),
    ("float32", "float64", "float64"),
    ("int8", "bool", None),
    ("uint8", "int32", "int32"),
    ("uint8", "uint16", "uint16"),  # numpy only: torch has no uint16 arithmetic
    ("int8", "int16", "int16"),
]


@pytest.mark.parametrize("a,b,expected", fast_first(PROMOTION, unpack=True))
@pytest.mark.parametrize("fn", ["add", "mul", "eq", "div"])
def test_promotion(a, b, expected, fn):
    f = {"add": operator.add, "mul": operator.mul, "eq": operator.eq, "div": operator.truediv}[fn]
    if "uint16" not in (a, b) and not (fn == "div" and b == "bool"):
        x, y = data((2, 3), a, 0, 5, seed=12), data((2, 3), b, 1, 5, seed=13)
        check(f, f, V(x), V(y), grad=False, atol=1e-2)
    if expected is not None and fn in ("add", "mul"):  # numpy: both orders, computed in float64
        x, y = data((2, 3), a, 0, 9, seed=24), data((2, 3), b, 0, 9, seed=25)
        e = f(x.astype(np.float64), y.astype(np.float64)).astype(NP_OF[expected])
        check_numpy(f(Tensor(x), Tensor(y)), e, expected, **tol_for(expected))
        check_numpy(f(Tensor(y), Tensor(x)), e, expected, **tol_for(expected))


@pytest.mark.parametrize(
    "a,b",
    fast_first(
        [
            ("float32", "float64"),
            ("int32", "float64"),
            ("float16", "float64"),  # double -> half goes through float32 (codegen/lower.py)
            ("int8", "int64"),
            ("bool", "int64"),
            ("float32", "int64"),
        ],
        unpack=True,
    ),
)
def test_promotion_0d(a, b):
    """torch: a 0-d tensor only decides the dtype when it is of a higher kind than the dimensioned one"""
    x, y = data((2, 3), a, 0, 5, seed=14), data((), b, 1, 5, seed=15)
    check(lambda p, q: p + q, lambda p, q: p + q, V(x), V(y), grad=False, atol=1e-2)
    check(lambda p, q: q * p, lambda p, q: q * p, V(x), V(y), grad=False, atol=1e-2)


@pytest.mark.parametrize(
    "dtype,scalar,expected",  # expected: the result dtype numpy's check expects (None: torch only)
    fast_first(
        [
            ("bool", 3, None),
            ("bool", 2.5, None),
            ("int8", 3, "int8"),
            ("uint8", 2, "uint8"),
            ("uint8", 1.5, "float32"),
            ("float16", 2.5, "float16"),
            ("int64", 2, "int64"),
            ("float64", 0.5, "float64"),
            ("int32", True, None),
        ],
        unpack=True,
    ),
)
def test_promotion_python_scalar(dtype, scalar, expected):
    x = data((5,), dtype, 0, 9, seed=16)
    check(lambda t: t + scalar, lambda t: t + scalar, V(x), grad=False, atol=1e-2)
    check(lambda t: scalar * t, lambda t: scalar * t, V(x), grad=False, atol=1e-2)
    if expected is not None:
        x = data((5,), dtype, 0, 9, seed=26)
        tol = tol_for(expected)
        check_numpy(Tensor(x) + scalar, (x.astype(np.float64) + scalar).astype(NP_OF[expected]), expected, **tol)
        check_numpy(scalar * Tensor(x), (x.astype(np.float64) * scalar).astype(NP_OF[expected]), expected, **tol)


@pytest.mark.parametrize("op", fast_first(["and", "or", "xor", "lshift", "rshift", "invert"]))
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


LOGICAL = {
    "not": (Tensor.logical_not, torch.logical_not),
    "and": (lambda x, y: x.logical_and(y), torch.logical_and),
    "or": (lambda x, y: x.logical_or(y), torch.logical_or),
    "xor": (lambda x, y: x.logical_xor(y), torch.logical_xor),
}


@pytest.mark.parametrize("op", fast_first(list(LOGICAL)))
def test_logical(op):
    a, b = data((3, 4), "bool", seed=19), data((3, 4), "bool", seed=20)
    check(*LOGICAL[op], V(a), *([V(b)] if op != "not" else []))


WHERE_SHAPES = [  # condition, x, y
    ((3, 4), (3, 4), (3, 4)),
    ((3, 1), (1, 4), ()),
    ((), (2, 3), (3,)),
    ((), (2, 3), (2, 3)),
    ((0, 2), (1, 2), (0, 1)),
    ((0, 4), (1, 4), (0, 1)),
]


@pytest.mark.parametrize("shapes", fast_first(WHERE_SHAPES))
def test_where(shapes):
    c, a, b = data(shapes[0], "bool", seed=21), data(shapes[1], seed=22), data(shapes[2], seed=23)
    check_numpy(Tensor(c).where(Tensor(a), Tensor(b)), np.where(c, a, b))
    check(lambda c, a, b: c.where(a, b), lambda c, a, b: torch.where(c, a, b), V(c), V(a), V(b))
    check(lambda c, a: c.where(a, 0.5), lambda c, a: torch.where(c, a, 0.5), V(c), V(a))
    check(lambda c, b: c.where(2, b), lambda c, b: torch.where(c, 2, b), V(c), V(b))
    check(lambda c: c.where(1.0, 0), lambda c: torch.where(c, 1.0, 0), V(c))


def test_where_int_dtypes():
    c, a, b = data((4,), "bool", seed=24), data((4,), "int32", -5, 5, seed=25), data((4,), "int64", -5, 5, seed=26)
    check(lambda c, a, b: c.where(a, b), lambda c, a, b: torch.where(c, a, b), V(c), V(a), V(b))
    check(lambda c, a: c.where(a, 7), lambda c, a: torch.where(c, a, 7), V(c), V(a))


@pytest.mark.parametrize("lo,hi", fast_first([(-0.5, 1.0), (None, 0.3), (-0.2, None), (1.0, -1.0)], unpack=True))
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


@pytest.mark.slow
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


@pytest.mark.parametrize("op", fast_first(["iadd", "isub", "imul", "itruediv", "ipow", "imod", "ifloordiv"]))
def test_inplace_float(op):
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


@pytest.mark.parametrize("op", fast_first(["iand", "ior", "ixor", "ilshift", "irshift", "iadd", "imul", "isub"]))
def test_inplace_int(op):
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


CASTS = [  # src, dst, the data's range
    ("float32", "int32", -100, 100),  # truncation toward zero
    ("float32", "int64", -100, 100),
    ("float32", "int8", -100, 100),
    ("float32", "uint8", 0, 250),
    ("float32", "bool", -2, 2),
    ("float32", "float16", -100, 100),
    ("int32", "float32", -1000, 1000),
    ("int32", "int8", -100, 100),
    ("int32", "bool", -2, 2),
    ("int64", "float16", -100, 100),
    ("bool", "float32", 0, 1),
    ("uint8", "int32", 0, 255),
    ("uint8", "int64", 0, 100),
    ("float16", "float32", -10, 10),
    ("float64", "float32", -10, 10),
    ("int8", "uint8", 0, 127),
]


@pytest.mark.parametrize("src,dst,lo,hi", fast_first(CASTS, unpack=True))
def test_cast(src, dst, lo, hi):
    x = data((4, 6), src, lo, hi, seed=12)
    check_numpy(Tensor(x).cast(ZEPTO_OF[dst]), x.astype(NP_OF[dst]), dst, rtol=1e-3 if dst == "float16" else 1e-5)
    check(lambda t: t.cast(ZEPTO_OF[dst]), lambda t: t.to(TORCH_OF[dst]), V(x), grad=False)


def test_cast_grad():
    x = data((3, 4), seed=42)
    check(lambda t: t.double() * 2, lambda t: t.double() * 2, V(x))
    check(lambda t: t.half().float() * 2, lambda t: t.half().float() * 2, V(x), atol=2e-3)


SHORTHANDS = {"float": "float32", "half": "float16", "double": "float64", "int": "int32", "long": "int64"}
SHORTHANDS |= {"short": "int16", "bool": "bool"}


@pytest.mark.parametrize("name", fast_first(list(SHORTHANDS)))
def test_cast_shorthand(name):
    check(lambda v: getattr(v, name)(), lambda v: getattr(v, name)(), V(data((3, 4), seed=42)), grad=False, atol=2e-3)
    x = data((2, 3), "float32", -5, 5, seed=13)
    check_numpy(getattr(Tensor(x), name)(), x.astype(NP_OF[SHORTHANDS[name]]), SHORTHANDS[name], rtol=1e-3)


def test_cast_int_then_float():
    x = data((2, 3), "float32", -5, 5, seed=13)
    check_numpy(Tensor(x).int().float(), x.astype(np.int32).astype(np.float32), "float32")


@pytest.mark.parametrize(
    "src,dst",
    fast_first(
        [("float32", "int32"), ("int32", "float32"), ("int16", "uint16"), ("float16", "int16"), ("int64", "float64")],
        unpack=True,
    ),
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


# ======================================================= numpy: what the torch cases above do not cover

NP_UNARY = {
    # name: (fn, numpy fn, (lo, hi) domain, transcendental)
    "neg": (lambda t: -t, np.negative, (-3, 3), False),
    "neg_method": (lambda t: t.neg(), np.negative, (-3, 3), False),
    "relu": (lambda t: t.relu(), lambda x: np.maximum(x, 0), (-3, 3), False),
    "reciprocal": (lambda t: t.reciprocal(), np.reciprocal, (0.2, 4), False),
    "sqrt": (lambda t: t.sqrt(), np.sqrt, (0.0, 9), True),
    "exp": (lambda t: t.exp(), np.exp, (-5, 5), True),
    "exp2": (lambda t: t.exp2(), np.exp2, (-6, 6), True),
    "log": (lambda t: t.log(), np.log, (0.05, 20), True),
    "log2": (lambda t: t.log2(), np.log2, (0.05, 20), True),
    "sin": (lambda t: t.sin(), np.sin, (-7, 7), True),
}


def _unary_numpy(op, shape):
    """float32 data of `shape` from the op's (wider) numpy domain against numpy's float64 result rounded"""
    fn, npfn, (lo, hi), trans = NP_UNARY[op]
    x = data(shape, "float32", lo, hi, seed=9)
    expected = npfn(x.astype(np.float64)).astype(np.float32)
    atol = 1e-5 if op == "sin" else 1e-6  # sin: float32 argument rounding at |x|~7
    check_numpy(fn(Tensor(x)), expected, "float32", rtol=1e-4 if trans else 1e-5, atol=atol)


# the cases test_unary (2-D) and test_unary_shapes (0-d, empty) do not run with numpy already
UNARY_NUMPY_CASES = (
    [(op, (4, 6)) for op in NP_UNARY if op not in UNARY]
    + [(op, (5,)) for op in NP_UNARY]
    + [(op, ()) for op in NP_UNARY if op not in EDGE_OPS]
    + [(op, (2, 0, 4)) for op in ("neg", "log2", "relu")]
)


@pytest.mark.parametrize("op,shape", fast_first(UNARY_NUMPY_CASES, unpack=True))
def test_unary_numpy(op, shape):
    _unary_numpy(op, shape)


def _unary_other_float_numpy(op, dtype):
    fn, npfn, (lo, hi), trans = NP_UNARY[op]
    x = data((4, 3), dtype, lo, min(hi, 5), seed=10)
    expected = npfn(x.astype(np.float64)).astype(NP_OF[dtype])
    tol = tol_for(dtype, trans) if dtype == "float16" else dict(rtol=1e-4 if trans else 1e-5, atol=1e-6)
    check_numpy(fn(Tensor(x)), expected, dtype, **tol)


@pytest.mark.parametrize("op", ["neg", "log2"])  # exp, sqrt, sin: in test_unary_dtypes
@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_unary_other_floats(op, dtype):
    _unary_other_float_numpy(op, dtype)


@pytest.mark.parametrize("dtype", ["int32", "int64", "int8"])
def test_unary_int(dtype):
    x = data((3, 4), dtype, lo=-50, hi=50, seed=11)
    check_numpy(-Tensor(x), -x, dtype)
    check_numpy(Tensor(x).relu(), np.maximum(x, 0), dtype)


def test_cast_bfloat16_roundtrip():
    x = np.array([1.0, -2.5, 0.15625, 96.0, 0.0], dtype=np.float32)  # exactly representable in bf16
    t = Tensor(x).cast(dtypes.bfloat16)
    assert t.dtype == dtypes.bfloat16
    check_numpy(t.float(), x, "float32", rtol=0, atol=0)
    check_numpy((t + t).cast(dtypes.float32), x * 2, "float32", rtol=0, atol=0)


NP_BINARY = {
    "add": (operator.add, np.add),
    "sub": (operator.sub, np.subtract),
    "mul": (operator.mul, np.multiply),
    "div": (operator.truediv, None),
    "maximum": (lambda a, b: a.maximum(b), np.maximum),
    "minimum": (lambda a, b: a.minimum(b), np.minimum),
    "lt": (operator.lt, np.less),
    "le": (operator.le, np.less_equal),
    "gt": (operator.gt, np.greater),
    "ge": (operator.ge, np.greater_equal),
    "eq": (operator.eq, np.equal),
    "ne": (operator.ne, np.not_equal),
}
CMP = {"lt", "le", "gt", "ge", "eq", "ne"}


def binary_expected(op, x, y, dtype):
    """expected result and dtype name of a binary op on arrays of dtype name `dtype`"""
    if op in CMP:
        return NP_BINARY[op][1](x, y), "bool"
    if op == "div":
        out = "float32" if not np.issubdtype(NP_OF[dtype], np.floating) else dtype
        return (x.astype(np.float64) / y.astype(np.float64)).astype(NP_OF[out]), out
    return NP_BINARY[op][1](x, y).astype(NP_OF[dtype]), dtype


def _binary_numpy(op, dtype):
    # small integer-valued data so that == and != have both outcomes
    x = data((3, 4), dtype, -4, 4, seed=14)
    y = data((3, 4), dtype, -4, 4, seed=15, avoid_zero=(op == "div"))
    if dtype == "float32":
        x, y = np.round(x), np.round(y)
    if op == "div":
        y = np.where(y == 0, 1, y).astype(y.dtype)
    expected, edt = binary_expected(op, x, y, dtype)
    check_numpy(NP_BINARY[op][0](Tensor(x), Tensor(y)), expected, edt)


@pytest.mark.parametrize("op", fast_first(["le", "gt", "ge", "ne"]))  # the rest: in test_binary and test_binary_int
def test_binary_cmp_int32(op):
    _binary_numpy(op, "int32")


def _binary_shape_numpy(op, shape):
    x = data(shape, seed=16)
    y = data(shape, seed=17, avoid_zero=True)
    expected, edt = binary_expected(op, x, y, "float32")
    check_numpy(NP_BINARY[op][0](Tensor(x), Tensor(y)), expected, edt)


@pytest.mark.parametrize(
    "shape", fast_first([(7,), (0, 3), (2, 0, 4), (2, 3, 4), (4, 8)])
)  # 0-d: in test_binary_shapes
@pytest.mark.parametrize("op", ["add", "div", "maximum", "lt"])
def test_binary_shapes_numpy(op, shape):
    _binary_shape_numpy(op, shape)


def _binary_other_dtype_numpy(op, dtype):
    x = data((3, 8), dtype, 0, 10, seed=18)
    y = data((3, 8), dtype, 0, 10, seed=19)
    expected, edt = binary_expected(op, x, y, dtype)
    check_numpy(NP_BINARY[op][0](Tensor(x), Tensor(y)), expected, edt, **tol_for(dtype))


@pytest.mark.parametrize("dtype", ["float16", "float64", "uint8"])  # int8, int64: in test_binary_int
@pytest.mark.parametrize("op", ["add", "mul", "maximum"])
def test_binary_other_dtypes(op, dtype):
    _binary_other_dtype_numpy(op, dtype)


@pytest.mark.parametrize(
    "sx,sy",
    fast_first(
        [
            ((3, 1), (1, 4)),
            ((4,), (2, 3, 4)),
            ((2, 3, 4), (3, 1)),
            ((), (2, 3)),
            ((2, 3), ()),
            ((1,), (5,)),
            ((0, 1), (1, 4)),
            ((2, 1, 3), (2, 4, 1)),
        ],
        unpack=True,
    ),
)
@pytest.mark.parametrize("op", ["add", "gt"])
def test_broadcast(op, sx, sy):
    x = data(sx, seed=20)
    y = data(sy, seed=21)
    expected, edt = binary_expected(op, x, y, "float32")
    check_numpy(NP_BINARY[op][0](Tensor(x), Tensor(y)), expected, edt)


@pytest.mark.parametrize(
    "fn,npfn,edt",
    fast_first(
        [
            (lambda t: 3 * t, lambda x: 3 * x, None),
            (lambda t: 3 / t, lambda x: 3 / x, None),
            (lambda t: t / 4, lambda x: x / 4, None),
            (lambda t: t > 0, lambda x: x > 0, "bool"),
            (lambda t: 0 < t, lambda x: 0 < x, "bool"),
            (lambda t: t == 1.0, lambda x: x == 1.0, "bool"),
            (lambda t: t.maximum(0.5), lambda x: np.maximum(x, 0.5), None),
        ],
        unpack=True,
    ),
)
def test_python_scalar_float(fn, npfn, edt):
    x = np.round(data((3, 4), seed=22) * 2) / 2  # half-integers, so == 1.0 hits
    x = np.where(x == 0, 1.0, x).astype(np.float32)
    e = npfn(x.astype(np.float64))
    check_numpy(fn(Tensor(x)), e.astype(np.bool_ if edt == "bool" else np.float32), edt or "float32")


@pytest.mark.parametrize(
    "fn,npfn,edt",
    fast_first(
        [
            (lambda t: t + 1, lambda x: x + 1, "int32"),
            (lambda t: 2 * t, lambda x: 2 * x, "int32"),
            (lambda t: 10 - t, lambda x: 10 - x, "int32"),
            (lambda t: t + 1.5, lambda x: x + 1.5, "float32"),  # int32 + python float -> float32
            (lambda t: t * 0.5, lambda x: x * 0.5, "float32"),
            (lambda t: t / 2, lambda x: x / 2, "float32"),  # true division
            (lambda t: 3 / t, lambda x: 3 / x, "float32"),
            (lambda t: t >= 2, lambda x: x >= 2, "bool"),
            (lambda t: t != 3, lambda x: x != 3, "bool"),
        ],
        unpack=True,
    ),
)
def test_python_scalar_int(fn, npfn, edt):
    x = data((2, 5), "int32", -6, 6, seed=23, avoid_zero=True)
    e = npfn(x.astype(np.float64) if edt == "float32" else x.astype(np.int64))
    check_numpy(fn(Tensor(x)), e.astype(NP_OF[edt]), edt)


def test_python_scalar_on_0d():
    t = Tensor(4.0)
    check_numpy(2 + t, np.array(6.0, np.float32))
    check_numpy(t - 1.5, np.array(2.5, np.float32))
    check_numpy(3 / t, np.array(0.75, np.float32))
    check_numpy(Tensor(3) * 2, np.array(6, np.int32))


def test_where_scalars_and_dtypes():
    x = data((3, 4), seed=30)
    t = Tensor(x)
    check_numpy((t > 0).where(t, 0.0), np.where(x > 0, x, 0.0).astype(np.float32))
    check_numpy((t > 0).where(1.5, t), np.where(x > 0, 1.5, x).astype(np.float32))
    xi = data((3, 4), "int32", -5, 5, seed=31)
    ti = Tensor(xi)
    check_numpy((ti < 0).where(-ti, ti), np.abs(xi), "int32")
    check_numpy((ti < 0).where(ti, 100), np.where(xi < 0, xi, 100).astype(np.int32), "int32")


def test_bool_ops():
    a = data((4, 4), "bool", seed=32)
    b = data((4, 4), "bool", seed=33)
    check_numpy(Tensor(a) == Tensor(b), a == b, "bool")
    check_numpy(Tensor(a) != Tensor(b), a != b, "bool")
    check_numpy(Tensor(a).where(Tensor(b), False), a & b, "bool")


def test_maximum_promotes():
    xi = np.array([1, -2, 3], dtype=np.int32)
    xf = np.array([0.5, -2.5, 3.5], dtype=np.float32)
    check_numpy(Tensor(xi).maximum(Tensor(xf)), np.maximum(xi, xf).astype(np.float32), "float32")
    check_numpy(Tensor(xi).minimum(0.5), np.minimum(xi, 0.5).astype(np.float32), "float32")


def test_nan_inf_propagation():
    x = np.array([1.0, 0.0, -1.0], dtype=np.float32)
    with np.errstate(divide="ignore"):
        check_numpy(1.0 / Tensor(x), np.array([1.0, np.inf, -1.0], np.float32))
    with np.errstate(invalid="ignore", divide="ignore"):
        out = Tensor(x).log().numpy()
    assert out[0] == 0.0 and out[1] == -np.inf and np.isnan(out[2])


# ----------------------------------------------------------------------------- non-contiguous views feeding ops


def _views():
    x = data((4, 6), seed=40)
    y = data((6, 4), seed=41)
    return x, y


VIEWS = {
    "permute": (lambda t: t.permute(1, 0), lambda x: x.T),
    "shrink": (lambda t: t.shrink(((1, 4), (2, 6))), lambda x: x[1:4, 2:6]),
    "slice_step": (lambda t: t[::2, 1::2], lambda x: x[::2, 1::2]),
    "flip": (lambda t: t.flip(0), lambda x: x[::-1]),
    "flip_both": (lambda t: t.flip((0, 1)), lambda x: x[::-1, ::-1]),
    "expand": (lambda t: t[:, 0:1].expand(4, 5), lambda x: np.broadcast_to(x[:, 0:1], (4, 5))),
    "pad": (lambda t: t.pad(((1, 1), (0, 2))), lambda x: np.pad(x, ((1, 1), (0, 2)))),
    "perm_shrink_flip": (lambda t: t.permute(1, 0).shrink(((1, 5), None)).flip(1), lambda x: x.T[1:5][:, ::-1]),
}


@pytest.mark.parametrize("view", fast_first(list(VIEWS)))
def test_views_into_ops(view):
    x, _ = _views()
    base = Tensor(x)
    if list(VIEWS).index(view) % 2:
        base = (base + 0).realize()  # half of them view a computed buffer
    v = VIEWS[view][0](base)
    xv = VIEWS[view][1](x)
    check_numpy(v, xv)
    check_numpy(v * 2 + 1, xv * 2 + 1)
    check_numpy(v.exp(), np.exp(xv.astype(np.float64)).astype(np.float32), rtol=1e-4)
    check_numpy(v.sum(axis=0), xv.sum(axis=0, dtype=np.float64).astype(np.float32))
    check_numpy(v.max(), np.array(xv.max()))


def test_views_binary_mixed():
    x, y = _views()
    a, b = Tensor(x), Tensor(y)
    # permuted + contiguous
    check_numpy(b.permute(1, 0) + a, y.T + x)
    # flipped * shrunk
    check_numpy(a.flip(1)[:, :4] * b[:4], x[:, ::-1][:, :4] * y[:4])
    # expanded compared to permuted
    check_numpy(a[:, :1].expand(4, 6) < b.T, np.broadcast_to(x[:, :1], (4, 6)) < y.T, "bool")
    # where over views
    check_numpy((a.flip(0) > 0).where(b.T, a.flip(0)), np.where(x[::-1] > 0, y.T, x[::-1]))


def test_views_of_computed_tensor():
    x, y = _views()
    c = Tensor(x) * 3 - 1  # lazy, unrealized
    xc = x * 3 - 1
    check_numpy(c.permute(1, 0).flip(0)[1:5], xc.T[::-1][1:5])
    c2 = (Tensor(x) + 1).realize()
    check_numpy(c2.T.reshape(4, 6), (x + 1).T.reshape(4, 6))
    check_numpy((c2.T[2:4] + Tensor(y)[2:4]).sum(axis=1), ((x + 1).T[2:4] + y[2:4]).sum(axis=1))


def test_view_of_view_int():
    x = data((3, 4, 5), "int32", -100, 100, seed=42)
    t = Tensor(x).permute(2, 0, 1)[1:4].flip(2).reshape(3, 12)[:, ::3]
    e = x.transpose(2, 0, 1)[1:4][:, :, ::-1].reshape(3, 12)[:, ::3]
    check_numpy(t, e, "int32")
    check_numpy(t.max(axis=1), e.max(axis=1), "int32")
    np.testing.assert_array_equal(t.sum(axis=0).numpy(), e.sum(axis=0))


def test_casts_between_half_and_double_or_int():
    # LLVM's direct conversions are compiler-rt calls a JIT'd kernel can't reach: codegen routes them via float32
    np.testing.assert_array_equal(Tensor(np.full(3, 1.5)).half().numpy(), np.full(3, 1.5, np.float16))
    np.testing.assert_array_equal(Tensor(np.full(3, 2.5, np.float16)).double().numpy(), np.full(3, 2.5))
    np.testing.assert_array_equal(Tensor(np.arange(3)).half().numpy(), np.arange(3, dtype=np.float16))
    np.testing.assert_array_equal(Tensor(np.full(3, 3, np.float16)).cast(dtypes.int64).numpy(), np.full(3, 3))


def test_int_division_by_a_vectorized_tensor():
    # the zero-divisor guard once rewrote its own vector output forever
    an = np.arange(-16, 16, dtype=np.int32)
    bn = np.array([3, -2, 5, 7] * 8, np.int32)
    np.testing.assert_array_equal((Tensor(an) // Tensor(bn)).numpy(), an // bn)
    np.testing.assert_array_equal((Tensor(an) % Tensor(bn)).numpy(), an % bn)


@pytest.mark.parametrize(
    "dtype, scalar",
    [(dtypes.float32, 2.5), (dtypes.int32, 2.5), (dtypes.int32, 3), (dtypes.bool, 1), (dtypes.bool, True)],
)
def test_python_scalar_operand_builds_a_broadcast_constant(dtype, scalar, monkeypatch):
    """A Python number beside a tensor is its constant broadcast to the tensor's shape: the very nodes a 0-d tensor of
    it gives (promoted as torch's weak scalars), built without the Tensors between (a 0-d one, its reshape and
    expand)."""
    from zeptograd.engine.realize import tensor_clock
    from zeptograd.tensor.elementwise import scalar_dtype
    from zeptograd.uop import variable

    monkeypatch.setattr(variable, "in_use", False)  # (no Variable here: another test may have bound one)

    t = Tensor(np.arange(6).reshape(2, 3)).cast(dtype)
    as_0d = Tensor(scalar, dtype=scalar_dtype(scalar, dtype))
    for fn in (lambda a, b: a + b, lambda a, b: b - a if dtype != dtypes.bool else b * a):
        before = tensor_clock()
        got = fn(t, scalar)
        made = tensor_clock() - before - 1  # (every Tensor made takes a number of that clock, as the call does)
        assert got.uop is fn(t, as_0d).uop
        assert made == (2 if scalar_dtype(scalar, dtype) == dtype else 3)  # the constant's, the result (a cast)


def test_broadcast_operands_are_the_checked_broadcast():
    """Operands of different shapes are broadcast without reshape's and expand's checks: the same nodes."""
    a, b = Tensor(np.ones((4, 1, 3), np.float32)), Tensor(np.ones((5, 1), np.float32))
    s = (a + b).uop
    assert s.src[0] is a._broadcast_to((4, 5, 3)).uop and s.src[1] is b._broadcast_to((4, 5, 3)).uop
    z = Tensor(np.float32(2.0))  # a 0-d tensor
    assert (z * a).uop.src[0] is z._broadcast_to((4, 1, 3)).uop


def test_relu_zero_signs_and_gradient_match_torch():
    vals = [-1.0, -0.0, 0.0, 1.0, float("nan"), -float("inf")]
    x = Tensor(vals, requires_grad=True)
    y = x.relu()
    y.sum().backward()
    tx = torch.tensor(vals, requires_grad=True)
    ty = torch.relu(tx)
    ty.sum().backward()
    z, t = y.numpy(), ty.detach().numpy()
    np.testing.assert_array_equal(z, t)  # nan equal to nan
    np.testing.assert_array_equal(x.grad.numpy(), tx.grad.numpy())  # 0 at both zeros, nan passes the gradient
    np.testing.assert_array_equal(np.signbit(z), np.signbit(t))  # relu(-0.0) is -0.0, as torch's
