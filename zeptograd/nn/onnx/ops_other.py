"""Quantization, sequences and control flow, training, signal, newer transformer ops (strings and ops with
data-dependent shapes live in ops_host.py)."""

from __future__ import annotations

import math

import numpy as np

from zeptograd.dtype import dtypes
from zeptograd.tensor import Tensor

from . import EMULATED, ONNX_DTYPES, Node, np_dtype, to_emulated, value_to_tensor
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
