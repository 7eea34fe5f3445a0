"""Quantization, sequences and control flow, training, signal, strings and host ops."""

from __future__ import annotations

import math

import numpy as np

from zeptograd.dtype import dtypes
from zeptograd.tensor import Tensor

from . import EMULATED, ONNX_DTYPES, STRING, Node, np_dtype, to_emulated, value_to_tensor
from .ops_math import cast_to
from .ops_nn import _conv
from .oputil import axis_of, const, ints, op, scalar

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
    if node.opset < 9:  # Scan-8: a sequence_lens input first, and every input has a batch axis first
        seq_lens, args = args[0], args[1:]
        n_state = len(args) - n_scan_in
        dirs = node.attr("directions", [0] * n_scan_in)
        if seq_lens is not None and set(ints(seq_lens)) != {args[n_state].shape[1]}:
            raise node.fail("sequence_lens shorter than the sequence is not supported", unsupported=True)
        per_batch = [
            _scan_loop(r, node, g, [a[b] for a in args[:n_state]], [a[b] for a in args[n_state:]], [0] * n_scan_in,
                       dirs, [0] * (len(g.outputs) - n_state), [0] * (len(g.outputs) - n_state))
            for b in range(args[0].shape[0])
        ]  # fmt: skip
        return tuple(Tensor.stack(*vals, dim=0) for vals in zip(*per_batch))
    n_state = len(args) - n_scan_in
    n_scan_out = len(g.outputs) - n_state
    return _scan_loop(
        r, node, g, list(args[:n_state]), list(args[n_state:]), node.attr("scan_input_axes", [0] * n_scan_in),
        node.attr("scan_input_directions", [0] * n_scan_in), node.attr("scan_output_axes", [0] * n_scan_out),
        node.attr("scan_output_directions", [0] * n_scan_out),
    )  # fmt: skip


def _scan_loop(r, node, g, state, xs, in_axes, in_dirs, out_axes, out_dirs):
    n_state = len(state)
    n_scan_out = len(g.outputs) - n_state
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


