"""Resampling ops: Resize (Upsample), GridSample, RoiAlign, DeformConv."""

from __future__ import annotations

import math

import numpy as np

from zeptograd.dtype import dtypes
from zeptograd.tensor import Tensor

from . import Node
from .oputil import axis_of, const, floats, ints, op

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


# ***** sampling *****


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

op("Resize", "Upsample")(_resize)
op("GridSample")(_grid_sample)
op("RoiAlign")(_roi_align)
op("DeformConv")(_deform_conv)
