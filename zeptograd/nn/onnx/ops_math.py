"""Elementwise, cast and reduction ops."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from zeptograd.dtype import dtypes
from zeptograd.tensor import Tensor

from . import EMULATED, ONNX_DTYPES, STRING, Node, np_dtype, to_emulated, value_to_tensor
from .oputil import _np, axis_of, const, ints, is_float, op

# ***** elementwise *****


def _binary(fn):
    def impl(r, node, a, b):
        out = fn(a, b, node)
        return out

    return impl


op("Add")(_binary(lambda a, b, n: a + b))
op("Sub")(_binary(lambda a, b, n: a - b))
op("Mul")(_binary(lambda a, b, n: a * b))


def _div(r, node, a, b):
    if dtypes.is_int(a.dtype):
        return a.div(b, rounding_mode="trunc")
    return a / b


def _pow(r, node, a, b):
    if not is_float(a) and not is_float(b):
        return a.cast(dtypes.float64).pow(b.cast(dtypes.float64)).round().cast(a.dtype)
    return a.pow(b.cast(a.dtype) if is_float(a) else b).cast(a.dtype)


def _mod(r, node, a, b):
    if node.attr("fmod", 0):
        return a.fmod(b)
    if dtypes.is_int(a.dtype):
        return a.mod(b)
    # numpy's float mod: the sign of the divisor, x mod ±inf is x or ±inf, a zero result takes the divisor's sign
    r_ = (b.isinf() & a.isfinite()).where(a, a - b * (a / b).trunc())
    r_ = ((r_ != 0) & ((r_ < 0) != (b < 0))).where(r_ + b, r_)
    return (r_ == 0).where(const(0, a.dtype).copysign(b), r_)


def _bitshift(r, node, a, b):
    d = node.attr("direction", choices=("LEFT", "RIGHT"))
    bits = 8 * a.dtype.itemsize
    bb = b.cast(a.dtype)
    out_of_range = (bb < 0) | (bb >= bits) if not dtypes.is_unsigned(a.dtype) else bb >= bits
    safe = out_of_range.where(0, bb)
    if d == "LEFT":
        return out_of_range.where(0, a.lshift(safe))
    overflow = (a < 0).where(-1, 0).cast(a.dtype) if not dtypes.is_unsigned(a.dtype) else const(0, a.dtype)
    return out_of_range.where(overflow, a.rshift(safe))


for _name, _fn in {
    "Equal": lambda a, b: a == b, "Less": lambda a, b: a < b, "LessOrEqual": lambda a, b: a <= b,
    "Greater": lambda a, b: a > b, "GreaterOrEqual": lambda a, b: a >= b,
    "And": lambda a, b: a.logical_and(b), "Or": lambda a, b: a.logical_or(b), "Xor": lambda a, b: a.logical_xor(b),
    "BitwiseAnd": lambda a, b: a.bitwise_and(b), "BitwiseOr": lambda a, b: a.bitwise_or(b),
    "BitwiseXor": lambda a, b: a.bitwise_xor(b),
}.items():  # fmt: skip
    op(_name)(functools.partial(lambda fn, r, node, a, b: fn(a, b), _fn))


def _equal(r, node, a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):  # strings
        return Tensor(np.asarray(np.asarray(a) == np.asarray(b)))
    return a == b


def _not(r, node, x):
    return x.logical_not()


def _bitwise_not(r, node, x):
    return x.bitwise_not()


def _variadic(fn):
    def impl(r, node, *xs):
        return functools.reduce(fn, xs)

    return impl


op("Max")(_variadic(lambda a, b: a.maximum(b)))
op("Min")(_variadic(lambda a, b: a.minimum(b)))
op("Sum")(_variadic(lambda a, b: a + b))


def _mean(r, node, *xs):
    return functools.reduce(lambda a, b: a + b, xs) / len(xs)


_UNARY: dict[str, Callable[..., Any]] = {
    "Abs": Tensor.abs, "Neg": Tensor.neg, "Exp": Tensor.exp, "Log": Tensor.log, "Sqrt": Tensor.sqrt,
    "Reciprocal": Tensor.reciprocal, "Floor": Tensor.floor, "Ceil": Tensor.ceil, "Round": Tensor.round,
    "Sign": Tensor.sign, "Sin": Tensor.sin, "Cos": Tensor.cos, "Tan": Tensor.tan, "Asin": Tensor.asin,
    "Acos": Tensor.acos, "Atan": Tensor.atan, "Sinh": Tensor.sinh, "Cosh": Tensor.cosh, "Tanh": Tensor.tanh,
    "Asinh": Tensor.asinh, "Acosh": Tensor.acosh, "Atanh": Tensor.atanh, "Erf": Tensor.erf,
    "Sigmoid": Tensor.sigmoid, "Relu": Tensor.relu, "IsNaN": Tensor.isnan, "Softsign": Tensor.softsign,
    "Mish": Tensor.mish, "HardSwish": Tensor.hardswish,
}  # fmt: skip
for _name, _fn in _UNARY.items():
    op(_name)(functools.partial(lambda fn, r, node, x: fn(x), _fn))


def _softplus(r, node, x):
    return (x.maximum(0) + (-x.abs()).exp().add(1).log()).cast(x.dtype)


def _isinf(r, node, x):
    neg, pos = node.attr("detect_negative", 1), node.attr("detect_positive", 1)
    return ((x == math.inf) & bool(pos)) | ((x == -math.inf) & bool(neg))


def _hardsigmoid(r, node, x):
    return (x * node.attr("alpha", 0.2) + node.attr("beta", 0.5)).clip(0, 1)


def _leaky(r, node, x):
    return x.leaky_relu(node.attr("alpha", 0.01))


def _elu(r, node, x):
    a = node.attr("alpha", 1.0)
    return (x > 0).where(x, (x.exp() - 1) * a)


def _celu(r, node, x):
    a = node.attr("alpha", 1.0)
    return x.maximum(0) + ((x / a).exp() - 1).mul(a).minimum(0)


def _selu(r, node, x):
    a, g = node.attr("alpha", 1.67326319217681884765625), node.attr("gamma", 1.05070102214813232421875)
    return (x > 0).where(x * g, (x.exp() * a - a) * g)


def _thresholded(r, node, x):
    return (x > node.attr("alpha", 1.0)).where(x, 0)


def _gelu(r, node, x):
    if node.attr("approximate", "none", choices=("none", "tanh")) == "tanh":
        return x * 0.5 * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())
    return x * 0.5 * (1 + (x / math.sqrt(2)).erf())


def _swish(r, node, x):
    return x * (x * node.attr("alpha", 1.0)).sigmoid()


def _shrink(r, node, x):
    b, l_ = node.attr("bias", 0.0), node.attr("lambd", 0.5)
    return (x < -l_).where(x + b, (x > l_).where(x - b, 0)).cast(x.dtype)


def _prelu(r, node, x, slope):
    return (x < 0).where(x * slope, x)


def _clip(r, node, x, lo=None, hi=None):
    if node.opset < 11:
        lo, hi = node.attr("min", None), node.attr("max", None)
    if lo is not None:
        x = x.maximum(lo if not isinstance(lo, Tensor) else lo.cast(x.dtype))
    if hi is not None:
        x = x.minimum(hi if not isinstance(hi, Tensor) else hi.cast(x.dtype))
    return x


def _where(r, node, c, a, b):
    return c.where(a, b)


def _identity(r, node, x):
    return x


# ***** casts *****

_FLOAT8_MAX = {17: 448.0, 18: 240.0, 19: 57344.0, 20: 57344.0, 23: 6.0}


def cast_to(x: Any, to: int, node: Node, saturate: int = 1) -> Any:
    if to == STRING:
        arr = x.numpy() if isinstance(x, Tensor) else np.asarray(x)
        if arr.dtype.kind == "f":
            return np.vectorize(lambda v: _float_str(v, arr.dtype), otypes=[object])(arr)
        return arr.astype(str).astype(object)
    if isinstance(x, np.ndarray) and x.dtype == object:  # from strings
        target = np_dtype(to) if to not in EMULATED else np.float32
        arr = x.astype(str).astype(
            np.float64 if to not in ONNX_DTYPES or dtypes.is_float(ONNX_DTYPES[to]) else np.int64
        )
        return value_to_tensor(arr.astype(target)) if to not in EMULATED else to_emulated(arr, to)
    if to in EMULATED:
        if to in _FLOAT8_MAX and saturate and is_float(x):
            m = _FLOAT8_MAX[to]
            x = x.isnan().where(x, x.clip(-m, m))
        if to == 24:  # float8e8m0: a power of two; round_mode up (default), down or nearest
            return _to_e8m0(x, node)
        if to in (18, 20) and is_float(x):  # fnuz formats have no negative zero and no inf: -0 is +0
            x = (x == 0).where(0, x)
        return to_emulated(x, to)
    dt = ONNX_DTYPES.get(to)
    if dt is None:
        raise node.fail(f"attribute to={to} names an unsupported type", unsupported=True)
    if is_float(x) and dtypes.is_int(dt):  # float -> int truncates; the out-of-range values are undefined in ONNX
        return x.trunc().cast(dt)
    return x.cast(dt)


def _float_str(v, dt) -> str:
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "INF" if v > 0 else "-INF"
    return str(np.float32(v)) if dt == np.float32 else str(v)


def _to_e8m0(x: Tensor, node: Node) -> np.ndarray:
    mode = node.attr("round_mode", "up", choices=("up", "down", "nearest"))
    arr = x.numpy().astype(np.float32)
    with np.errstate(all="ignore"):
        m, e = np.frexp(np.abs(arr))  # |x| = m * 2**e, m in [0.5, 1)
        e = e.astype(np.float64) - 1  # |x| = (2m) * 2**e with 2m in [1, 2)
        frac = 2 * m
        if mode == "up":
            e = np.where(frac > 1, e + 1, e)
        elif mode == "nearest":
            e = np.where(frac >= 1.5, e + 1, e)
        out = np.exp2(np.clip(e, -127, 127)).astype(np.float32)
        out = np.where(arr == 0, 2.0**-127, out)
        out = np.where(np.isnan(arr) | np.isinf(arr), np.nan, out)
    return out.astype(np_dtype(24))


def _cast(r, node, x):
    return cast_to(x, node.attr("to"), node, node.attr("saturate", 1))


def _castlike(r, node, x, like):
    to = node.out_types[0].elem_type if node.out_types and node.out_types[0] else None
    if to is None:
        to = next(k for k, v in ONNX_DTYPES.items() if v == like.dtype)
    return cast_to(x, to, node, node.attr("saturate", 1))


# ***** reductions *****


def _reduce_axes(node: Node, x: Tensor, axes_in) -> list[int] | None:
    """The axes to reduce, None for none (noop_with_empty_axes)."""
    if axes_in is not None:
        axes = ints(axes_in)
    else:
        axes = list(node.attrs.get("axes", []))
    if not axes:
        return None if node.attr("noop_with_empty_axes", 0) else list(range(x.ndim))
    return [axis_of(a, x.ndim, node) for a in axes]


def _reducer(fn):
    def impl(r, node, x, axes_in=None):
        axes = _reduce_axes(node, x, axes_in)
        keep = bool(node.attr("keepdims", 1))
        if axes is None:
            return fn(x, None, keep, True)
        return fn(x, tuple(axes), keep, False)

    return impl


def _empty_safe(x: Tensor, axes, keep, identity, fn):
    if any(x.shape[a] == 0 for a in axes):
        shape = (
            [1 if i in axes else s for i, s in enumerate(x.shape)]
            if keep
            else [s for i, s in enumerate(x.shape) if i not in axes]
        )
        return Tensor(np.full(shape, identity, _np(x.dtype)))
    return fn()


op("ReduceSum")(_reducer(lambda x, ax, k, noop: x if noop else x.sum(ax, keepdim=k).cast(x.dtype)))
op("ReduceMean")(_reducer(lambda x, ax, k, noop: x if noop else x.mean(ax, keepdim=k).cast(x.dtype)))
op("ReduceProd")(_reducer(lambda x, ax, k, noop: x if noop else x.prod(ax, keepdim=k).cast(x.dtype)))
op("ReduceMax")(_reducer(lambda x, ax, k, noop: x if noop else _empty_safe(
    x, ax, k, -np.inf if is_float(x) else dtypes.min(x.dtype), lambda: x.max(ax, keepdim=k))))  # fmt: skip
op("ReduceMin")(_reducer(lambda x, ax, k, noop: x if noop else _empty_safe(
    x, ax, k, np.inf if is_float(x) else dtypes.max(x.dtype), lambda: x.min(ax, keepdim=k))))  # fmt: skip
op("ReduceL1")(_reducer(lambda x, ax, k, noop: x.abs() if noop else x.abs().sum(ax, keepdim=k).cast(x.dtype)))
op("ReduceL2")(
    _reducer(
        lambda x, ax, k, noop: (
            x.abs()
            if noop
            else x.cast(dtypes.float64 if x.dtype == dtypes.float64 else dtypes.float32)
            .square()
            .sum(ax, keepdim=k)
            .sqrt()
            .cast(x.dtype)
        )
    )
)
op("ReduceSumSquare")(
    _reducer(lambda x, ax, k, noop: x.square() if noop else x.square().sum(ax, keepdim=k).cast(x.dtype))
)
op("ReduceLogSum")(_reducer(lambda x, ax, k, noop: x.log() if noop else x.sum(ax, keepdim=k).log().cast(x.dtype)))
op("ReduceLogSumExp")(_reducer(lambda x, ax, k, noop: x if noop else _empty_safe(
    x, ax, k, -np.inf, lambda: x.cast(dtypes.float64).logsumexp(ax, keepdim=k).cast(x.dtype))))  # fmt: skip


def _argmax(r, node, x):
    a = axis_of(node.attr("axis", 0), x.ndim, node)
    keep, last = bool(node.attr("keepdims", 1)), node.attr("select_last_index", 0)
    y = x if node.op_type == "ArgMax" else -x if is_float(x) or not dtypes.is_unsigned(x.dtype) else ~x
    if node.op_type == "ArgMin" and dtypes.is_int(x.dtype) and not dtypes.is_unsigned(x.dtype):
        y = -(x.cast(dtypes.int64))
    if last:
        idx = x.shape[a] - 1 - y.flip(a).argmax(a, keepdim=keep)
    else:
        idx = y.argmax(a, keepdim=keep)
    return idx.cast(dtypes.int64)


def _softmax_like(fn):
    def impl(r, node, x):
        if node.opset < 13:
            a = axis_of(node.attr("axis", 1), x.ndim, node)
            shape = x.shape
            y = fn(x.reshape(int(np.prod(shape[:a])), -1), -1)
            return y.reshape(shape)
        return fn(x, axis_of(node.attr("axis", -1), x.ndim, node))

    return impl


def _hardmax(x: Tensor, a: int) -> Tensor:
    idx = x.argmax(a, keepdim=True)
    shp = [1] * x.ndim
    shp[a] = x.shape[a]
    return (Tensor.arange(x.shape[a], dtype=dtypes.int64).reshape(shp) == idx).cast(x.dtype)


op("Softmax")(_softmax_like(lambda x, a: x.softmax(a)))
op("LogSoftmax")(_softmax_like(lambda x, a: x.log_softmax(a)))
op("Hardmax")(_softmax_like(_hardmax))


# ***** registered as (domain, op type) -> implementation *****

op("Div")(_div)
op("Pow")(_pow)
op("Mod")(_mod)
op("BitShift")(_bitshift)
op("Equal")(_equal)
op("Not")(_not)
op("BitwiseNot")(_bitwise_not)
op("Mean")(_mean)
op("Softplus")(_softplus)
op("IsInf")(_isinf)
op("HardSigmoid")(_hardsigmoid)
op("LeakyRelu")(_leaky)
op("Elu")(_elu)
op("Celu")(_celu)
op("Selu")(_selu)
op("ThresholdedRelu")(_thresholded)
op("Gelu")(_gelu)
op("Swish")(_swish)
op("Shrink")(_shrink)
op("PRelu")(_prelu)
op("Clip")(_clip)
op("Where")(_where)
op("Identity")(_identity)
op("Cast")(_cast)
op("CastLike")(_castlike)
op("ArgMax", "ArgMin")(_argmax)