def _mel_weight_matrix(r, node, num_mel_bins, dft_length, sample_rate, lower_hz, upper_hz):
    """A constant of the scalar inputs (triangular filters on the mel scale), built on the host as the spec defines."""
    n_mel, n_dft, rate = int(scalar(num_mel_bins)), int(scalar(dft_length)), scalar(sample_rate)
    lo_mel = 2595 * np.log1p(scalar(lower_hz) / 700) / np.log(10)
    hi_mel = 2595 * np.log1p(scalar(upper_hz) / 700) / np.log(10)
    edges = np.arange(n_mel + 2) * ((hi_mel - lo_mel) / (n_mel + 2)) + lo_mel
    edges = (((n_dft + 1) * (700 * np.expm1(edges / 2595 * np.log(10)))) // rate).astype(int)
    out = np.zeros((n_dft // 2 + 1, n_mel))
    for i in range(n_mel):
        left, center, right = edges[i], edges[i + 1], edges[i + 2]
        if center == left:
            out[center, i] = 1
        else:
            out[left : center + 1, i] = (np.arange(left, center + 1) - left) / (center - left)
        if right > center:
            out[center:right, i] = (right - np.arange(center, right)) / (right - center)
    return Tensor(out.astype(np_dtype(node.attr("output_datatype", 1))))


def _tfidf_vectorizer(r, node, x):
    """A host op: n-gram (with skips) counts of int or string tokens against the model's pool."""
    mode = node.attr("mode", choices=("TF", "IDF", "TFIDF"))
    lo, hi, max_skip = node.attr("min_gram_length"), node.attr("max_gram_length"), node.attr("max_skip_count")
    starts, indexes = list(node.attr("ngram_counts")), list(node.attr("ngram_indexes"))
    pool = list(node.attr("pool_int64s", None) or node.attr("pool_strings", []))
    weights = list(node.attr("weights", [1.0] * len(indexes)))
    table: dict[tuple, int] = {}  # n-gram -> output index
    ordinal = 0
    for k, start in enumerate(starts):
        gram, end = k + 1, starts[k + 1] if k + 1 < len(starts) else len(pool)
        for i in range(start, end, gram):
            table[tuple(pool[i : i + gram])] = indexes[ordinal]
            ordinal += 1
    arr = x.numpy() if isinstance(x, Tensor) else np.asarray(x, dtype=object)
    rows = arr.reshape(1, -1) if arr.ndim == 1 else arr
    width = max(indexes) + 1
    counts = np.zeros((rows.shape[0], width), np.float32)
    for b, row in enumerate(rows):
        toks = [t.item() if hasattr(t, "item") else t for t in row]
        for gram in range(lo, hi + 1):
            for skip in range(max_skip + 1 if gram > 1 else 1):
                step = skip + 1
                for i in range(len(toks) - (gram - 1) * step):
                    hit = table.get(tuple(toks[i + j * step] for j in range(gram)))
                    if hit is not None:
                        counts[b, hit] += 1
    w = np.zeros(width, np.float32)
    for ordinal_, idx in enumerate(indexes):
        w[idx] = weights[ordinal_]
    out = counts if mode == "TF" else (counts > 0) * w if mode == "IDF" else counts * w
    return Tensor(out.reshape(-1) if arr.ndim == 1 else out)


def _flex_attention(r, node, q, k, v):
    """ai.onnx.preview FlexAttention: attention whose scores and probabilities pass through optional subgraphs."""
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv:
        k, v = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
    scale = node.attr("scale", None)
    s = const(math.sqrt(1 / math.sqrt(q.shape[3]) if scale is None else scale), dtypes.float32).cast(q.dtype)
    sp = node.attr("softmax_precision", None)
    cdt = ONNX_DTYPES[sp] if sp is not None else dtypes.float32 if q.dtype.itemsize < 4 else q.dtype
    scores = (q * s).matmul((k * s).transpose(-1, -2)).cast(cdt)

    def apply(name, t):
        if name not in node.attrs:
            return t
        g = _subgraph(r, node.attrs[name])
        env = dict(r._scope)
        env[g.inputs[0]] = t
        return r.run_graph(g, env)[g.outputs[0]].cast(cdt)

    scores = apply("score_mod", scores)
    e = (scores - scores.max(-1, keepdim=True)).exp()
    probs = apply("prob_mod", e / e.sum(-1, keepdim=True))
    return probs.matmul(v.cast(cdt)).cast(v.dtype)


def _tree_ensemble(r, node, x):
    """ai.onnx.ml TreeEnsemble, a host op: each row walks each tree; leaves' weights aggregate per target."""
    modes, splits, feats = node.attr("nodes_modes"), node.attr("nodes_splits"), node.attr("nodes_featureids")
    true_ids, false_ids = node.attr("nodes_truenodeids"), node.attr("nodes_falsenodeids")
    true_leaf, false_leaf = node.attr("nodes_trueleafs"), node.attr("nodes_falseleafs")
    leaf_w, leaf_t = node.attr("leaf_weights"), node.attr("leaf_targetids")
    missing_true = node.attr("nodes_missing_value_tracks_true", [0] * len(modes))
    agg = node.attr("aggregate_function", 1)
    if agg not in (0, 1, 2, 3):
        raise node.fail(f"attribute aggregate_function={agg} is not supported", unsupported=True)
    splits, leaf_w = np.asarray(splits, np.float64), np.asarray(leaf_w, np.float64)  # lists or tensor attributes
    members_iter = iter(np.asarray(node.attr("membership_values", []), np.float64).tolist())
    members: dict[int, set] = {}
    stack = [(root, False) for root in reversed(node.attr("tree_roots"))]
    while stack:  # the members of MEMBER nodes, in the order a depth-first walk (true branch first) meets them
        i, leaf = stack.pop()
        if leaf:
            continue
        if modes[i] == 6:
            members[i] = set()
            while (m := next(members_iter, math.nan)) and not math.isnan(m):
                members[i].add(m)
        stack += [(false_ids[i], bool(false_leaf[i])), (true_ids[i], bool(true_leaf[i]))]
    cmp = [np.less_equal, np.less, np.greater_equal, np.greater, np.equal, np.not_equal]
    arr = x.numpy().astype(np.float64)
    n_targets = node.attr("n_targets")
    init = {0: 0.0, 1: 0.0, 2: np.finfo(arr.dtype).max, 3: np.finfo(arr.dtype).min}[agg]
    out = np.full((arr.shape[0], n_targets), init)
    roots = node.attr("tree_roots")
    for b, row in enumerate(arr):
        for root in roots:
            i, leaf = root, bool(true_leaf[root] and false_leaf[root] and true_ids[root] == false_ids[root])
            while not leaf:
                v = row[feats[i]]
                hit = v in members[i] if modes[i] == 6 else bool(cmp[modes[i]](v, splits[i]))
                hit = hit or bool(missing_true[i] and np.isnan(v))
                i, leaf = (true_ids[i], bool(true_leaf[i])) if hit else (false_ids[i], bool(false_leaf[i]))
            t, w = leaf_t[i], leaf_w[i]
            if agg in (0, 1):
                out[b, t] += w / len(roots) if agg == 0 else w
            else:
                out[b, t] = min(out[b, t], w) if agg == 2 else max(out[b, t], w)
    return Tensor(out).cast(x.dtype)


# ***** registered as (domain, op type) -> implementation *****

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
op("SequenceMap")(_sequence_map)
op("DFT")(_dft)
op("STFT")(_stft)
op("MelWeightMatrix")(_mel_weight_matrix)
op("TfIdfVectorizer")(_tfidf_vectorizer)
op("FlexAttention", domain="ai.onnx.preview")(_flex_attention)
op("TreeEnsemble", domain="ai.onnx.ml")(_tree_ensemble)
