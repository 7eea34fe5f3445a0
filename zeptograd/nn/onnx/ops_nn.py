"""Network ops: matmul, convolution, pooling, normalization, attention, losses (resampling ops live in
ops_resample.py, recurrent ones in ops_recurrent.py)."""

from __future__ import annotations

import math

import numpy as np

from zeptograd.dtype import dtypes
from zeptograd.tensor import Tensor

from . import ONNX_DTYPES, Node
from .oputil import axis_of, const, ints, op, scalar

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
op("NegativeLogLikelihoodLoss")(_nll_loss)
op("SoftmaxCrossEntropyLoss")(_sce_loss)
