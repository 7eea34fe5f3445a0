"""The ONNX ops as zeptograd Tensor compositions. Each op is `fn(runner, node, *inputs)`; absent optional inputs are
None. Values that decide shapes (Reshape's shape, Slice's starts, TopK's k, ...) are read back to the host: ONNX
shapes are data, and each call builds its graph for the values it is given."""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import numpy as np

from zeptograd.dtype import DType, dtypes
from zeptograd.tensor import Tensor

from . import EMULATED, ONNX_DTYPES, STRING, Node, np_dtype, to_emulated, value_to_tensor

OPS: dict[tuple[str, str], Callable] = {}


def op(*names: str, domain: str = "ai.onnx"):
    def deco(fn):
        for n in names:
            OPS[(domain, n)] = fn
        return fn

    return deco


# ***** helpers *****


def ints(t: Any) -> list[int]:
    """A shape-like value (Tensor, numpy, list) as Python ints, read back to the host."""
    if t is None:
        return []
    if isinstance(t, Tensor):
        t = t.numpy()
    return [int(v) for v in np.asarray(t).reshape(-1)]


def floats(t: Any) -> list[float]:
    if isinstance(t, Tensor):
        t = t.numpy()
    return [float(v) for v in np.asarray(t).reshape(-1)]


def scalar(t: Any):
    if isinstance(t, Tensor):
        return t.numpy().reshape(-1)[0].item()
    return np.asarray(t).reshape(-1)[0].item()


def axis_of(a: int, ndim: int, node: Node) -> int:
    if not -max(ndim, 1) <= a < max(ndim, 1):
        raise node.fail(f"axis {a} is out of range for rank {ndim}")
    return a + ndim if a < 0 else a


def const(v, dt: DType, like: Tensor | None = None) -> Tensor:
    return Tensor(np.asarray(v, dtype=_np(dt)), device=like.device if like is not None else None)


def _np(dt: DType):
    return {
        dtypes.float32: np.float32, dtypes.float16: np.float16, dtypes.float64: np.float64, dtypes.int8: np.int8,
        dtypes.int16: np.int16, dtypes.int32: np.int32, dtypes.int64: np.int64, dtypes.uint8: np.uint8,
        dtypes.uint16: np.uint16, dtypes.uint32: np.uint32, dtypes.uint64: np.uint64, dtypes.bool: np.bool_,
    }[dt]  # fmt: skip


def broadcast_shape(*shapes) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))


def bexpand(x: Tensor, shape) -> Tensor:
    shape = tuple(shape)
    if x.shape == shape:
        return x
    return x.reshape((1,) * (len(shape) - x.ndim) + x.shape).expand(shape)


def is_float(t: Tensor) -> bool:
    return dtypes.is_float(t.dtype)


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


