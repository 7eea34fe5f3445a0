"""Network ops: matmul, convolution, pooling, normalization, attention, resize, losses, recurrent cells,
sampling."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from zeptograd.dtype import dtypes
from zeptograd.tensor import Tensor

from . import ONNX_DTYPES, Node
from .oputil import axis_of, const, floats, ints, op, scalar

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


def _roi_align(r, node, x, rois, batch_idx):
    """Sample positions and bilinear weights from the (small) rois on the host; the gathers run on the device."""
    mode = node.attr("mode", "avg", choices=("avg", "max"))
    oh, ow = node.attr("output_height", 1), node.attr("output_width", 1)
    ratio, scale = node.attr("sampling_ratio", 0), node.attr("spatial_scale", 1.0)
    half = node.attr("coordinate_transformation_mode", "half_pixel", choices=("half_pixel", "output_half_pixel"))
    off = 0.5 if half == "half_pixel" else 0.0
    n, c, h, w = x.shape
    boxes = rois.numpy().astype(np.float64)
    n_roi = boxes.shape[0]
    per_roi, grids = [], []
    for x1, y1, x2, y2 in boxes * scale - off:
        rw, rh = x2 - x1, y2 - y1
        if off == 0.0:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        gh = ratio if ratio > 0 else int(np.ceil(rh / oh))
        gw = ratio if ratio > 0 else int(np.ceil(rw / ow))
        per_roi.append((x1, y1, rw / ow, rh / oh, gh, gw))
        grids.append(gh * gw)
    s_max = max(max(grids), 1)
    pos = np.zeros((n_roi, oh, ow, s_max, 4), np.int64)
    wts = np.zeros((n_roi, oh, ow, s_max, 4), np.float64)
    valid = np.zeros((n_roi, oh, ow, s_max), bool)
    for ri, (x1, y1, bw, bh, gh, gw) in enumerate(per_roi):
        for ph, pw, iy, ix in np.ndindex(oh, ow, gh, gw):
            si = iy * gw + ix
            valid[ri, ph, pw, si] = True
            yy = y1 + ph * bh + (iy + 0.5) * bh / gh
            xx = x1 + pw * bw + (ix + 0.5) * bw / gw
            if yy < -1.0 or yy > h or xx < -1.0 or xx > w:
                continue
            yy, xx = max(yy, 0.0), max(xx, 0.0)
            yl, xl = int(yy), int(xx)
            if yl >= h - 1:  # on the last row: both taps are that row
                yl = yh = h - 1
                yy = yl
            else:
                yh = yl + 1
            if xl >= w - 1:
                xl = xh = w - 1
                xx = xl
            else:
                xh = xl + 1
            ly, lx = yy - yl, xx - xl
            pos[ri, ph, pw, si] = [yl * w + xl, yl * w + xh, yh * w + xl, yh * w + xh]
            wts[ri, ph, pw, si] = [(1 - ly) * (1 - lx), (1 - ly) * lx, ly * (1 - lx), ly * lx]
    xr = x.reshape(n, c, h * w)[batch_idx.cast(dtypes.int64)]  # (R, C, HW)
    k = oh * ow * s_max * 4
    vals = xr.gather(2, const(pos.reshape(n_roi, 1, k), dtypes.int64).expand(n_roi, c, k))
    vals = (vals * const(wts.reshape(n_roi, 1, k), x.dtype)).reshape(n_roi, c, oh, ow, s_max, 4)
    if mode == "avg":
        count = const(np.maximum(np.array(grids), 1).reshape(n_roi, 1, 1, 1), x.dtype)
        return vals.sum((-1, -2)) / count
    best = vals.max(-1)
    return const(valid.reshape(n_roi, 1, oh, ow, s_max), dtypes.bool).where(best, -math.inf).max(-1)


def _deform_conv(r, node, x, w, offset, b=None, mask=None):
    """Each kernel tap samples x bilinearly at its offset position (zeros outside), then a grouped matmul."""
    if x.ndim != 4:
        raise node.fail("only 2-d DeformConv is supported", unsupported=True)
    n, ic, ih, iw = x.shape
    oc, icg, kh, kw = w.shape
    groups, og = node.attr("group", 1), node.attr("offset_group", 1)
    sh, sw = node.attr("strides", [1, 1])
    dh, dw = node.attr("dilations", [1, 1])
    pads = node.attr("pads", [0, 0, 0, 0])
    oh, ow = offset.shape[2:]
    k = kh * kw
    off = offset.cast(dtypes.float32).reshape(n, og, k, 2, oh, ow)
    base_h = const(
        ((np.arange(oh) * sh - pads[0])[None, :] + (np.arange(kh) * dh)[:, None]).repeat(kw, 0), dtypes.float32
    )
    base_w = const(((np.arange(ow) * sw - pads[1])[None, :] + np.tile(np.arange(kw) * dw, kh)[:, None]), dtypes.float32)
    ph = off[:, :, :, 0] + base_h.reshape(1, 1, k, oh, 1)  # (n, og, k, oh, ow)
    pw = off[:, :, :, 1] + base_w.reshape(1, 1, k, 1, ow)
    h0, w0 = ph.floor(), pw.floor()
    lh, lw = ph - h0, pw - w0
    xg = x.cast(dtypes.float32).reshape(n, og, ic // og, ih * iw)
    m = k * oh * ow
    cols = None
    for dy, dx, wt in ((0, 0, (1 - lh) * (1 - lw)), (0, 1, (1 - lh) * lw), (1, 0, lh * (1 - lw)), (1, 1, lh * lw)):
        hh, ww = h0 + dy, w0 + dx
        inside = (hh >= 0) & (hh <= ih - 1) & (ww >= 0) & (ww <= iw - 1)
        flat = (hh.clip(0, ih - 1) * iw + ww.clip(0, iw - 1)).cast(dtypes.int64).reshape(n, og, 1, m)
        val = xg.gather(3, flat.expand(n, og, ic // og, m)) * inside.where(wt, 0).reshape(n, og, 1, m)
        cols = val if cols is None else cols + val
    if mask is not None:
        cols = cols * mask.cast(dtypes.float32).reshape(n, og, 1, m)
    cols = cols.reshape(n, groups, icg * k, oh * ow)  # channels (og, ic/og) are the channels (groups, icg)
    y = w.cast(dtypes.float32).reshape(1, groups, oc // groups, icg * k).matmul(cols).reshape(n, oc, oh, ow)
    if b is not None:
        y = y + b.cast(dtypes.float32).reshape(1, -1, 1, 1)
    return y.cast(x.dtype)


# ***** registered as (domain, op type) -> implementation *****

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
op("Attention")(_attention)
op("Resize", "Upsample")(_resize)
op("NegativeLogLikelihoodLoss")(_nll_loss)
op("SoftmaxCrossEntropyLoss")(_sce_loss)
op("RNN")(_rnn)
op("GRU")(_gru)
op("LSTM")(_lstm)
op("GridSample")(_grid_sample)
op("CausalConvWithState")(_causal_conv_with_state)
op("LinearAttention")(_linear_attention)
op("RoiAlign")(_roi_align)
op("DeformConv")(_deform_conv)
