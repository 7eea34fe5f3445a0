"""Host ops: strings (zeptograd has no string dtype; the values are numpy object arrays) and ops whose output
shapes depend on data (Unique, NonMaxSuppression, DFT, TfIdfVectorizer, ...), read back to the host."""

from __future__ import annotations

import math

import numpy as np

from zeptograd.dtype import dtypes
from zeptograd.tensor import Tensor

from . import ONNX_DTYPES, STRING, np_dtype, value_to_tensor
from .ops_other import _subgraph
from .oputil import axis_of, const, op, scalar

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