_UNARY = {
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


# ***** shapes and movement *****


def _shape(r, node, x):
    shape = list(x.shape)
    start, end = node.attr("start", 0), node.attr("end", None)
    return const(shape[slice(start, end)], dtypes.int64)


def _size(r, node, x):
    return const(int(np.prod(x.shape)), dtypes.int64)


def _reshape(r, node, x, shape=None):
    shape = ints(shape) if node.opset >= 5 else list(node.attr("shape"))
    if not node.attr("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def _flatten(r, node, x):
    a = node.attr("axis", 1)
    a = a + x.ndim if a < 0 else a
    return x.reshape(int(np.prod(x.shape[:a])), int(np.prod(x.shape[a:])))


def _squeeze(r, node, x, axes=None):
    axes = ints(axes) if node.opset >= 13 else node.attr("axes", [])
    if not axes:
        return x.reshape([s for s in x.shape if s != 1])
    axes = [axis_of(a, x.ndim, node) for a in axes]
    return x.reshape([s for i, s in enumerate(x.shape) if i not in axes])


def _unsqueeze(r, node, x, axes=None):
    axes = ints(axes) if node.opset >= 13 else node.attr("axes")
    n = x.ndim + len(axes)
    axes = sorted(axis_of(a, n, node) for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return x.reshape(shape)


def _transpose(r, node, x):
    perm = node.attr("perm", list(range(x.ndim))[::-1])
    return x.permute(perm)


def _concat(r, node, *xs):
    a = axis_of(node.attr("axis"), xs[0].ndim, node)
    xs = [x for x in xs if x.shape[a] != 0] or xs[:1]
    return xs[0].cat(*xs[1:], dim=a) if len(xs) > 1 else xs[0]


def _split(r, node, x, split=None):
    a = axis_of(node.attr("axis", 0), x.ndim, node)
    sizes = ints(split) if split is not None else node.attr("split", None) if node.opset < 13 else None
    if not sizes:
        n = node.attr("num_outputs", len(node.outputs))
        chunk = -(-x.shape[a] // n)
        sizes = [min(chunk, x.shape[a] - i * chunk) for i in range(n)]
    outs, start = [], 0
    for s in sizes:
        outs.append(x.shrink(tuple((start, start + s) if i == a else None for i in range(x.ndim))))
        start += s
    return tuple(outs)


def _slice_tensor(x: Tensor, starts, ends, axes, steps, node: Node) -> Tensor:
    sl = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = axis_of(a, x.ndim, node)
        n = x.shape[a]
        if st == 0:
            raise node.fail("a slice step is 0")
        s = s + n if s < 0 else s
        e = e + n if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), n), min(max(e, 0), n)
        else:
            s, e = min(max(s, -1), n - 1), min(max(e, -1), n - 1)
        sl[a] = slice(s, e if e >= 0 else None, st)
    if any(len(range(*s.indices(n))) == 0 for s, n in zip(sl, x.shape)):
        return Tensor(np.zeros([len(range(*s.indices(n))) for s, n in zip(sl, x.shape)], _np(x.dtype)))
    return x[tuple(sl)]


def _slice(r, node, x, starts=None, ends=None, axes=None, steps=None):
    if node.opset < 10:
        starts, ends = node.attr("starts"), node.attr("ends")
        axes = node.attr("axes", list(range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = ints(starts), ints(ends)
        axes = ints(axes) if axes is not None else list(range(len(starts)))
        steps = ints(steps) if steps is not None else [1] * len(starts)
    return _slice_tensor(x, starts, ends, axes, steps, node)


def _expand(r, node, x, shape):
    return bexpand(x, broadcast_shape(x.shape, ints(shape)))


def _tile(r, node, x, repeats):
    return x.repeat(ints(repeats)) if x.ndim else x


def _pad(r, node, x, pads=None, value=None, axes=None):
    mode = node.attr("mode", "constant", choices=("constant", "reflect", "edge", "wrap"))
    if node.opset < 11:
        pads, value = node.attr("pads", node.attr("paddings")), node.attr("value", 0.0)
    else:
        pads = ints(pads)
        value = scalar(value) if value is not None else 0
    axes_l = [axis_of(a, x.ndim, node) for a in ints(axes)] if axes is not None else list(range(x.ndim))
    n = len(axes_l)
    pairs: list[Any] = [None] * x.ndim
    for i, a in enumerate(axes_l):
        pairs[a] = (pads[i], pads[i + n])
    zmode = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}[mode]
    if zmode == "constant":
        return x.pad(pairs, value=value)
    return x.pad(pairs, mode=zmode)


def _constant_of_shape(r, node, shape):
    v = node.attr("value", np.zeros(1, np.float32))
    shape = ints(shape)
    if v.dtype.name in ("bfloat16",) or v.dtype == object:
        return np.full(shape, v.reshape(-1)[0], dtype=v.dtype)
    return Tensor(np.full(shape, v.reshape(-1)[0], dtype=v.dtype))


def _constant(r, node):
    for k in ("value", "sparse_value"):
        if k in node.attrs:
            v = node.attrs[k]
            if k == "sparse_value":
                from . import _sparse_to_dense

                v = _sparse_to_dense(v)
            if v.dtype.name in ("bfloat16",) or v.dtype == object or v.dtype.kind == "V":
                return v
            return value_to_tensor(v)
    for k, dt in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                  ("value_ints", np.int64)):  # fmt: skip
        if k in node.attrs:
            return Tensor(np.asarray(node.attrs[k], dt))
    for k in ("value_string", "value_strings"):
        if k in node.attrs:
            return np.asarray(node.attrs[k], dtype=object)
    raise node.fail("has no value attribute")


def _range(r, node, start, limit, delta):
    s, l_, d = scalar(start), scalar(limit), scalar(delta)
    n = max(int(math.ceil((l_ - s) / d)), 0)
    return (Tensor.arange(n, dtype=dtypes.float64 if is_float(start) else dtypes.int64) * d + s).cast(start.dtype)


def _norm_index(idx: Tensor, n: int) -> Tensor:
    idx = idx.cast(dtypes.int64)
    return (idx < 0).where(idx + n, idx)


def _gather(r, node, x, idx):
    a = axis_of(node.attr("axis", 0), x.ndim, node)
    idx = _norm_index(idx, x.shape[a])
    if idx.ndim == 0:
        return x[(slice(None),) * a + (idx.reshape(1),)].reshape(x.shape[:a] + x.shape[a + 1 :])
    flat = x[(slice(None),) * a + (idx.reshape(-1),)]
    return flat.reshape(x.shape[:a] + idx.shape + x.shape[a + 1 :])


def _gather_elements(r, node, x, idx):
    a = axis_of(node.attr("axis", 0), x.ndim, node)
    return x.gather(a, _norm_index(idx, x.shape[a]))


def _nd_flat_index(shape, idx: Tensor, b: int) -> tuple[Tensor, int]:
    """GatherND/ScatterND: indices (..., k) into shape[b:b+k] as one flat index over shape's first b+k dims."""
    k = idx.shape[-1]
    dims = shape[b : b + k]
    strides = [int(np.prod(dims[i + 1 :])) for i in range(k)]
    idx = idx.cast(dtypes.int64)
    idx = (idx < 0).where(idx + const(list(dims), dtypes.int64), idx)
    lin = (idx * const(strides, dtypes.int64)).sum(-1)
    if b:
        bsz = int(np.prod(dims))
        boff = Tensor.arange(int(np.prod(shape[:b])), dtype=dtypes.int64).reshape(*shape[:b], *[1] * (lin.ndim - b))
        lin = lin + boff * bsz
    return lin, int(np.prod(shape[: b + k]))


def _gather_nd(r, node, x, idx):
    b = node.attr("batch_dims", 0)
    k = idx.shape[-1]
    lin, n = _nd_flat_index(x.shape, idx, b)
    rest = x.shape[b + k :]
    flat = x.reshape(n, *rest)
    out = flat[lin.reshape(-1)]
    return out.reshape(*idx.shape[:-1], *rest)


def _scatter_nd(r, node, x, idx, upd):
    red = node.attr("reduction", "none", choices=("none", "add", "mul", "max", "min"))
    k = idx.shape[-1]
    lin, n = _nd_flat_index(x.shape, idx, 0)
    rest = x.shape[k:]
    m = int(np.prod(rest))
    flat = x.reshape(n, m)
    upd = upd.reshape(-1, m)
    lin = lin.reshape(-1, 1).expand(lin.numel(), m)
    return _scatter_elems(flat, 0, lin, upd, red).reshape(x.shape)


def _scatter_elems(x: Tensor, a: int, idx: Tensor, upd: Tensor, red: str) -> Tensor:
    if red == "none":
        return x.scatter(a, idx, upd)
    zred = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}[red]
    return x.scatter_reduce(a, idx, upd, zred)


def _scatter_elements(r, node, x, idx, upd):
    a = axis_of(node.attr("axis", 0), x.ndim, node)
    red = node.attr("reduction", "none", choices=("none", "add", "mul", "max", "min"))
    return _scatter_elems(x, a, _norm_index(idx, x.shape[a]), upd, red)


def _eyelike(r, node, x):
    k = node.attr("k", 0)
    dt = ONNX_DTYPES[node.attr("dtype")] if "dtype" in node.attrs else x.dtype
    n, m = x.shape
    return Tensor(np.eye(n, m, k, dtype=_np(dt)))


def _trilu(r, node, x, k=None):
    k = scalar(k) if k is not None else 0
    n, m = x.shape[-2:]
    row = Tensor.arange(n, dtype=dtypes.int64).reshape(n, 1)
    col = Tensor.arange(m, dtype=dtypes.int64).reshape(1, m)
    keep = (col - row >= k) if node.attr("upper", 1) else (col - row <= k)
    return keep.where(x, const(0, x.dtype))


def _onehot(r, node, idx, depth, values):
    d = int(scalar(depth))
    a = node.attr("axis", -1)
    a = a + idx.ndim + 1 if a < 0 else a
    idx = idx.cast(dtypes.int64)
    idx = (idx < 0).where(idx + d, idx)
    shape = list(idx.shape)
    shape.insert(a, 1)
    rng_shape = [1] * (idx.ndim + 1)
    rng_shape[a] = d
    hot = idx.reshape(shape) == Tensor.arange(d, dtype=dtypes.int64).reshape(rng_shape)
    return hot.where(values[1], values[0])


def _depth_to_space(r, node, x):
    b_, mode = node.attr("blocksize"), node.attr("mode", "DCR", choices=("DCR", "CRD"))
    n, c, h, w = x.shape
    if mode == "DCR":
        y = x.reshape(n, b_, b_, c // b_**2, h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // b_**2, b_, b_, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // b_**2, h * b_, w * b_)


def _space_to_depth(r, node, x):
    b_ = node.attr("blocksize")
    n, c, h, w = x.shape
    perm = (0, 3, 5, 1, 2, 4) if node.attr("mode", "DCR", choices=("DCR", "CRD")) == "DCR" else (0, 1, 3, 5, 2, 4)
    y = x.reshape(n, c, h // b_, b_, w // b_, b_).permute(*perm)
    return y.reshape(n, c * b_ * b_, h // b_, w // b_)


def _compress(r, node, x, cond):
    keep = [i for i, c in enumerate(cond.numpy().reshape(-1).tolist()) if c]
    a = node.attr("axis", None)
    if a is None:
        x, a = x.reshape(-1), 0
    a = axis_of(a, x.ndim, node)
    keep = [i for i in keep if i < x.shape[a]]
    if not keep:
        return Tensor(np.zeros([0 if i == a else s for i, s in enumerate(x.shape)], _np(x.dtype)))
    return x[(slice(None),) * a + (const(keep, dtypes.int64),)]


def _reverse_sequence(r, node, x, lens):
    ba, ta = node.attr("batch_axis", 1), node.attr("time_axis", 0)
    t = x.shape[ta]
    lens = lens.cast(dtypes.int64)
    shp = [1] * x.ndim
    shp[ta] = t
    pos = Tensor.arange(t, dtype=dtypes.int64).reshape(shp)
    lshp = [1] * x.ndim
    lshp[ba] = x.shape[ba]
    ln = lens.reshape(lshp)
    src = (pos < ln).where(ln - 1 - pos, pos)
    return x.gather(ta, src.expand(x.shape))


def _cumsum(r, node, x, axis):
    a = axis_of(int(scalar(axis)), x.ndim, node)
    prod_ = node.op_type == "CumProd"
    if node.attr("reverse", 0):
        x = x.flip(a)
    y = x.cumprod(a) if prod_ else x.cumsum(a)
    if node.attr("exclusive", 0):
        pad = [None] * x.ndim
        pad[a] = (1, 0)
        y = y.pad(pad, value=1 if prod_ else 0).shrink(tuple((0, s) if i == a else None for i, s in enumerate(x.shape)))
    if node.attr("reverse", 0):
        y = y.flip(a)
    return y.cast(x.dtype)


def _topk(r, node, x, k):
    a = axis_of(node.attr("axis", -1), x.ndim, node)
    k = int(scalar(k)) if node.opset >= 10 else node.attr("k")
    largest = bool(node.attr("largest", 1))
    vals, idx = _stable_topk(x, k, a, largest)
    return vals, idx


def _stable_topk(x: Tensor, k: int, a: int, largest: bool) -> tuple[Tensor, Tensor]:
    """The k largest (smallest) along a, ties to the lower index, as ONNX requires: a sort of (value, index)."""
    arr = x.numpy()
    order = np.argsort(-arr if largest else arr, axis=a, kind="stable") if arr.dtype.kind != "u" else None
    if order is None:
        order = np.argsort(arr, axis=a, kind="stable")
        if largest:
            order = np.flip(np.argsort(np.flip(arr, a), axis=a, kind="stable"), a)
            order = arr.shape[a] - 1 - order
            order = np.argsort(-arr.astype(np.float64), axis=a, kind="stable")
    idx = Tensor(np.ascontiguousarray(np.take(order, np.arange(k), axis=a)).astype(np.int64))
    return x.gather(a, idx), idx


def _nonzero(r, node, x):
    return Tensor(np.stack(np.nonzero(x.numpy())).astype(np.int64).reshape(x.ndim, -1))


def _einsum(r, node, *xs):
    return Tensor.einsum(node.attr("equation"), *xs)


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


# ***** linear algebra, convolution, pooling *****


def _matmul(r, node, a, b):
    return a.matmul(b)


def _gemm(r, node, a, b, c=None):
    if node.attr("transA", 0):
        a = a.transpose(0, 1) if a.ndim == 2 else a
    if node.attr("transB", 0):
        b = b.transpose(0, 1)
    y = a.matmul(b) * node.attr("alpha", 1.0) if node.attr("alpha", 1.0) != 1.0 else a.matmul(b)
    if c is not None:
        beta = node.attr("beta", 1.0)
        y = y + (c * beta if beta != 1.0 else c)
    return y.cast(a.dtype)


def _conv_pads(node: Node, in_spatial, kernel, strides, dilations) -> list[int]:
    """ONNX pads [b1, b2, ..., e1, e2] resolved from auto_pad."""
    n = len(kernel)
    auto = node.attr("auto_pad", "NOTSET", choices=("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"))
    if auto == "NOTSET":
        return list(node.attr("pads", [0] * 2 * n))
    if auto == "VALID":
        return [0] * 2 * n
    begin, end = [], []
    for i, k, s, d in zip(in_spatial, kernel, strides, dilations):
        total = max((-(-i // s) - 1) * s + (k - 1) * d + 1 - i, 0)
        small, big = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else big)
        end.append(big if auto == "SAME_UPPER" else small)
    return begin + end


def _torch_pads(pads: list[int]) -> list[int]:
    """ONNX [b1, b2, ..., e1, e2] -> zeptograd's flat (left, right, top, bottom, ...), last dim first."""
    n = len(pads) // 2
    return [p for i in reversed(range(n)) for p in (pads[i], pads[i + n])]


def _conv(r, node, x, w, b=None):
    k = list(node.attr("kernel_shape", w.shape[2:]))
    n = len(k)
    strides, dil = list(node.attr("strides", [1] * n)), list(node.attr("dilations", [1] * n))
    pads = _conv_pads(node, x.shape[2:], k, strides, dil)
    return x.conv2d(w, b, groups=node.attr("group", 1), stride=strides, dilation=dil, padding=_torch_pads(pads))


def _conv_transpose(r, node, x, w, b=None):
    k = list(node.attr("kernel_shape", w.shape[2:]))
    n = len(k)
    strides, dil = list(node.attr("strides", [1] * n)), list(node.attr("dilations", [1] * n))
    out_pad = list(node.attr("output_padding", [0] * n))
    auto = node.attr("auto_pad", "NOTSET", choices=("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"))
    if "output_shape" in node.attrs or auto in ("SAME_UPPER", "SAME_LOWER"):
        out_shape = (
            list(node.attrs["output_shape"])[-n:]
            if "output_shape" in node.attrs
            else [i * s for i, s in zip(x.shape[2:], strides)]
        )
        begin, end = [], []
        for i, kk, s, d, op_, o in zip(x.shape[2:], k, strides, dil, out_pad, out_shape):
            total = s * (i - 1) + op_ + ((kk - 1) * d + 1) - o
            if auto == "SAME_UPPER" or (auto != "SAME_LOWER" and "output_shape" in node.attrs):
                begin.append(int(total / 2))
                end.append(total - int(total / 2))
            else:
                begin.append(total - int(total / 2))
                end.append(int(total / 2))
        pads = begin + end
    elif auto == "VALID":
        pads = [0] * 2 * n
    else:
        pads = list(node.attr("pads", [0] * 2 * n))
    y = x.conv_transpose2d(w, None, groups=node.attr("group", 1), stride=strides, dilation=dil,
                           output_padding=out_pad)  # fmt: skip
    # ONNX pads crop the full output; a negative pad (an output_shape beyond the natural size) adds zeros
    y = y.pad([None, None] + [(-pads[i], -pads[i + n]) for i in range(n)])
    return y if b is None else y + b.reshape(1, -1, *[1] * n)


def _pool_args(node: Node, x: Tensor):
    k = list(node.attr("kernel_shape"))
    n = len(k)
    strides, dil = list(node.attr("strides", [1] * n)), list(node.attr("dilations", [1] * n))
    pads = _conv_pads(node, x.shape[2:], k, strides, dil)
    return k, strides, dil, pads, bool(node.attr("ceil_mode", 0))


def _maxpool(r, node, x):
    k, s, d, pads, ceil = _pool_args(node, x)
    col_major = bool(node.attr("storage_order", 0))
    if col_major and len(k) != 2:
        raise node.fail("attribute storage_order=1 is supported for 2-d pooling only", unsupported=True)
    if len(node.outputs) > 1 and node.outputs[1]:
        y, idx = x.max_pool2d(k, s, d, _torch_pads(pads), ceil, return_indices=True)
        # ONNX indices are flat over (N, C, *spatial); zeptograd's are within the spatial dims
        if col_major:  # (h, w) counted as h + w * H
            hh, ww = x.shape[2:]
            idx = (idx // ww) + (idx % ww) * hh
        plane = int(np.prod(x.shape[2:]))
        nc = Tensor.arange(x.shape[0] * x.shape[1], dtype=dtypes.int64).reshape(x.shape[0], x.shape[1], *[1] * len(k))
        return y, idx + nc * plane
    return x.max_pool2d(k, s, d, _torch_pads(pads), ceil)


def _avgpool(r, node, x):
    k, s, d, pads, ceil = _pool_args(node, x)
    return x.avg_pool2d(k, s, d, _torch_pads(pads), ceil, count_include_pad=bool(node.attr("count_include_pad", 0)))


def _lppool(r, node, x):
    k, s, d, pads, ceil = _pool_args(node, x)
    p = node.attr("p", 2)
    summed = x.abs().pow(p).avg_pool2d(k, s, d, _torch_pads(pads), ceil, count_include_pad=True) * int(np.prod(k))
    return summed.pow(1.0 / p)


def _gap(r, node, x):
    return x.mean(tuple(range(2, x.ndim)), keepdim=True)


def _gmp(r, node, x):
    return x.max(tuple(range(2, x.ndim)), keepdim=True)


def _glp(r, node, x):
    p = node.attr("p", 2)
    return x.abs().pow(p).sum(tuple(range(2, x.ndim)), keepdim=True).pow(1.0 / p)


def _maxunpool(r, node, x, idx, out_shape=None):
    k = list(node.attr("kernel_shape"))
    n = len(k)
    s = list(node.attr("strides", [1] * n))
    pads = list(node.attr("pads", [0] * 2 * n))
    natural = list(x.shape[:2]) + [
        (i - 1) * st - pads[j] - pads[j + n] + kk for j, (i, st, kk) in enumerate(zip(x.shape[2:], s, k))
    ]
    shape = ints(out_shape) if out_shape is not None else natural
    idx = idx.reshape(-1).cast(dtypes.int64)
    if shape != natural:  # the indices address the natural output: move each to its coordinates in `shape`
        flat, rem = idx * 0, idx
        for d in range(len(shape)):
            stride_nat = int(np.prod(natural[d + 1 :]))
            coord = rem // stride_nat
            rem = rem - coord * stride_nat
            flat = flat + coord * int(np.prod(shape[d + 1 :]))
        idx = flat
    flat_out = Tensor.zeros(int(np.prod(shape)), dtype=x.dtype)
    return flat_out.scatter(0, idx, x.reshape(-1)).reshape(shape)


# ***** normalization *****


def _batchnorm(r, node, x, scale, bias, mean, var):
    eps = node.attr("epsilon", 1e-5)
    shp = (1, -1) + (1,) * (x.ndim - 2)
    if node.attr("training_mode", 0):
        axes = (0,) + tuple(range(2, x.ndim))
        bm, bv = x.mean(axes), x.var(axes, correction=0)
        mom = node.attr("momentum", 0.9)
        y = (x - bm.reshape(shp)) / (bv.reshape(shp) + eps).sqrt() * scale.reshape(shp) + bias.reshape(shp)
        return y, mean * mom + bm * (1 - mom), var * mom + bv * (1 - mom)
    y = (x - mean.reshape(shp)) * (scale / (var + eps).sqrt()).reshape(shp) + bias.reshape(shp)
    return y.cast(x.dtype)


def _instancenorm(r, node, x, scale, bias):
    axes = tuple(range(2, x.ndim))
    shp = (1, -1) + (1,) * (x.ndim - 2)
    return x.layernorm(axes, node.attr("epsilon", 1e-5)) * scale.reshape(shp) + bias.reshape(shp)


def _layernorm(r, node, x, scale, bias=None):
    a = axis_of(node.attr("axis", -1), x.ndim, node)
    eps = node.attr("epsilon", 1e-5)
    axes = tuple(range(a, x.ndim))
    xf = x.cast(dtypes.float32) if node.attr("stash_type", 1) == 1 and x.dtype != dtypes.float64 else x
    mean = xf.mean(axes, keepdim=True)
    d = xf - mean
    inv = (d.square().mean(axes, keepdim=True) + eps).rsqrt()
    y = (d * inv).cast(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return y, mean, inv


def _rmsnorm(r, node, x, scale):
    a = axis_of(node.attr("axis", -1), x.ndim, node)
    eps = node.attr("epsilon", 1e-5)
    axes = tuple(range(a, x.ndim))
    xf = x.cast(dtypes.float32) if node.attr("stash_type", 1) == 1 and x.dtype != dtypes.float64 else x
    y = xf * (xf.square().mean(axes, keepdim=True) + eps).rsqrt()
    return y.cast(x.dtype) * scale


def _groupnorm(r, node, x, scale, bias):
    g, eps = node.attr("num_groups"), node.attr("epsilon", 1e-5)
    n, c = x.shape[:2]
    xf = x.cast(dtypes.float32) if node.attr("stash_type", 1) == 1 and x.dtype != dtypes.float64 else x
    y = xf.reshape(n, g, -1).layernorm(-1, eps).reshape(x.shape).cast(x.dtype)
    shp = (1, -1) + (1,) * (x.ndim - 2)
    if node.opset < 21:  # scale and bias per group
        scale, bias = (
            scale.reshape(g, 1).expand(g, c // g).reshape(-1),
            bias.reshape(g, 1).expand(g, c // g).reshape(-1),
        )
    return y * scale.reshape(shp) + bias.reshape(shp)


def _lpnorm(r, node, x):
    a, p = node.attr("axis", -1), node.attr("p", 2)
    norm = x.abs().sum(a, keepdim=True) if p == 1 else x.square().sum(a, keepdim=True).sqrt()
    return (norm == 0).where(0, x / norm).cast(x.dtype)


def _mvn(r, node, x):
    axes = tuple(node.attr("axes", [0, 2, 3]))
    mean = x.mean(axes, keepdim=True)
    return (x - mean) / ((x - mean).square().mean(axes, keepdim=True).sqrt() + 1e-9)


def _lrn(r, node, x):
    size = node.attr("size")
    alpha, beta, bias = node.attr("alpha", 1e-4), node.attr("beta", 0.75), node.attr("bias", 1.0)
    c = x.shape[1]
    sq = x.square().reshape(x.shape[0], 1, c, -1)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = sq.pad([None, None, (lo, hi), None])
    summed = sq.avg_pool2d((size, 1), 1, 1, 0) * size
    return x / (summed.reshape(x.shape) * (alpha / size) + bias).pow(beta)


def _dropout(r, node, x, ratio=None, training=None):
    if training is not None and bool(scalar(training)) and (ratio is None or scalar(ratio) != 0):
        raise node.fail("training-mode dropout with a non-zero ratio is random: not supported", unsupported=True)
    return x, Tensor.ones(*x.shape, dtype=dtypes.bool) if x.ndim else Tensor(np.bool_(True))


# ***** quantization *****


def _q_broadcast(p: Tensor, x: Tensor, node: Node) -> Tensor:
    if p.ndim == 0 or p.numel() == 1 and p.ndim <= 1:
        return p.reshape(())
    a = axis_of(node.attr("axis", 1), x.ndim, node)
    bs = node.attr("block_size", 0)
    if bs:
        p = p.repeat_interleave(bs, a).shrink(tuple((0, s) if i == a else None for i, s in enumerate(x.shape)))
        return p
    shp = [1] * x.ndim
    shp[a] = -1
    return p.reshape(shp)


_Q_RANGE = {2: (0, 255), 3: (-128, 127), 4: (0, 65535), 5: (-32768, 32767), 21: (0, 15), 22: (-8, 7), 25: (0, 3),
            26: (-2, 1), 6: (-(2**31), 2**31 - 1)}  # fmt: skip


def _quantize(r, node, x, scale, zp=None):
    out_t = node.out_types[0].elem_type if node.out_types and node.out_types[0] else None
    if out_t is None:
        out_t = node.attr("output_dtype", 0) or 2
    xs = x.cast(dtypes.float32) / _q_broadcast(scale, x, node).cast(dtypes.float32)
    if out_t in _Q_RANGE:
        lo, hi = _Q_RANGE[out_t]
        y = xs.round()
        if zp is not None:
            y = y + _q_broadcast(zp, x, node).cast(dtypes.float32)
        y = y.clip(lo, hi)
        return to_emulated(y, out_t) if out_t in EMULATED else y.cast(ONNX_DTYPES[out_t])
    if zp is not None:
        xs = xs + _q_broadcast(zp, x, node).cast(dtypes.float32)
    return cast_to(xs, out_t, node, node.attr("saturate", 1))


def _dequantize(r, node, x, scale, zp=None):
    xf = x.cast(dtypes.float32)
    if zp is not None:
        xf = xf - _q_broadcast(zp, x, node).cast(dtypes.float32)
    y = xf * _q_broadcast(scale, x, node).cast(dtypes.float32)
    return y


def _dyn_quant(r, node, x):
    lo, hi = x.min().minimum(0), x.max().maximum(0)
    scale = (hi - lo) / 255
    zp = (-lo / scale).round().clip(0, 255)
    y = ((x / scale).round() + zp).clip(0, 255).cast(dtypes.uint8)
    return y, scale, zp.cast(dtypes.uint8)


def _matmul_int(r, node, a, b, azp=None, bzp=None):
    a = a.cast(dtypes.int32) - (azp.cast(dtypes.int32) if azp is not None else 0)
    b = b.cast(dtypes.int32) - (bzp.cast(dtypes.int32) if bzp is not None else 0)
    return a.matmul(b)


def _conv_int(r, node, x, w, xzp=None, wzp=None):
    x = x.cast(dtypes.int32) - (xzp.cast(dtypes.int32) if xzp is not None else 0)
    w = w.cast(dtypes.int32) - (
        wzp.cast(dtypes.int32).reshape(-1, *[1] * (w.ndim - 1))
        if wzp is not None and wzp.ndim
        else wzp.cast(dtypes.int32)
        if wzp is not None
        else 0
    )
    return _conv(r, node, x, w).cast(dtypes.int32)


def _qlinear_matmul(r, node, a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp):
    af = (a.cast(dtypes.float32) - a_zp.cast(dtypes.float32)) * a_s.cast(dtypes.float32)
    bshape = [1] * b.ndim
    if b_s.ndim and b_s.numel() > 1:
        bshape[-1] = -1
    bf = (b.cast(dtypes.float32) - b_zp.cast(dtypes.float32).reshape(bshape)) * b_s.cast(dtypes.float32).reshape(bshape)
    y = (af.matmul(bf) / y_s.cast(dtypes.float32)).round() + y_zp.cast(dtypes.float32)
    lo, hi = (0, 255) if y_zp.dtype == dtypes.uint8 else (-128, 127)
    return y.clip(lo, hi).cast(y_zp.dtype)


def _qlinear_conv(r, node, x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, b=None):
    xf = (x.cast(dtypes.float32) - x_zp.cast(dtypes.float32)) * x_s.cast(dtypes.float32)
    wshape = (-1,) + (1,) * (w.ndim - 1)
    wf = (w.cast(dtypes.float32) - w_zp.cast(dtypes.float32).reshape(wshape if w_zp.ndim else ())) * w_s.cast(
        dtypes.float32
    ).reshape(wshape if w_s.ndim else ())
    bf = (
        b.cast(dtypes.float32) * (x_s.cast(dtypes.float32) * w_s.cast(dtypes.float32)).reshape(-1)
        if b is not None
        else None
    )
    y = _conv(r, node, xf, wf, bf)
    y = (y / y_s.cast(dtypes.float32)).round() + y_zp.cast(dtypes.float32)
    lo, hi = (0, 255) if y_zp.dtype == dtypes.uint8 else (-128, 127)
    return y.clip(lo, hi).cast(y_zp.dtype)


# ***** sequences, optionals, control flow *****


def _seq_empty(r, node):
    return []


def _seq_construct(r, node, *xs):
    return list(xs)


def _seq_len(r, node, s):
    return const(len(s), dtypes.int64)


def _seq_at(r, node, s, i):
    return s[int(scalar(i))]


def _seq_insert(r, node, s, x, pos=None):
    s = list(s)
    if pos is None:
        s.append(x)
    else:
        p = int(scalar(pos))
        s.insert(p if p >= 0 else p + len(s), x)
    return s


def _seq_erase(r, node, s, pos=None):
    s = list(s)
    s.pop(int(scalar(pos)) if pos is not None else -1)
    return s


def _concat_from_seq(r, node, s):
    a = node.attr("axis")
    if node.attr("new_axis", 0):
        return Tensor.stack(*s, dim=a)
    return s[0].cat(*s[1:], dim=a) if len(s) > 1 else s[0]


def _split_to_seq(r, node, x, split=None):
    a = axis_of(node.attr("axis", 0), x.ndim, node)
    keep = node.attr("keepdims", 1)
    if split is None:
        outs = [x.shrink(tuple((i, i + 1) if d == a else None for d in range(x.ndim))) for i in range(x.shape[a])]
        return [o if keep else o.reshape(x.shape[:a] + x.shape[a + 1 :]) for o in outs]
    sizes = ints(split)
    if isinstance(split, Tensor) and split.ndim == 0:
        n = sizes[0]
        sizes = [n] * (x.shape[a] // n) + ([x.shape[a] % n] if x.shape[a] % n else [])
    outs, start = [], 0
    for sz in sizes:
        outs.append(x.shrink(tuple((start, start + sz) if d == a else None for d in range(x.ndim))))
        start += sz
    return outs


def _optional(r, node, x=None):
    return x


def _opt_has(r, node, x=None):
    return Tensor(np.bool_(x is not None))


def _opt_get(r, node, x):
    if x is None:
        raise node.fail("the optional input is empty")
    return x


def _subgraph(r, proto):
    from . import Graph

    cache = r.__dict__.setdefault("_subgraphs", {})
    if id(proto) not in cache:
        cache[id(proto)] = (Graph(proto, r.opsets, r.graph.types), proto)
    return cache[id(proto)][0]


def _if(r, node, cond):
    g = _subgraph(r, node.attr("then_branch") if bool(scalar(cond)) else node.attr("else_branch"))
    env = r.run_graph(g, dict(r._scope))
    return tuple(env[o] for o in g.outputs)


def _loop(r, node, m=None, cond=None, *carried):
    g = _subgraph(r, node.attr("body"))
    max_trip = int(scalar(m)) if m is not None else 2**62
    keep_going = bool(scalar(cond)) if cond is not None else True
    n_carried = len(carried)
    scans: list[list] = [[] for _ in g.outputs[1 + n_carried :]]
    vals = list(carried)
    i = 0
    while i < max_trip and keep_going:
        env = dict(r._scope)
        env[g.inputs[0]] = const(i, dtypes.int64)
        env[g.inputs[1]] = Tensor(np.bool_(keep_going))
        for name, v in zip(g.inputs[2:], vals):
            env[name] = v
        env = r.run_graph(g, env)
        keep_going = bool(scalar(env[g.outputs[0]]))
        vals = [env[o] for o in g.outputs[1 : 1 + n_carried]]
        for s, o in zip(scans, g.outputs[1 + n_carried :]):
            s.append(env[o])
        i += 1
    return tuple(vals) + tuple(Tensor.stack(*s) if s else Tensor(np.zeros((0,), np.float32)) for s in scans)


def _scan(r, node, *args):
    g = _subgraph(r, node.attr("body"))
    n_scan_in = node.attr("num_scan_inputs")
    n_state = len(args) - n_scan_in
    state, xs = list(args[:n_state]), list(args[n_state:])
    in_axes = node.attr("scan_input_axes", [0] * n_scan_in)
    in_dirs = node.attr("scan_input_directions", [0] * n_scan_in)
    n_scan_out = len(g.outputs) - n_state
    out_axes = node.attr("scan_output_axes", [0] * n_scan_out)
    out_dirs = node.attr("scan_output_directions", [0] * n_scan_out)
    in_axes = [axis_of(a, x.ndim, node) for a, x in zip(in_axes, xs)]
    steps = xs[0].shape[in_axes[0]] if xs else 0
    outs: list[list] = [[] for _ in range(n_scan_out)]
    for t in range(steps):
        env = dict(r._scope)
        for name, v in zip(g.inputs[:n_state], state):
            env[name] = v
        for name, x, a, d in zip(g.inputs[n_state:], xs, in_axes, in_dirs):
            i = steps - 1 - t if d else t
            env[name] = x.shrink(tuple((i, i + 1) if k == a else None for k in range(x.ndim))).reshape(
                x.shape[:a] + x.shape[a + 1 :]
            )
        env = r.run_graph(g, env)
        state = [env[o] for o in g.outputs[:n_state]]
        for lst, o in zip(outs, g.outputs[n_state:]):
            lst.append(env[o])
    results = []
    for lst, a, d in zip(outs, out_axes, out_dirs):
        if d:
            lst = lst[::-1]
        st = Tensor.stack(*lst, dim=0)
        a = axis_of(a, st.ndim, node)
        results.append(st.permute([*range(1, a + 1), 0, *range(a + 1, st.ndim)]) if a else st)
    return tuple(state) + tuple(results)


# ***** attention *****


def _attention(r, node, q, k, v, mask=None, past_k=None, past_v=None, nonpad=None):
    qh, kvh = node.attr("q_num_heads", None), node.attr("kv_num_heads", None)
    rank3 = q.ndim == 3
    b = q.shape[0]
    if rank3:
        q = q.reshape(b, q.shape[1], qh, -1).permute(0, 2, 1, 3)
        k = k.reshape(b, k.shape[1], kvh, -1).permute(0, 2, 1, 3)
        v = v.reshape(b, v.shape[1], kvh, -1).permute(0, 2, 1, 3)
    scale = node.attr("scale", None)
    scale = math.sqrt(1 / math.sqrt(q.shape[3]) if scale is None else scale)
    if past_k is not None:
        k, v = past_k.cat(k, dim=2), past_v.cat(v, dim=2)
    present_k, present_v = k, v
    sq, skv = q.shape[2], k.shape[2]
    fdt = q.dtype
    bias = Tensor.zeros(sq, skv, dtype=fdt)
    if mask is not None and mask.shape[-1] < skv:
        mask = mask.pad(
            [None] * (mask.ndim - 1) + [(0, skv - mask.shape[-1])],
            value=False if mask.dtype == dtypes.bool else -math.inf,
        )
    if mask is not None and mask.dtype == dtypes.bool:
        mask = mask.where(const(0, fdt), const(-math.inf, fdt))
    offset = None
    if nonpad is not None and past_k is None:
        offset = nonpad.cast(dtypes.int64).reshape(-1, 1, 1, 1) - sq
    elif past_k is not None:
        offset = past_k.shape[2]
    else:
        offset = 0
    i_idx = Tensor.arange(sq, dtype=dtypes.int64).reshape(sq, 1)
    j_idx = Tensor.arange(skv, dtype=dtypes.int64).reshape(1, skv)
    if node.attr("is_causal", 0):
        base = mask if mask is not None else bias
        bias = base + (j_idx <= i_idx + offset).where(const(0, fdt), const(-math.inf, fdt))
    elif mask is not None:
        bias = bias + mask
    lw, rw = node.attr("left_window_size", -1), node.attr("right_window_size", -1)
    if lw >= 0 or rw >= 0:
        diff = (i_idx + offset) - j_idx
        allowed = Tensor.ones(*diff.shape, dtype=dtypes.bool)
        if lw >= 0:
            allowed = allowed & (diff <= lw)
        if rw >= 0:
            allowed = allowed & (-diff <= rw)
        bias = bias + allowed.where(const(0, fdt), const(-math.inf, fdt))
    if nonpad is not None:
        pm = Tensor.arange(skv, dtype=dtypes.int64).reshape(1, skv) < nonpad.cast(dtypes.int64).reshape(-1, 1)
        bias = bias + pm.reshape(b, 1, 1, skv).where(const(0, fdt), const(-math.inf, fdt))
    nq, nk = q.shape[1], k.shape[1]
    if nq != nk and nq % nk == 0:
        k, v = k.repeat_interleave(nq // nk, 1), v.repeat_interleave(nq // nk, 1)
    s = const(scale, fdt)
    qk = (q * s).matmul((k * s).transpose(-1, -2))
    softcap = node.attr("softcap", 0.0)
    if softcap > 0:
        qk = (qk / softcap).tanh() * softcap
    mode = node.attr("qk_matmul_output_mode", 0)
    with_bias = qk + bias
    qk_out = with_bias if mode == 2 else qk
    sp = node.attr("softmax_precision", None)
    logits = with_bias.cast(ONNX_DTYPES[sp]) if sp is not None and sp in ONNX_DTYPES else with_bias
    mx = logits.max(-1, keepdim=True)
    safe = (mx == -math.inf).where(0, mx)
    e = (logits - safe).exp()
    ssum = e.sum(-1, keepdim=True)
    probs = e / (ssum == 0).where(1, ssum)
    all_masked = bias.max(-1, keepdim=True) == -math.inf
    probs = all_masked.where(0, probs)
    if mode == 3:
        qk_out = probs
    y = probs.cast(fdt).matmul(v)
    if rank3:
        y = y.permute(0, 2, 1, 3).reshape(b, y.shape[2], -1)
    return y, present_k, present_v, qk_out.cast(fdt)


# ***** resize *****


def _resize_taps(mode: str, nearest_mode: str, a: float, antialias: bool, ratio: float, scale: float) -> np.ndarray:
    """The interpolation weights of the taps around a source coordinate (ratio in (0, 1] past the left tap)."""
    if mode == "nearest":
        if float(ratio).is_integer():
            return np.array([0.0, 1.0])
        pick = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": False, "ceil": True}
        return np.array([0.0, 1.0]) if pick[nearest_mode] else np.array([1.0, 0.0])
    if mode == "linear":
        if not antialias:
            return np.array([1 - ratio, ratio])
        s = min(scale, 1.0)
        start = int(np.floor(-1 / s) + 1)
        w = np.clip(1 - np.abs((np.arange(start, 2 - start) - ratio) * s), 0, 1)
        return w / w.sum()

    def cubic(x):
        x = abs(x)
        if x <= 1:
            return (a + 2) * x**3 - (a + 3) * x**2 + 1
        return a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a if x < 2 else 0.0

    if not antialias:
        return np.array([cubic(ratio + 1), cubic(ratio), cubic(1 - ratio), cubic(2 - ratio)])
    s = min(scale, 1.0)
    start = int(np.floor(-2 / s) + 1)
    w = np.array([cubic(s * (i - ratio)) for i in range(start, 2 - start)])
    return w / w.sum()


def _resize_axis(x: Tensor, axis: int, scale: float, n_out: int, node: Node, roi) -> Tensor:
    n_in = x.shape[axis]
    ctm = node.attr("coordinate_transformation_mode", "half_pixel")
    mode = node.attr("mode", "nearest", choices=("nearest", "linear", "cubic"))
    y = np.arange(n_out, dtype=np.float64)
    out_w = scale * n_in
    extrap = None
    if ctm == "align_corners":
        xo = np.zeros(n_out) if out_w == 1 else y * (n_in - 1) / (out_w - 1)
    elif ctm == "asymmetric":
        xo = y / scale
    elif ctm == "tf_crop_and_resize":
        r0, r1 = roi
        xo = np.full(n_out, (r1 - r0) * (n_in - 1) / 2) if out_w == 1 else y * (r1 - r0) * (n_in - 1) / (out_w - 1)
        xo = xo + r0 * (n_in - 1)
        extrap = (xo < 0) | (xo > n_in - 1)
    elif ctm == "pytorch_half_pixel":
        xo = np.full(n_out, -0.5) if out_w == 1 else (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel":
        xo = (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel_symmetric":
        xo = n_in / 2 * (1 - n_out / out_w) + (y + 0.5) / scale - 0.5
    else:
        raise node.fail(f"attribute coordinate_transformation_mode={ctm!r} is not supported", unsupported=True)
    lo = np.floor(xo).astype(np.int64)
    ratios = np.where(xo == lo, 1.0, xo - lo)
    nm, a = node.attr("nearest_mode", "round_prefer_floor"), node.attr("cubic_coeff_a", -0.75)
    anti = bool(node.attr("antialias", 0)) and mode != "nearest"
    coeffs = np.stack([_resize_taps(mode, nm, a, anti, float(rt), scale) for rt in ratios])
    n = coeffs.shape[1]
    pad = int(np.ceil(n / 2))
    xp = xo + pad
    pp = np.floor(xp).astype(np.int64)
    frac = xp - pp
    off = (
        np.where(frac == 0, -(n // 2), -(n // 2) + 1)
        if n % 2 == 0
        else np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    )
    taps = (pp + off)[:, None] + np.arange(n)[None, :] - pad
    if node.attr("exclude_outside", 0):
        coeffs = np.where((taps < 0) | (taps >= n_in), 0.0, coeffs)
        sums = coeffs.sum(-1, keepdims=True)
        coeffs = coeffs / np.where(sums == 0, 1.0, sums)
    taps = np.clip(taps, 0, n_in - 1)
    xm = x if axis == x.ndim - 1 else x.transpose(axis, -1)
    if mode == "nearest":  # one tap, gathered exactly
        idx = taps[np.arange(n_out), coeffs.argmax(-1)]
        out = xm[..., const(idx, dtypes.int64)]
    else:
        g = xm[..., const(taps.reshape(-1), dtypes.int64)].reshape(*xm.shape[:-1], n_out, n)
        out = (g * const(coeffs, xm.dtype)).sum(-1)
    if extrap is not None and extrap.any():
        out = const(extrap, dtypes.bool).where(node.attr("extrapolation_value", 0.0), out)
    return out if axis == x.ndim - 1 else out.transpose(axis, -1)


def _resize(r, node, x, roi=None, scales=None, sizes=None):
    if node.op_type == "Upsample":
        scales = roi if node.opset >= 9 else node.attr("scales")
        roi = None
    if node.opset < 11 and node.op_type == "Resize":
        scales, roi = roi, None
    rank = x.ndim
    axes = [axis_of(a, rank, node) for a in node.attr("axes", list(range(rank)))]
    roi_l = floats(roi) if roi is not None and (not isinstance(roi, Tensor) or roi.numel()) else None
    sc = floats(scales) if scales is not None and (not isinstance(scales, Tensor) or scales.numel()) else None
    sz = ints(sizes) if sizes is not None and sizes.numel() else None
    full_scale, full_size = [1.0] * rank, list(x.shape)
    full_roi = [0.0] * rank + [1.0] * rank
    if roi_l:
        for i, a in enumerate(axes):
            full_roi[a], full_roi[rank + a] = roi_l[i], roi_l[len(axes) + i]
    if sz is not None:
        for i, a in enumerate(axes):
            full_size[a] = sz[i]
        full_scale = [full_size[i] / x.shape[i] for i in range(rank)]
        policy = node.attr("keep_aspect_ratio_policy", "stretch", choices=("stretch", "not_larger", "not_smaller"))
        if policy != "stretch":
            s = (min if policy == "not_larger" else max)(full_scale[a] for a in axes)
            full_scale = [s if i in axes else 1.0 for i in range(rank)]
            full_size = [int(s * x.shape[i] + 0.5) if i in axes else x.shape[i] for i in range(rank)]
    elif sc is not None:
        for i, a in enumerate(axes):
            full_scale[a] = sc[i]
        full_size = [int(s * d) for s, d in zip(full_scale, x.shape)]
    else:
        raise node.fail("needs scales or sizes")
    mode = node.attr("mode", "nearest")
    y = x.cast(dtypes.float32) if mode != "nearest" and x.dtype != dtypes.float64 else x
    for a in axes:
        if math.isclose(full_scale[a], 1.0) and full_size[a] == x.shape[a] and (
            math.isclose(full_roi[a], 0.0) and math.isclose(full_roi[a + rank], 1.0)):  # fmt: skip
            continue
        y = _resize_axis(y, a, full_scale[a], full_size[a], node, (full_roi[a], full_roi[a + rank]))
    if dtypes.is_int(x.dtype) and mode != "nearest":
        y = y.round().clip(dtypes.min(x.dtype), dtypes.max(x.dtype))
    return y.cast(x.dtype)


# ***** losses *****


def _nll(node: Node, logp: Tensor, target: Tensor, weight: Tensor | None) -> Tensor:
    red = node.attr("reduction", "mean", choices=("none", "sum", "mean"))
    ign = node.attr("ignore_index", None)
    c = logp.shape[1]
    t = target.cast(dtypes.int64)
    valid = (t != ign) if ign is not None else None
    safe_t = valid.where(t, 0) if valid is not None else t
    picked = logp.gather(1, safe_t.unsqueeze(1)).squeeze(1)
    w = weight[safe_t] if weight is not None else Tensor.ones(*t.shape, dtype=logp.dtype)
    if valid is not None:
        w = valid.where(w, 0)
    loss = -picked * w
    if red == "none":
        return loss
    if red == "sum":
        return loss.sum()
    del c
    return loss.sum() / w.sum()


def _nll_loss(r, node, x, target, weight=None):
    return _nll(node, x, target, weight)


def _sce_loss(r, node, x, labels, weight=None):
    logp = x.log_softmax(1)
    loss = _nll(node, logp, labels, weight)
    return (loss, logp) if len(node.outputs) > 1 else loss


# ***** recurrent *****


def _rnn_act(name: str, alpha=None, beta=None) -> Callable[[Tensor], Tensor]:
    name = name.lower()

    def a_or(d):
        return alpha if alpha is not None else d

    def b_or(d):
        return beta if beta is not None else d

    table = {
        "sigmoid": Tensor.sigmoid, "tanh": Tensor.tanh, "relu": Tensor.relu,
        "leakyrelu": lambda x: x.leaky_relu(a_or(0.01)),
        "hardsigmoid": lambda x: (x * a_or(0.2) + b_or(0.5)).clip(0, 1),
        "elu": lambda x: (x > 0).where(x, (x.exp() - 1) * a_or(1.0)),
        "softsign": Tensor.softsign, "softplus": lambda x: (x.exp() + 1).log(),
        "affine": lambda x: x * a_or(1.0) + b_or(0.0),
        "scaledtanh": lambda x: (x * b_or(1.0)).tanh() * a_or(1.0),
        "thresholdedrelu": lambda x: (x > a_or(1.0)).where(x, 0),
    }  # fmt: skip
    if name not in table:
        raise ValueError(f"unknown activation {name!r}")
    return table[name]


def _rnn_common(node: Node, x: Tensor, default_acts: list[str]):
    if node.attr("layout", 0):
        x = x.transpose(0, 1)
    direction = node.attr("direction", "forward", choices=("forward", "reverse", "bidirectional"))
    ndir = 2 if direction == "bidirectional" else 1
    names = node.attr("activations", default_acts * ndir)
    alphas, betas = node.attr("activation_alpha", []), node.attr("activation_beta", [])
    acts = [
        _rnn_act(n, alphas[i] if i < len(alphas) else None, betas[i] if i < len(betas) else None)
        for i, n in enumerate(names)
    ]
    return x, direction, ndir, acts


def _rnn_run(node, x, direction, ndir, step, init_states, per_dir_acts):
    seq = x.shape[0]
    ys, finals = [], []
    for d in range(ndir):
        rev = direction == "reverse" or d == 1
        states = [s[d] for s in init_states]
        outs = [None] * seq
        for t in range(seq - 1, -1, -1) if rev else range(seq):
            states = step(d, x[t], states, per_dir_acts[d])
            outs[t] = states[0]
        ys.append(Tensor.stack(*outs, dim=0))
        finals.append(states)
    y = Tensor.stack(*ys, dim=1)  # (seq, ndir, batch, hidden)
    final = [Tensor.stack(*[f[i] for f in finals], dim=0) for i in range(len(init_states))]
    if node.attr("layout", 0):
        y = y.permute(2, 0, 1, 3)
        final = [f.transpose(0, 1) for f in final]
    return y, final


def _rnn(r, node, x, w, rw, b=None, _seq_lens=None, h0=None):
    x, direction, ndir, acts = _rnn_common(node, x, ["Tanh"])
    h = rw.shape[-1]
    bsz = x.shape[1]
    if b is None:
        b = Tensor.zeros(ndir, 2 * h, dtype=x.dtype)
    if h0 is None:
        h0 = Tensor.zeros(ndir, bsz, h, dtype=x.dtype)
    elif node.attr("layout", 0):
        h0 = h0.transpose(0, 1)

    def step(d, xt, st, act):
        return [act[0](xt.matmul(w[d].T) + st[0].matmul(rw[d].T) + b[d, :h] + b[d, h:])]

    y, (hn,) = _rnn_run(node, x, direction, ndir, step, [h0], [acts[i : i + 1] for i in range(ndir)])
    return y, hn


def _gru(r, node, x, w, rw, b=None, _seq_lens=None, h0=None):
    x, direction, ndir, acts = _rnn_common(node, x, ["Sigmoid", "Tanh"])
    h = rw.shape[-1]
    bsz = x.shape[1]
    lbr = node.attr("linear_before_reset", 0)
    if b is None:
        b = Tensor.zeros(ndir, 6 * h, dtype=x.dtype)
    if h0 is None:
        h0 = Tensor.zeros(ndir, bsz, h, dtype=x.dtype)
    elif node.attr("layout", 0):
        h0 = h0.transpose(0, 1)

    def step(d, xt, st, act):
        f, g = act
        hp = st[0]
        gx = xt.matmul(w[d].T) + b[d, : 3 * h]
        wbr = b[d, 3 * h :]
        rz_h = hp.matmul(rw[d, : 2 * h].T) + wbr[: 2 * h]
        z = f(gx[:, :h] + rz_h[:, :h])
        rr = f(gx[:, h : 2 * h] + rz_h[:, h:])
        if lbr:
            hh = g(gx[:, 2 * h :] + rr * (hp.matmul(rw[d, 2 * h :].T) + wbr[2 * h :]))
        else:
            hh = g(gx[:, 2 * h :] + (rr * hp).matmul(rw[d, 2 * h :].T) + wbr[2 * h :])
        return [(1 - z) * hh + z * hp]

    y, (hn,) = _rnn_run(node, x, direction, ndir, step, [h0], [acts[2 * i : 2 * i + 2] for i in range(ndir)])
    return y, hn


def _lstm(r, node, x, w, rw, b=None, _seq_lens=None, h0=None, c0=None, p=None):
    x, direction, ndir, acts = _rnn_common(node, x, ["Sigmoid", "Tanh", "Tanh"])
    h = rw.shape[-1]
    bsz = x.shape[1]
    if b is None:
        b = Tensor.zeros(ndir, 8 * h, dtype=x.dtype)
    if h0 is None:
        h0 = Tensor.zeros(ndir, bsz, h, dtype=x.dtype)
    elif node.attr("layout", 0):
        h0 = h0.transpose(0, 1)
    if c0 is None:
        c0 = Tensor.zeros(ndir, bsz, h, dtype=x.dtype)
    elif node.attr("layout", 0):
        c0 = c0.transpose(0, 1)
    if p is None:
        p = Tensor.zeros(ndir, 3 * h, dtype=x.dtype)
    clip = node.attr("clip", None)
    couple = node.attr("input_forget", 0)

    def step(d, xt, st, act):
        f, g, hact = act
        hp, cp = st
        gates = xt.matmul(w[d].T) + hp.matmul(rw[d].T) + b[d, : 4 * h] + b[d, 4 * h :]
        if clip is not None:
            gates = gates.clip(-clip, clip)
        gi, go, gf, gc = gates[:, :h], gates[:, h : 2 * h], gates[:, 2 * h : 3 * h], gates[:, 3 * h :]
        i = f(gi + p[d, :h] * cp)
        fg = f(gf + p[d, 2 * h :] * cp)
        if couple:
            fg = 1 - i
        c = fg * cp + i * g(gc)
        o = f(go + p[d, h : 2 * h] * c)
        return [o * hact(c), c]

    y, (hn, cn) = _rnn_run(node, x, direction, ndir, step, [h0, c0], [acts[3 * i : 3 * i + 3] for i in range(ndir)])
    return y, hn, cn


# ***** training (ai.onnx.preview.training) *****

_TRAINING = "ai.onnx.preview.training"


def _adagrad(r, node, lr, t, *rest):
    n = len(rest) // 3
    decay, eps, norm = node.attr("decay_factor", 0.0), node.attr("epsilon", 0.0), node.attr("norm_coefficient", 0.0)
    rate = lr / (t.cast(lr.dtype) * decay + 1)
    xs, hs = [], []
    for x, g, h in zip(rest[:n], rest[n : 2 * n], rest[2 * n :]):
        greg = x * norm + g
        h_new = h + greg * greg
        xs.append((x - rate * greg / (h_new.sqrt() + eps)).cast(x.dtype))
        hs.append(h_new)
    return tuple(xs + hs)


def _momentum(r, node, lr, t, *rest):
    n = len(rest) // 3
    a, b, norm = node.attr("alpha"), node.attr("beta"), node.attr("norm_coefficient")
    nesterov = node.attr("mode", "standard", choices=("standard", "nesterov")) == "nesterov"
    b_adj = b if int(scalar(t)) > 0 else 1.0
    xs, vs = [], []
    for x, g, v in zip(rest[:n], rest[n : 2 * n], rest[2 * n :]):
        greg = x * norm + g
        v_new = v * a + greg * b_adj
        xs.append((x - lr * (greg + v_new * a if nesterov else v_new)).cast(x.dtype))
        vs.append(v_new.cast(x.dtype))
    return tuple(xs + vs)


def _adam(r, node, lr, t, *rest):
    n = len(rest) // 4
    a, b, eps = node.attr("alpha", 0.9), node.attr("beta", 0.999), node.attr("epsilon", 1e-6)
    norm, post = node.attr("norm_coefficient", 0.0), node.attr("norm_coefficient_post", 0.0)
    tt = int(scalar(t))
    xs, vs, hs = [], [], []
    for x, g, v, h in zip(rest[:n], rest[n : 2 * n], rest[2 * n : 3 * n], rest[3 * n :]):
        greg = x * norm + g
        v_new = v * a + greg * (1 - a)
        h_new = h * b + greg * greg * (1 - b)
        rate = lr * math.sqrt(1 - b**tt) / (1 - a**tt) if tt > 0 else lr
        xs.append(((x - rate * (v_new / (h_new.sqrt() + eps))) * (1 - post)).cast(x.dtype))
        vs.append(v_new.cast(x.dtype))
        hs.append(h_new.cast(x.dtype))
    return tuple(xs + vs + hs)


# ***** signal and image *****


def _window(kind: str):
    def impl(r, node, size):
        n = int(scalar(size))
        periodic = node.attr("periodic", 1)
        denom = n if periodic else n - 1
        k = np.arange(n, dtype=np.float64)
        ph = 2 * np.pi * k / max(denom, 1)
        w = {"hann": 0.5 - 0.5 * np.cos(ph), "hamming": 25 / 46 - 21 / 46 * np.cos(ph),
             "blackman": 0.42 - 0.5 * np.cos(ph) + 0.08 * np.cos(2 * ph)}[kind]  # fmt: skip
        dt = ONNX_DTYPES[node.attr("output_datatype", 1)]
        return (Tensor.arange(n, dtype=dtypes.float64) * 0 + const(w, dtypes.float64)).cast(dt)

    return impl


op("HannWindow")(_window("hann"))
op("HammingWindow")(_window("hamming"))
op("BlackmanWindow")(_window("blackman"))


def _center_crop_pad(r, node, x, shape):
    target = ints(shape)
    axes = [axis_of(a, x.ndim, node) for a in node.attr("axes", list(range(x.ndim)))]
    for a, t in zip(axes, target):
        n = x.shape[a]
        if t < n:
            s = (n - t) // 2
            x = x.shrink(tuple((s, s + t) if i == a else None for i in range(x.ndim)))
        elif t > n:
            s = (t - n) // 2
            x = x.pad([(s, t - n - s) if i == a else None for i in range(x.ndim)])
    return x


def _col2im(r, node, x, image_shape, block_shape):
    img, blk = ints(image_shape), ints(block_shape)
    nd = len(img)
    dil = list(node.attr("dilations", [1] * nd))
    pads = list(node.attr("pads", [0] * 2 * nd))
    st = list(node.attr("strides", [1] * nd))
    padded = [i + pads[d] + pads[d + nd] for d, i in enumerate(img)]
    outs = [(padded[d] - (dil[d] * (blk[d] - 1) + 1)) // st[d] + 1 for d in range(nd)]
    k, l_ = int(np.prod(blk)), int(np.prod(outs))
    # each (kernel offset, block position) column lands on one pixel of the padded image
    kidx = np.stack(np.unravel_index(np.arange(k), blk), -1)  # (k, nd)
    lidx = np.stack(np.unravel_index(np.arange(l_), outs), -1)  # (l, nd)
    pos = lidx[None, :, :] * np.array(st) + kidx[:, None, :] * np.array(dil)  # (k, l, nd)
    flat = np.ravel_multi_index(tuple(pos.reshape(-1, nd).T), padded)
    m = np.zeros((int(np.prod(padded)), k * l_), np.float32)
    m[flat, np.arange(k * l_)] = 1
    n, ck = x.shape[0], x.shape[1]
    c = ck // k
    y = x.reshape(n, c, k * l_).matmul(const(m.T, x.dtype)).reshape(n, c, *padded)
    return y.shrink((None, None) + tuple((pads[d], pads[d] + img[d]) for d in range(nd)))


def _affine_grid(r, node, theta, size):
    sz = ints(size)
    ac = node.attr("align_corners", 0)
    n, spatial = sz[0], sz[2:]

    def lin(s):
        if ac:
            return np.linspace(-1, 1, s) if s > 1 else np.zeros(1)
        return (np.arange(s) * 2 + 1) / s - 1

    grids = np.meshgrid(*[lin(s) for s in spatial], indexing="ij")
    base = np.stack(list(reversed(grids)) + [np.ones_like(grids[0])], -1).reshape(-1, len(spatial) + 1)  # x, y(, z), 1
    out = const(base, theta.dtype).matmul(theta.transpose(1, 2))  # (n, P, nd)
    return out.reshape(n, *spatial, len(spatial))


def _bitcast(r, node, x):
    to = node.attr("to")
    arr = x if isinstance(x, np.ndarray) else None
    if (
        arr is None
        and to in ONNX_DTYPES
        and ONNX_DTYPES[to].itemsize == x.dtype.itemsize
        and dtypes.bool not in (ONNX_DTYPES[to], x.dtype)
    ):
        return x.bitcast(ONNX_DTYPES[to])
    src = node.proto.input[0]
    in_t = r.graph.types.get(src)
    a = x.numpy() if isinstance(x, Tensor) else x
    if in_t is not None and in_t.elem_type in EMULATED:
        a = to_emulated(a, in_t.elem_type)
    out = a.view(np_dtype(to)) if a.dtype.itemsize == np_dtype(to).itemsize else None
    if out is None:
        raise node.fail(f"can't bitcast {a.dtype} to {np_dtype(to)}", unsupported=True)
    return out if to in EMULATED else value_to_tensor(out)


# ***** newer transformer ops *****


def _swiglu(r, node, a, b):
    alpha = node.attr("alpha", 1.0)
    return (a * (a * alpha).sigmoid().cast(a.dtype) * b).cast(a.dtype)


def _tensor_scatter(r, node, cache, update, write_idx=None):
    a = axis_of(node.attr("axis", -2), cache.ndim, node)
    circular = node.attr("mode", "linear", choices=("linear", "circular")) == "circular"
    n_max, n_upd, b = cache.shape[a], update.shape[a], cache.shape[0]
    wi = write_idx.cast(dtypes.int64) if write_idx is not None else Tensor.zeros(b, dtype=dtypes.int64)
    shp = [1] * cache.ndim
    shp[0], shp[a] = b, n_max
    pos = Tensor.arange(n_max, dtype=dtypes.int64).reshape([n_max if i == a else 1 for i in range(cache.ndim)])
    rel = pos - wi.reshape([b] + [1] * (cache.ndim - 1))
    if circular:
        rel = rel.mod(n_max)
    hit = (rel >= 0) & (rel < n_upd)
    idx = rel.clip(0, n_upd - 1).expand(*[s if i != a else n_max for i, s in enumerate(cache.shape)])
    padded = update.pad([(0, n_max - n_upd) if i == a else None for i in range(cache.ndim)])
    src = padded.gather(a, idx)
    return hit.where(src, cache)


def _rotary(r, node, x, cos, sin, pos_ids=None):
    shape = x.shape
    if x.ndim == 4:
        x = x.permute(0, 2, 1, 3)
    b, s = x.shape[:2]
    if x.ndim == 3:
        x = x.reshape(b, s, node.attr("num_heads"), -1)
    hs = x.shape[3]
    rd = node.attr("rotary_embedding_dim", 0) or hs
    xr, xn = x[..., :rd], x[..., rd:]
    if pos_ids is not None:
        cos, sin = cos[pos_ids.cast(dtypes.int64)], sin[pos_ids.cast(dtypes.int64)]
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    if node.attr("interleaved", 0):
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    else:
        x1, x2 = xr[..., : rd // 2], xr[..., rd // 2 :]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if node.attr("interleaved", 0):
        rot = real.unsqueeze(-1).cat(imag.unsqueeze(-1), dim=-1).reshape(xr.shape)
    else:
        rot = real.cat(imag, dim=-1)
    out = rot.cat(xn, dim=-1) if rd < hs else rot
    return out.reshape(shape) if len(shape) == 3 else out.permute(0, 2, 1, 3)


# ***** strings (host ops: zeptograd has no string dtype; the values are numpy object arrays) *****


def _strs(x) -> np.ndarray:
    return np.asarray(x, dtype=object)


def _string_concat(r, node, a, b):
    a, b = np.broadcast_arrays(_strs(a), _strs(b))
    return np.vectorize(lambda u, v: u + v, otypes=[object])(a, b) if a.size else a.astype(object)


def _regex_full_match(r, node, x):
    import re

    pat = re.compile(node.attr("pattern"))
    return Tensor(np.vectorize(lambda s: pat.fullmatch(s) is not None, otypes=[np.bool_])(_strs(x)))


def _string_split(r, node, x):
    x = _strs(x)
    delim = node.attr("delimiter", None) or None
    maxsplit = node.attr("maxsplit", None)
    parts = [s.split(delim) if maxsplit is None else s.split(delim, maxsplit) for s in x.reshape(-1)]
    width = max((len(p) for p in parts), default=0)
    out = np.array([p + [""] * (width - len(p)) for p in parts], dtype=object).reshape(*x.shape, width)
    return out, Tensor(np.array([len(p) for p in parts], np.int64).reshape(x.shape))


def _string_normalizer(r, node, x):
    x = _strs(x)
    action = node.attr("case_change_action", "NONE", choices=("NONE", "LOWER", "UPPER"))
    sensitive = node.attr("is_case_sensitive", 0)
    stops = set(node.attr("stopwords", []))
    low_stops = {s.lower() for s in stops}
    change = {"NONE": lambda s: s, "LOWER": str.lower, "UPPER": str.upper}[action]
    keep = [s for s in x.reshape(-1) if not (s in stops if sensitive else s.lower() in low_stops)]
    keep = [change(s) for s in keep] or [""]
    return np.array(keep, dtype=object).reshape((1, -1) if x.ndim == 2 else (-1,))


def _label_encoder(r, node, x):
    def attr_vals(prefix):
        for suffix in ("strings", "int64s", "floats"):
            if f"{prefix}_{suffix}" in node.attrs:
                return list(node.attrs[f"{prefix}_{suffix}"])
        if f"{prefix}_tensor" in node.attrs:
            return node.attrs[f"{prefix}_tensor"].reshape(-1).tolist()
        return None

    keys, vals = attr_vals("keys"), attr_vals("values")
    out_t = node.out_types[0].elem_type if node.out_types and node.out_types[0] else None
    if "default_tensor" in node.attrs:
        default = node.attrs["default_tensor"].reshape(-1)[0]
        default = default.item() if hasattr(default, "item") else default
    elif out_t == STRING:
        default = node.attr("default_string", "_Unused")
    elif out_t in (1, 11):
        default = node.attr("default_float", -0.0)
    else:
        default = node.attr("default_int64", -1)
    table = dict(zip(keys, vals))
    arr = x if isinstance(x, np.ndarray) else x.numpy()
    out = np.array([table.get(k.item() if hasattr(k, "item") else k, default) for k in arr.reshape(-1)], dtype=object)
    out = out.reshape(arr.shape)
    return out if out_t == STRING else value_to_tensor(out.astype(np_dtype(out_t)))


def _binarizer(r, node, x):
    return (x > node.attr("threshold", 0.0)).cast(x.dtype)


def _array_feature_extractor(r, node, x, idx):
    return x[..., idx.reshape(-1).cast(dtypes.int64)]


# ***** data-dependent shapes, read back to the host *****


def _unique(r, node, x):
    arr = x.numpy()
    a = node.attr("axis", None)
    srt = node.attr("sorted", 1)
    if a is None:
        arr = arr.reshape(-1)
        a = 0
    a = axis_of(a, arr.ndim, node)
    moved = np.moveaxis(arr, a, 0).reshape(arr.shape[a], -1)
    _, first, inverse, counts = np.unique(moved, axis=0, return_index=True, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    if not srt:  # order of first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        first, counts, inverse = first[order], counts[order], rank[inverse]
    y = np.take(arr, first, axis=a)
    return (value_to_tensor(y), Tensor(first.astype(np.int64)), Tensor(inverse.astype(np.int64)),
            Tensor(counts.astype(np.int64)))  # fmt: skip


def _nms(r, node, boxes, scores, max_out=None, iou_th=None, score_th=None):
    b, s = boxes.numpy().astype(np.float64), scores.numpy().astype(np.float64)
    mo = int(scalar(max_out)) if max_out is not None and max_out.numel() else 0
    it = float(scalar(iou_th)) if iou_th is not None and iou_th.numel() else 0.0
    st = float(scalar(score_th)) if score_th is not None and score_th.numel() else None
    center = node.attr("center_point_box", 0)
    out = []
    for bi in range(s.shape[0]):
        bx = b[bi]
        if center:
            half_w, half_h = bx[:, 2] / 2, bx[:, 3] / 2
            bx = np.stack([bx[:, 1] - half_h, bx[:, 0] - half_w, bx[:, 1] + half_h, bx[:, 0] + half_w], 1)
        y1, x1 = np.minimum(bx[:, 0], bx[:, 2]), np.minimum(bx[:, 1], bx[:, 3])
        y2, x2 = np.maximum(bx[:, 0], bx[:, 2]), np.maximum(bx[:, 1], bx[:, 3])
        area = (y2 - y1) * (x2 - x1)
        for ci in range(s.shape[1]):
            sc = s[bi, ci]
            order = [i for i in np.argsort(-sc, kind="stable") if st is None or sc[i] > st]
            kept: list[int] = []
            for i in order:
                if len(kept) >= mo:
                    break
                ok = True
                for j in kept:
                    ih = max(0.0, min(y2[i], y2[j]) - max(y1[i], y1[j]))
                    iw = max(0.0, min(x2[i], x2[j]) - max(x1[i], x1[j]))
                    inter = ih * iw
                    union = area[i] + area[j] - inter
                    if union > 0 and inter / union > it:
                        ok = False
                        break
                if ok:
                    kept.append(i)
            out += [[bi, ci, k] for k in kept]
    return Tensor(np.array(out, np.int64).reshape(-1, 3))


def _det(r, node, x):
    """A host op: numpy's LU determinant of the realized input."""
    arr = x.numpy()
    return value_to_tensor(np.linalg.det(arr.astype(np.float64)).astype(arr.dtype))


# ***** the registry: (domain, op type) -> implementation *****

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
op("Shape")(_shape)
op("Size")(_size)
op("Reshape")(_reshape)
op("Flatten")(_flatten)
op("Squeeze")(_squeeze)
op("Unsqueeze")(_unsqueeze)
op("Transpose")(_transpose)
op("Concat")(_concat)
op("Split")(_split)
op("Slice")(_slice)
op("Expand")(_expand)
op("Tile")(_tile)
op("Pad")(_pad)
op("ConstantOfShape")(_constant_of_shape)
op("Constant")(_constant)
op("Range")(_range)
op("Gather")(_gather)
op("GatherElements")(_gather_elements)
op("GatherND")(_gather_nd)
op("ScatterND")(_scatter_nd)
op("ScatterElements", "Scatter")(_scatter_elements)
op("EyeLike")(_eyelike)
op("Trilu")(_trilu)
op("OneHot")(_onehot)
op("DepthToSpace")(_depth_to_space)
op("SpaceToDepth")(_space_to_depth)
op("Compress")(_compress)
op("ReverseSequence")(_reverse_sequence)
op("CumSum", "CumProd")(_cumsum)
op("TopK")(_topk)
op("NonZero")(_nonzero)
op("Einsum")(_einsum)
op("ArgMax", "ArgMin")(_argmax)
op("MatMul")(_matmul)
op("Gemm")(_gemm)
op("Conv")(_conv)
op("ConvTranspose")(_conv_transpose)
op("MaxPool")(_maxpool)
op("AveragePool")(_avgpool)
op("LpPool")(_lppool)
op("GlobalAveragePool")(_gap)
op("GlobalMaxPool")(_gmp)
op("GlobalLpPool")(_glp)
op("MaxUnpool")(_maxunpool)
op("BatchNormalization")(_batchnorm)
op("InstanceNormalization")(_instancenorm)
op("LayerNormalization")(_layernorm)
op("RMSNormalization")(_rmsnorm)
op("GroupNormalization")(_groupnorm)
op("LpNormalization")(_lpnorm)
op("MeanVarianceNormalization")(_mvn)
op("LRN")(_lrn)
op("Dropout")(_dropout)
op("QuantizeLinear")(_quantize)
op("DequantizeLinear")(_dequantize)
op("DynamicQuantizeLinear")(_dyn_quant)
op("MatMulInteger")(_matmul_int)
op("ConvInteger")(_conv_int)
op("QLinearMatMul")(_qlinear_matmul)
op("QLinearConv")(_qlinear_conv)
op("SequenceEmpty")(_seq_empty)
op("SequenceConstruct")(_seq_construct)
op("SequenceLength")(_seq_len)
op("SequenceAt")(_seq_at)
op("SequenceInsert")(_seq_insert)
op("SequenceErase")(_seq_erase)
op("ConcatFromSequence")(_concat_from_seq)
op("SplitToSequence")(_split_to_seq)
op("Optional")(_optional)
op("OptionalHasElement")(_opt_has)
op("OptionalGetElement")(_opt_get)
op("If")(_if)
op("Loop")(_loop)
op("Scan")(_scan)
op("Attention")(_attention)
op("Resize", "Upsample")(_resize)
op("NegativeLogLikelihoodLoss")(_nll_loss)
op("SoftmaxCrossEntropyLoss")(_sce_loss)
op("RNN")(_rnn)
op("GRU")(_gru)
op("LSTM")(_lstm)
op("Adagrad", domain=_TRAINING)(_adagrad)
op("Momentum", domain=_TRAINING)(_momentum)
op("Adam", domain=_TRAINING)(_adam)
op("CenterCropPad")(_center_crop_pad)
op("Col2Im")(_col2im)
op("AffineGrid")(_affine_grid)
op("BitCast")(_bitcast)
op("SwiGLU")(_swiglu)
op("TensorScatter")(_tensor_scatter)
op("RotaryEmbedding")(_rotary)
op("StringConcat")(_string_concat)
op("RegexFullMatch")(_regex_full_match)
op("StringSplit")(_string_split)
op("StringNormalizer")(_string_normalizer)
op("LabelEncoder", domain="ai.onnx.ml")(_label_encoder)
op("Binarizer", domain="ai.onnx.ml")(_binarizer)
op("ArrayFeatureExtractor", domain="ai.onnx.ml")(_array_feature_extractor)
op("Unique")(_unique)
op("NonMaxSuppression")(_nms)
op("Det")(_det)


def _reflect(v: Tensor, lo: float, hi: float) -> Tensor:
    """Fold coordinates outside [lo, hi] back in, as a mirror (ONNX GridSample's reflection padding)."""
    rng = hi - lo
    below, above = lo - v, v - hi
    nb, na = (below / rng).trunc(), (above / rng).trunc()
    rb, ra = below - nb * rng, above - na * rng
    from_below = (nb.mod(2) == 0).where(lo + rb, hi - rb)
    from_above = (na.mod(2) == 0).where(hi - ra, lo + ra)
    return (v < lo).where(from_below, (v > hi).where(from_above, v))


def _cubic_weights(t: Tensor, a: float = -0.75) -> list[Tensor]:
    def near(x):
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _grid_sample(r, node, x, grid):
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(node.attr("mode", "linear"), node.attr("mode", "linear"))
    if mode not in ("linear", "nearest", "cubic"):
        raise node.fail(f"attribute mode={mode!r} is not supported", unsupported=True)
    pad = node.attr("padding_mode", "zeros", choices=("zeros", "border", "reflection"))
    ac = bool(node.attr("align_corners", 0))
    nd, dims = x.ndim - 2, x.shape[2:]
    n, c = x.shape[:2]
    out_sp = grid.shape[1:-1]
    g = grid.cast(dtypes.float32).reshape(n, -1, nd)
    taps_per_dim = []
    for i, d in enumerate(dims):
        v = g[:, :, nd - 1 - i]
        v = (v + 1) / 2 * (d - 1) if ac else ((v + 1) * d - 1) / 2
        if mode == "nearest":
            v = v.round()
        lo, hi = (0.0, d - 1.0) if ac else (-0.5, d - 0.5)
        if pad == "border":
            v = v.clip(0, d - 1)
        elif pad == "reflection":
            v = _reflect(v, lo, hi)
        if mode == "nearest":
            taps = [(v.trunc(), None)]
        else:
            x0 = v.floor()
            t = v - x0
            if mode == "linear":
                taps = [(x0, 1 - t), (x0 + 1, t)]
            else:
                taps = list(zip([x0 - 1, x0, x0 + 1, x0 + 2], _cubic_weights(t)))
        fixed = []
        for idx, w in taps:
            if pad == "zeros":
                valid = (idx >= 0) & (idx <= d - 1)
                w = valid.cast(dtypes.float32) if w is None else valid.where(w, 0)
            elif pad == "border":
                idx = idx.clip(0, d - 1)
            else:
                idx = _reflect(idx, lo, hi).trunc().clip(0, d - 1)
            fixed.append((idx.clip(0, d - 1).cast(dtypes.int64), w))
        taps_per_dim.append(fixed)
    xf = x.cast(dtypes.float32).reshape(n, c, -1)
    p = g.shape[1]
    acc = None
    for combo in np.ndindex(*[len(t) for t in taps_per_dim]):
        flat, weight = None, None
        for i, k in enumerate(combo):
            idx, w = taps_per_dim[i][k]
            term = idx * int(np.prod(dims[i + 1 :]))
            flat = term if flat is None else flat + term
            if w is not None:
                weight = w if weight is None else weight * w
        val = xf.gather(2, flat.reshape(n, 1, p).expand(n, c, p))
        if weight is not None:
            val = val * weight.reshape(n, 1, p)
        acc = val if acc is None else acc + val
    return acc.reshape(n, c, *out_sp).cast(x.dtype)


op("GridSample")(_grid_sample)


def _causal_conv_with_state(r, node, x, w, b=None, past=None):
    act = node.attr("activation", "none", choices=("none", "silu", "swish"))
    bsz, ch, _ = x.shape
    k = w.shape[2]
    if past is None:
        past = Tensor.zeros(bsz, ch, k - 1, dtype=x.dtype)
    padded = past.cat(x, dim=2) if k > 1 else x
    y = padded.conv2d(w, b, groups=ch).cast(x.dtype)
    if act != "none":
        yf = y.cast(dtypes.float32)
        y = (yf * yf.sigmoid()).cast(x.dtype)
    return y, padded[:, :, padded.shape[2] - (k - 1) :]


op("CausalConvWithState")(_causal_conv_with_state)


def _linear_attention(r, node, q, k, v, past=None, decay=None, beta=None):
    rule = node.attr("update_rule", "gated_delta", choices=("linear", "gated", "delta", "gated_delta"))
    hq, hkv = node.attr("q_num_heads"), node.attr("kv_num_heads")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    b, t, _ = q.shape
    dk, dv = q.shape[-1] // hq, v.shape[-1] // hkv
    f32 = dtypes.float32

    def heads(x, h):
        return x.reshape(b, t, h, -1).permute(0, 2, 1, 3).cast(f32)

    q4, k4, v4 = heads(q, hq), heads(k, hkv), heads(v, hkv)
    if gating:
        decay4 = heads(decay, hkv)  # (b, hkv, t, 1 or dk)
    if delta:
        beta4 = beta.reshape(b, t, beta.shape[-1], 1).permute(0, 2, 1, 3).cast(f32)
    state = past.cast(f32) if past is not None else Tensor.zeros(b, hkv, dk, dv, dtype=f32)
    scale = node.attr("scale", 0.0) or 1.0 / math.sqrt(dk)
    outs = []
    for i in range(t):
        k_t, v_t = k4[:, :, i, :], v4[:, :, i, :]
        if gating:
            state = state * decay4[:, :, i, :].exp().unsqueeze(-1)
        if delta:
            retrieved = (state * k_t.unsqueeze(-1)).sum(2)
            v_t = beta4[:, :, i, :] * (v_t - retrieved)
        state = state + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
        read = state.repeat_interleave(hq // hkv, 1) if hq != hkv else state
        outs.append((q4[:, :, i, :].unsqueeze(-1) * read).sum(2) * scale)
    out = Tensor.stack(*outs, dim=2).permute(0, 2, 1, 3).reshape(b, t, hq * dv).cast(q.dtype)
    return out, state.cast(past.dtype if past is not None else q.dtype)


op("LinearAttention")(_linear_attention)


def _sequence_map(r, node, seq, *extra):
    g = _subgraph(r, node.attr("body"))
    outs: list[list] = [[] for _ in g.outputs]
    for i in range(len(seq)):
        env = dict(r._scope)
        env[g.inputs[0]] = seq[i]
        for name, v in zip(g.inputs[1:], extra):
            env[name] = v[i] if isinstance(v, list) else v
        env = r.run_graph(g, env)
        for lst, o in zip(outs, g.outputs):
            lst.append(env[o])
    return tuple(outs)


def _dft(r, node, x, dft_length=None, axis=None):
    """A DFT as a matmul with the (cos, sin) matrix of the transform; the last dim holds (real[, imaginary])."""
    if node.opset < 20:
        a = node.attr("axis", 1)
    else:
        a = int(scalar(axis)) if axis is not None and axis.numel() else -2
    a = axis_of(a, x.ndim, node)
    if a == x.ndim - 1:
        raise node.fail("the transform axis can't be the last (real/imaginary) dim")
    inverse, onesided = node.attr("inverse", 0), node.attr("onesided", 0)
    n_in = x.shape[a]
    xf = x.cast(dtypes.float64) if x.dtype == dtypes.float64 else x.cast(dtypes.float32)
    if xf.shape[-1] == 1:
        xf = xf.cat(xf.zeros_like(), dim=-1)
    if inverse and onesided:  # a half spectrum: rebuild the full Hermitian one, the result is real
        n = int(scalar(dft_length)) if dft_length is not None and dft_length.numel() else 2 * (n_in - 1)
        src = [k if k < n_in else n - k for k in range(n)]
        full = xf[(slice(None),) * a + (const(src, dtypes.int64),)]
        conj = const([1.0 if k < n_in else -1.0 for k in range(n)], xf.dtype).reshape(
            [n if i == a else 1 for i in range(x.ndim - 1)] + [1]
        )
        full = full * Tensor.stack(conj * 0 + 1, conj, dim=-1).reshape(conj.shape[:-1] + (2,))
        y = _dft_matmul(full, a, n, n, True)
        return y[..., :1].cast(x.dtype)
    n = int(scalar(dft_length)) if dft_length is not None and dft_length.numel() else n_in
    if n != n_in:  # pad or crop the signal to dft_length
        xf = (
            xf.pad([(0, n - n_in) if i == a else None for i in range(x.ndim)])
            if n > n_in
            else xf.shrink(tuple((0, n) if i == a else None for i in range(x.ndim)))
        )
    return _dft_matmul(xf, a, n, n // 2 + 1 if onesided else n, bool(inverse)).cast(x.dtype)


def _dft_matmul(xf: Tensor, a: int, n: int, n_out: int, inverse: bool) -> Tensor:
    k = np.arange(n_out)[:, None] * np.arange(n)[None, :]
    ang = 2 * np.pi * k / n * (1 if inverse else -1)
    cos, sin = const(np.cos(ang), xf.dtype), const(np.sin(ang), xf.dtype)
    moved = xf.transpose(a, -2)  # (..., n, 2)
    re, im = moved[..., 0], moved[..., 1]  # (..., n)
    out = Tensor.stack(re.matmul(cos.T) - im.matmul(sin.T), re.matmul(sin.T) + im.matmul(cos.T), dim=-1)
    return (out / n if inverse else out).transpose(a, -2)


op("SequenceMap")(_sequence_map)
op("DFT")(_dft)


def _stft(r, node, signal, frame_step, window=None, frame_length=None):
    step = int(scalar(frame_step))
    n = int(scalar(frame_length)) if frame_length is not None and frame_length.numel() else window.shape[0]
    length = signal.shape[1]
    frames = (length - n) // step + 1
    idx = np.arange(frames)[:, None] * step + np.arange(n)[None, :]
    xf = signal.cast(dtypes.float64) if signal.dtype == dtypes.float64 else signal.cast(dtypes.float32)
    if xf.shape[-1] == 1:
        xf = xf.cat(xf.zeros_like(), dim=-1)
    framed = xf[:, const(idx.reshape(-1), dtypes.int64)].reshape(xf.shape[0], frames, n, 2)
    if window is not None:
        framed = framed * window.cast(xf.dtype).reshape(1, 1, n, 1)
    onesided = node.attr("onesided", 1)
    return _dft_matmul(framed, 2, n, n // 2 + 1 if onesided else n, False).cast(signal.dtype)


op("STFT")(_stft)
