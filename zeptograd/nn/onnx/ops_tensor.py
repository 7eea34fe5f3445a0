"""Shape, movement, gather and scatter ops."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from zeptograd.dtype import dtypes
from zeptograd.tensor import Tensor

from . import ONNX_DTYPES, Node, value_to_tensor
from .oputil import _np, axis_of, bexpand, broadcast_shape, const, ints, is_float, op, scalar

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


# ***** registered as (domain, op type) -> implementation *****

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
