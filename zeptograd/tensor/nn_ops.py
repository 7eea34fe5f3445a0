"""Neural-network ops: products and einsum, convolutions and pooling (sliding windows + reduces), normalization,
attention, dropout and losses. All are compositions of the ops in the other modules."""

from __future__ import annotations

import functools
import math
import string
from typing import TYPE_CHECKING, Callable, Sequence

from zeptograd.dtype import DTypeLike, dtypes, least_upper_dtype, to_dtype
from zeptograd.gradient import with_gradient
from zeptograd.helpers import ArgumentError, ArgumentTypeError
from zeptograd.tensor.helpers import argfix, argsort, flat_to_grouped, make_tuple, normalize_axis, resolve_pool_pads
from zeptograd.tensor.indexing import _index_values, check_label_bounds, check_one_hot_bounds, last_hit
from zeptograd.uop.ops import Ops

if TYPE_CHECKING:
    from zeptograd.tensor import Tensor


def _uint8_linear_taps(n_in: int, n_out: int, align_corners: bool) -> tuple[list[int], list[tuple[int, int]], int]:
    """torch's int16 bilinear taps for uint8 (aten's _compute_index_ranges_int16_weights): per output, the first
    input index and the two weights, and the fixed-point precision (bits) of the weights."""
    if align_corners:
        scale = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    else:
        scale = n_in / n_out
    delta = 0.5 if align_corners else 0.0
    firsts, taps = [], []
    for i in range(n_out):
        center = scale * (i + 0.5 - delta)
        first = max(int(center - 0.5 + delta), 0)
        n = min(max(min(int(center + 1.5 + delta), n_in) - first, 0), 2)
        w = [max(0.0, 1 - abs(j + first - center + 0.5 - delta)) for j in range(n)] + [0.0] * (2 - n)
        total = sum(w)
        firsts.append(first)
        taps.append([v / total for v in w] if total else w)
    w_max = max(max(w) for w in taps)
    precision = 0  # the most bits that keep the largest weight (times 2) below int16's limit
    while precision < 22 and int(0.5 + w_max * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    return firsts, [(int(a * (1 << precision) + 0.5), int(b * (1 << precision) + 0.5)) for a, b in taps], precision


def _vector_norm_grad(g: Tensor, norm: Tensor, x: Tensor, p: float, dim: int) -> Tensor:
    """torch's linalg_vector_norm_backward, by the order p."""
    g, norm = g.expand(x.shape), norm.expand(x.shape)
    if p == 0:
        return x.zeros_like()
    if p == 1:
        return x.sign() * g
    if p == 2:
        return g * (norm == 0).where(0.0, x / norm)
    if math.isinf(p):  # the extreme elements share the gradient
        hit = (x.abs() == norm).cast(x.dtype)
        return x.sign() * hit * g / hit.sum(dim, keepdim=True).expand(x.shape)
    a = x.abs()
    if p < 1:
        return x.sign() * (x == 0).where(0.0, a.pow(p - 1)) * g * norm.pow(1 - p)
    scale = (norm == 0).where(0.0, g / norm.pow(p - 1))
    return (x.sign() * a.pow(p - 1) if p < 2 else x * a.pow(p - 2)) * scale


class NNMixin:
    __slots__ = ()

    # ***** products *****
    def dot(self: Tensor, w: Tensor, dtype: DTypeLike | None = None) -> Tensor:
        """numpy/torch matmul semantics: 1-D operands are vectors, leading dims broadcast."""
        x, dx, dw = self, self.ndim, w.ndim
        if dx == 0 or dw == 0:
            raise ArgumentError(f"matmul needs tensors of at least 1 dimension, got shapes {x.shape} and {w.shape}")
        axis_w = -min(dw, 2)
        if x.shape[-1] != w.shape[axis_w]:
            raise ArgumentError(
                f"matmul of incompatible shapes {x.shape} and {w.shape}: {x.shape[-1]} != {w.shape[axis_w]}"
            )
        linear_operands = (x, w) if _contiguous_along_depth(w) else None
        if _packs_right_operand(x, w):
            w = _as_itself(_stored_in_column_panels(w), w)
        elif _transposes_right_operand(x, w):
            w = _as_itself(w.transpose(-1, -2).contiguous().transpose(-1, -2), w)
        elif depth := _padded_depth(x, w):
            x, w = _padded_along_depth(x, depth), _padded_along_depth(w.T, depth).T
        else:
            linear_operands = None
        x = x.reshape(*x.shape[:-1], *[1] * min(dx - 1, dw - 1, 1), x.shape[-1])
        w = w.reshape(*w.shape[:-2], *[1] * min(dx - 1, dw - 1, 1), *w.shape[axis_w:]).transpose(-1, axis_w)
        out_dt = to_dtype(dtype) if dtype is not None else least_upper_dtype(self.dtype, w.dtype)
        out = (x * w).sum(-1, dtype=dtype).cast(out_dt)
        return out if linear_operands is None else with_gradient(out, linear_operands, _linear_gradients)

    def matmul(self: Tensor, x: Tensor, reverse: bool = False, dtype: DTypeLike | None = None) -> Tensor:
        return x.dot(self, dtype=dtype) if reverse else self.dot(x, dtype=dtype)

    def __matmul__(self, x):
        return self.matmul(x)

    def __rmatmul__(self, x):
        return self.matmul(x, True)

    def linear(self: Tensor, weight: Tensor, bias: Tensor | None = None, dtype: DTypeLike | None = None) -> Tensor:
        """self @ weight + bias, with weight of shape (in, out) as tinygrad (torch's F.linear takes weight.T)."""
        x = self * weight if weight.ndim == 1 else self.dot(weight, dtype=dtype)
        return x if bias is None else x + bias

    @classmethod
    def einsum(cls, formula: str, *operands, dtype: DTypeLike | None = None) -> Tensor:
        xs: list[Tensor] = list(argfix(*operands))
        inputs, output = _parse_einsum(formula.replace(" ", ""), xs)
        if len(inputs) != len(xs):
            raise ArgumentError(f"einsum {formula!r} names {len(inputs)} operands, got {len(xs)}")
        sizes: dict[str, int] = {}
        prepared = []
        for letters, x in zip(inputs, xs):
            if len(letters) != x.ndim:
                raise ArgumentError(f"einsum operand {letters!r} does not match shape {x.shape}")
            while len(set(letters)) != len(letters):  # a repeated letter takes the diagonal ("ii->i")
                c = next(c for c in letters if letters.count(c) > 1)
                i, j = letters.index(c), letters.index(c, letters.index(c) + 1)
                x, letters = x.diagonal(0, i, j), letters[:i] + letters[i + 1 : j] + letters[j + 1 :] + c
            for c, s in zip(letters, x.shape):
                if c in sizes and s != sizes[c] and 1 not in (s, sizes[c]):
                    raise ArgumentError(f"einsum: letter {c!r} has sizes {sizes[c]} and {s}")
                sizes[c] = s if c not in sizes or sizes[c] == 1 else sizes[c]
            prepared.append((letters, x))
        alphabet = sorted(sizes)
        full = [sizes[c] for c in alphabet]
        terms = []
        for letters, x in prepared:  # every operand laid out over the whole alphabet, then broadcast
            x, ordered = x.permute(argsort(list(letters))), sorted(letters)
            terms.append(x.reshape([x.shape[ordered.index(c)] if c in ordered else 1 for c in alphabet]).expand(full))
        prod_ = functools.reduce(lambda a, b: a * b, terms)
        summed = [i for i, c in enumerate(alphabet) if c not in output]
        ret = prod_.sum(summed, dtype=dtype) if summed else prod_
        remaining = [c for c in alphabet if c in output]
        return ret.permute([remaining.index(c) for c in output])

    # ***** convolutions *****
    def conv2d(
        self: Tensor,
        weight: Tensor,
        bias: Tensor | None = None,
        groups: int = 1,
        stride=1,
        dilation=1,
        padding: int | Sequence[int] = 0,
        dtype: DTypeLike | None = None,
    ) -> Tensor:
        """N-d convolution (1-d, 2-d, 3-d by the weight's rank): sliding windows times the weight, summed."""
        cin_, (cout, cin), hw = self.shape[1], weight.shape[:2], weight.shape[2:]
        if self.ndim != weight.ndim or groups * cin != cin_ or cout % groups:
            raise ArgumentError(
                f"conv2d: input of shape {self.shape} does not match weight of shape {weight.shape} "
                f"with groups={groups} (input channels {cin_}, weight expects {groups * cin})"
            )

        def forward(x: Tensor, weight: Tensor, pads: list) -> Tensor:
            bs = x.shape[0]  # x's: the gradient rule runs it on each device's part of a split batch (tensor/multi.py)
            x = x.pad(pads)._pool(hw, stride, dilation)  # (bs, cin_, *out, *hw)
            rcout, oyx = cout // groups, x.shape[2 : -len(hw)]
            strides, lanes = make_tuple(stride, len(hw)), _vector_lanes(x.device, x.dtype.itemsize)
            if _subsampled_pointwise_input(strides, bs, oyx, weight.shape, lanes):
                x, strides = x.contiguous(), (1,) * len(hw)
            x = x.reshape(bs, groups, cin, 1, *oyx, *hw).expand(bs, groups, cin, rcout, *oyx, *hw)
            x = x.permute(0, 1, 3, *[4 + i for i in range(len(oyx))], 2, *[4 + len(oyx) + i for i in range(len(hw))])
            if rcout >= 16 and _output_channels_contiguous(strides, bs, oyx, weight.shape, rcout, lanes):
                weight = _stored_output_channels_last(weight, groups, _output_channel_block(rcout, lanes))
            w = weight.reshape(1, groups, rcout, *[1] * len(oyx), cin, *hw)
            out_dt = to_dtype(dtype) if dtype is not None else least_upper_dtype(x.dtype, weight.dtype)
            ret = (x * w).sum([-1 - i for i in range(1 + len(oyx))], keepdim=True, dtype=dtype).cast(out_dt)
            return ret.reshape(bs, cout, *oyx)

        def grad(g: Tensor, out: Tensor, x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
            """d/dx: conv_transpose2d of the output's gradient (a conv with the flipped weight), where the gradient
            of the sliding windows' movement ops would sum every window position over a repeated copy of the input
            (the im2col space: 16x the input for a 3x3 window on 4x4); d/dweight: the primitives' gradient."""
            from zeptograd.gradient import compute_gradient

            strides, dils = make_tuple(stride, len(hw)), make_tuple(dilation, len(hw))
            grouped = flat_to_grouped(pads)
            out_pad = [
                i + pb + pa - d * (k - 1) - 1 - (o - 1) * s
                for i, o, k, s, d, (pb, pa) in zip(x.shape[2:], out.shape[2:], hw, strides, dils, grouped)
            ]
            # the gradient stored first (windows over computed values would recompute them per window position),
            # padded as the transposed conv reads it where the stride inserts no zeros: one kernel writes it, and
            # the conv reads it with no gate (stored, then copied padded by the scheduler: two passes)
            dx = _transposed_conv(g, weight, None, groups, stride, dilation, pads, out_pad, True)
            xw, xw_pads = x.detach(), pads
            if _padded_input_for_weight_gradient(xw, pads, weight.shape, out.shape):
                xw, xw_pads = xw.pad(pads).contiguous(), [0] * len(pads)
            if (parts := _weight_gradient_batch_parts(xw, g, weight, out.shape)) > 1:
                dw = _weight_gradient_in_batch_parts(xw, g, weight, xw_pads, groups, stride, dilation, parts)
            else:
                dw = compute_gradient(forward(xw, weight, xw_pads).uop, g, {weight.uop})[weight.uop]
            return dx.cast(x.dtype), dw

        pads = resolve_pool_pads(padding, len(hw))
        ret = forward(self, weight, pads)
        if all(
            pb <= d * (k - 1) and pa <= d * (k - 1)
            for k, d, (pb, pa) in zip(hw, make_tuple(dilation, len(hw)), flat_to_grouped(pads))
        ):
            ret = with_gradient(ret, (self, weight), grad)  # a transposed conv's padding is (k-1)*d - pad >= 0
        return ret if bias is None else ret + bias.reshape(1, -1, *[1] * len(hw))

    def conv_transpose2d(
        self: Tensor,
        weight: Tensor,
        bias: Tensor | None = None,
        groups: int = 1,
        stride=1,
        dilation=1,
        padding=0,
        output_padding=0,
    ) -> Tensor:
        """The gradient of conv2d as a conv2d: stride becomes zeros between inputs, the kernel flips."""
        if self.ndim != weight.ndim or self.shape[1] != weight.shape[0]:
            raise ArgumentError(
                f"conv_transpose2d: input of shape {self.shape} does not match weight of shape "
                f"{weight.shape} (input channels must equal weight.shape[0])"
            )
        return _transposed_conv(self, weight, bias, groups, stride, dilation, padding, output_padding)

    # ***** pooling *****
    def _ceil_pads(self: Tensor, pads: list[int], k_: tuple[int, ...], s_, d_) -> list[int]:
        """Extra right padding so that ceil_mode's last, partial window exists (and never starts in the padding)."""
        s_, d_, i_ = make_tuple(s_, len(k_)), make_tuple(d_, len(k_)), self.shape[-len(k_) :]
        pads = list(pads)
        for dim, (i, s, k, d, (pb, pa)) in enumerate(zip(i_, s_, k_, d_, flat_to_grouped(pads))):
            o = -(-(i + pb + pa - (d * (k - 1) + 1)) // s) + 1
            pads[-1 - dim * 2] += s * (o - 1) + (d * (k - 1) + 1) - (i + pb + pa) - max(s * (o - 1) - (pb + i - 1), 0)
        return pads

    def _pool_windows(self: Tensor, kernel_size, stride, dilation, padding, ceil_mode: bool, value=0.0):
        k_ = make_tuple(kernel_size, 2)
        s_ = k_ if stride is None else stride
        pads = resolve_pool_pads(padding, len(k_))
        if ceil_mode:
            pads = self._ceil_pads(pads, k_, s_, dilation)
        return self.pad(pads, value=value)._pool(k_, s_, dilation), k_, s_, pads

    def avg_pool2d(
        self: Tensor, kernel_size=(2, 2), stride=None, dilation=1, padding=0, ceil_mode=False, count_include_pad=True
    ) -> Tensor:
        k_ = make_tuple(kernel_size, 2)
        axis = tuple(range(-len(k_), 0))
        pooled, k_, s_, pads = self._pool_windows(k_, stride, dilation, padding, ceil_mode)
        if not count_include_pad:
            ones = self.ones_like()._pool_windows(k_, stride, dilation, padding, ceil_mode)[0]
            return pooled.sum(axis) / ones.sum(axis)
        if not ceil_mode:
            return pooled.mean(axis)
        reg = resolve_pool_pads(padding, len(k_))  # count the user's padding, not the ceil-mode extra
        ones = self.pad(reg).ones_like().pad([c - r for c, r in zip(pads, reg)])._pool(k_, s_, dilation)
        return pooled.sum(axis) / ones.sum(axis)

    def max_pool2d(
        self: Tensor, kernel_size=(2, 2), stride=None, dilation=1, padding=0, ceil_mode=False, return_indices=False
    ):
        k_ = make_tuple(kernel_size, 2)
        axis = tuple(range(-len(k_), 0))
        pooled, k_, s_, pads = self._pool_windows(k_, stride, dilation, padding, ceil_mode, dtypes.min(self.dtype))
        out = pooled.max(axis)
        if not return_indices:
            return out
        spatial = self.shape[-len(k_) :]
        n = math.prod(spatial)  # flat index within the spatial dims, as torch; the first maximum wins
        rev = type(self).arange(n, 0, -1, dtype=dtypes.int64, device=self.device).reshape(spatial)
        rev = rev.pad(pads)._pool(k_, s_, dilation)
        idx = (pooled == out.reshape(*out.shape, *[1] * len(k_))).where(rev, 0).max(axis)
        return out, n - idx

    def max_unpool2d(
        self: Tensor, indices: Tensor, kernel_size=(2, 2), stride=None, dilation=1, padding=0, output_size=None
    ) -> Tensor:
        bs, c, *spatial = self.shape
        if output_size is None:
            k_ = make_tuple(kernel_size, len(spatial))
            d_, s_ = make_tuple(dilation, len(spatial)), make_tuple(stride if stride is not None else k_, len(spatial))
            p_ = flat_to_grouped(resolve_pool_pads(padding, len(spatial)))
            output_size = tuple(
                (i - 1) * s - (pb + pa) + (d * (k - 1) + 1) for i, k, d, s, (pb, pa) in zip(spatial, k_, d_, s_, p_)
            )
        else:
            output_size = tuple(output_size[-len(spatial) :])
        n = math.prod(output_size)
        hot = indices.reshape(bs, c, 1, -1)._one_hot_along(n, 2)  # overlapping windows can name one index twice
        return last_hit(hot, self.reshape(bs, c, 1, -1)).reshape(bs, c, *output_size)

    def interpolate(self: Tensor, size: tuple[int, ...], mode: str = "linear", align_corners: bool = False) -> Tensor:
        """Resize the last len(size) dims: 'nearest' (torch's floor rule), 'nearest-exact', or 'linear'."""
        if mode not in ("linear", "nearest", "nearest-exact"):
            raise ArgumentError(f"interpolate mode must be linear, nearest or nearest-exact, got {mode!r}")
        if align_corners and mode != "linear":
            raise ArgumentError("align_corners needs mode='linear'")
        if mode == "linear" and not dtypes.is_float(self.dtype):
            if self.dtype != dtypes.uint8:
                raise ArgumentTypeError(f"interpolate mode 'linear' needs a float or uint8 tensor, got {self.dtype}")
            return self._interpolate_linear_uint8(size, align_corners)
        x, expand = self, list(self.shape)
        for i in range(-1, -len(size) - 1, -1):
            n_in, n_out = self.shape[i], size[i]
            scale = (n_in - 1) / (n_out - 1) if align_corners and n_out > 1 else n_in / n_out
            arr = type(self).arange(n_out, dtype=dtypes.float32, device=self.device)
            shape = [1] * self.ndim
            shape[i] = expand[i] = n_out
            if mode == "linear":
                pos = (arr * scale if align_corners else ((arr + 0.5) * scale - 0.5).maximum(0)).minimum(n_in - 1)
                lo = pos.floor()
                frac = (pos - lo).reshape(shape).expand(expand)
                lo_i = lo.cast(dtypes.int32).reshape(shape).expand(expand)
                hi_i = (lo + 1).minimum(n_in - 1).cast(dtypes.int32).reshape(shape).expand(expand)
                x = x._gather(i, lo_i).lerp(x._gather(i, hi_i), frac)  # in range by construction
            else:
                pos = (arr + 0.5) * scale if mode == "nearest-exact" else arr * scale
                x = x._gather(i, pos.floor().minimum(n_in - 1).cast(dtypes.int32).reshape(shape).expand(expand))
        return x.cast(self.dtype) if dtypes.is_float(self.dtype) else x

    def _interpolate_linear_uint8(self: Tensor, size: tuple[int, ...], align_corners: bool) -> Tensor:
        """torch's uint8 (bi)linear resize: one dim at a time from the last, each a two-tap sum with int16 fixed-point
        weights, rounded (half up) and clamped back to uint8 before the next dim. A dim that keeps its size is
        left alone."""
        x = self.cast(dtypes.int32)
        for i in range(-1, -len(size) - 1, -1):
            n_in, n_out = self.shape[i], size[i]
            if n_in == n_out:
                continue
            lo, weights, precision = _uint8_linear_taps(n_in, n_out, align_corners)
            shape = [1] * self.ndim
            shape[i] = n_out
            expand = list(x.shape)
            expand[i] = n_out

            def column(values: list[int]) -> Tensor:
                t = type(self)(values, dtype=dtypes.int32, device=self.device)
                return t.reshape(shape).expand(expand)

            hi = [min(j + 1, n_in - 1) for j in lo]
            acc = x._gather(i, column(lo)) * column([w for w, _ in weights])
            acc = acc + x._gather(i, column(hi)) * column([w for _, w in weights]) + (1 << (precision - 1))
            x = (acc >> precision).maximum(0).minimum(255)
        return x.cast(dtypes.uint8)

    # ***** normalization *****
    def layernorm(self: Tensor, axis: int | tuple[int, ...] = -1, eps: float = 1e-5) -> Tensor:
        y = self - self.mean(axis, keepdim=True)
        return y * (y * y).mean(axis, keepdim=True).add(eps).rsqrt()

    def batchnorm(
        self: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        mean: Tensor,
        invstd: Tensor,
        axis: int | tuple[int, ...] = 1,
    ) -> Tensor:
        axes = tuple(normalize_axis(a, self.ndim) for a in argfix(axis))
        shape = tuple(s if i in axes else 1 for i, s in enumerate(self.shape))
        x = self - mean.reshape(shape)
        if weight is not None:
            x = x * weight.reshape(shape)
        x = x * (invstd.reshape(shape) if invstd.ndim == len(axes) else invstd)
        return x if bias is None else x + bias.reshape(shape)

    def normalize(self: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
        """self / max(vector_norm(self, p, dim), eps), as torch: p=0 counts the nonzeros, +-inf is max/min |x|."""
        return self / self._vector_norm(p, dim).clamp(eps)

    def _vector_norm(self: Tensor, p: float, dim: int) -> Tensor:
        """torch.linalg.vector_norm over dim (kept), with torch's gradient (0 where the norm or an element is 0,
        not the nan of pow's chain rule there)."""
        a = self.abs()
        if p == 0:
            norm = (self != 0).cast(a.dtype).sum(dim, keepdim=True)
        elif math.isinf(p):
            norm = a.max(dim, keepdim=True) if p > 0 else a.min(dim, keepdim=True)
        else:
            norm = (a**p).sum(dim, keepdim=True).pow(1 / p)
        return with_gradient(norm, (self,), lambda g, out, x: (_vector_norm_grad(g, out, x, p, dim),))

    def dropout(self: Tensor, p: float = 0.5) -> Tensor:
        if not 0 <= p <= 1:
            raise ArgumentError(f"dropout probability must be in [0, 1], got {p}")
        if not type(self).training or p == 0:
            return self
        if p == 1:
            return self.zeros_like()
        keep = type(self).rand(*self.shape, device=self.device) >= p
        return keep.where(self * (1 / (1 - p)), 0)

    def scaled_dot_product_attention(
        self: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ):
        if enable_gqa:
            key = key.repeat_interleave(self.shape[-3] // key.shape[-3], dim=-3)
            value = value.repeat_interleave(self.shape[-3] // value.shape[-3], dim=-3)
        keys_t = key.transpose(-2, -1)
        if _keys_in_panels(self, keys_t):
            keys_t = _stored_in_column_panels(keys_t)
        qk = self.matmul(keys_t) * (1 / math.sqrt(self.shape[-1]) if scale is None else scale)
        if is_causal and attn_mask is not None:
            raise ArgumentError("scaled_dot_product_attention: pass attn_mask or is_causal, not both")
        if is_causal and key.shape[-2] > CAUSAL_SKIP_MIN_KEYS:
            return _causal_attention(qk._float(), value, dropout_p).cast(self.dtype)
        masked_rows = attn_mask is not None  # (is_causal's tril keeps key 0 in every row)
        if is_causal:  # keys in one panel: no key loop to end early, and the additive mask's kernels are fewer
            attn_mask = qk.ones_like(dtype=dtypes.bool).tril()
        if attn_mask is not None:
            qk = qk + (attn_mask.where(0, -math.inf).cast(qk.dtype) if attn_mask.dtype == dtypes.bool else attn_mask)
        # softmax(qk) @ v with the division after the product (as flash attention): sum_j (e_j / l) v_j =
        # (sum_j e_j v_j) / l, so the scheduler keeps exp's row in a row buffer read by the sum and by the product with
        # v, and the N x N probabilities are never a tensor of their own (dropout's mask scales e_j as it did e_j / l)
        x = qk._float()
        m = x.detach()._max(-1, keepdim=True)
        if masked_rows:  # a row whose every key is masked (max -inf) gives zeros as torch's: e = exp(-inf - 0) = 0, 0/1
            m = (m == -math.inf).where(0, m)
        e = (x - m).exp()
        total = e.sum(-1, keepdim=True)  # (>= exp(0) = 1 in every row but a fully masked one)
        return ((e.dropout(dropout_p) @ value) / ((total == 0).where(1, total) if masked_rows else total)).cast(
            self.dtype
        )

    # ***** classification helpers and losses *****
    def _one_hot_along(self: Tensor, num_classes: int, dim: int = -1) -> Tensor:
        """bool (self == class) along a new size-num_classes axis at position dim of self (an existing axis of 1)."""
        d = normalize_axis(dim, self.ndim)
        classes = type(self).arange(num_classes, device=self.device)
        return self == classes.reshape(tuple(num_classes if i == d else 1 for i in range(self.ndim)))

    def one_hot(self: Tensor, num_classes: int = -1) -> Tensor:
        """int64 (..., num_classes); class values must be in [0, num_classes), checked at the call (a RuntimeError as
        torch, naming the value and the count). num_classes=-1: the max value + 1 (read back; not under TinyJit)."""
        if not dtypes.is_int(self.dtype):
            raise ArgumentTypeError(f"one_hot needs an integer tensor, got {self.dtype}")
        if num_classes == -1:
            from zeptograd.engine.realize import is_capturing

            if self.numel() == 0:
                raise RuntimeError("Can not infer total number of classes from empty tensor.")
            # the values set the shape: read where they lie (a capture refuses the read: JitError)
            num_classes = max(int(self.max().item() if is_capturing() else _index_values(self).max()) + 1, 0)
        elif num_classes < 0:
            raise RuntimeError(f"Class values must be smaller than num_classes. (one_hot: num_classes={num_classes})")
        check_one_hot_bounds(self, num_classes)
        return self.unsqueeze(-1)._one_hot_along(num_classes).cast(dtypes.int64)

    def _do_reduction(self: Tensor, reduction: str = "mean") -> Tensor:
        if reduction not in ("mean", "sum", "none"):
            raise ArgumentError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        return self.mean() if reduction == "mean" else self.sum() if reduction == "sum" else self

    def cross_entropy(
        self: Tensor, Y: Tensor, reduction: str = "mean", label_smoothing: float = 0.0, ignore_index: int = -100
    ) -> Tensor:
        """Classes on dim 1 (dim 0 for one unbatched sample); Y is class indices or class probabilities. Class indices
        must be in [0, classes) or equal ignore_index (as torch: those don't count, nor in the mean's divisor);
        checked at the call (`check_label_bounds`)."""
        if not 0.0 <= label_smoothing <= 1.0:
            raise ArgumentError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
        x = self.unsqueeze(0) if self.ndim == 1 else self
        y = Y.unsqueeze(0) if self.ndim == 1 else Y
        c = x.shape[1]
        keep = None
        if y.ndim == x.ndim and (y.shape != x.shape or not dtypes.is_float(y.dtype)):  # a typo, not broadcasting
            raise ArgumentError(
                f"cross_entropy: a target of class probabilities is a float tensor of the input's shape {self.shape}; "
                f"class indices are an integer tensor of shape {x.shape[:1] + x.shape[2:]}; got {Y.dtype} {Y.shape}"
            )
        if y.ndim < x.ndim and y.shape != x.shape[:1] + x.shape[2:]:
            raise ArgumentError(
                f"cross_entropy: class indices for input of shape {self.shape} need shape "
                f"{(x.shape[:1] + x.shape[2:]) if self.ndim > 1 else ()}, got {Y.shape}"
            )
        if y.ndim < x.ndim:
            if check_label_bounds(Y, c, ignore_index, "cross_entropy"):
                keep = y != ignore_index
            y = y.unsqueeze(1)._one_hot_along(c, 1).cast(x.dtype)
        if label_smoothing:
            y = y * (1 - label_smoothing) + label_smoothing / c
        ret = -(x.log_softmax(axis=1) * y).sum(axis=1)
        ret = ret if keep is None else keep.where(ret, 0)
        ret = ret.reshape(()) if self.ndim == 1 else ret
        if keep is not None and reduction == "mean":
            return ret.sum() / keep.sum()
        return ret._do_reduction(reduction)

    def nll_loss(
        self: Tensor, Y: Tensor, weight: Tensor | None = None, ignore_index: int | None = None, reduction: str = "mean"
    ) -> Tensor:
        """Log-probabilities with classes on dim 1; labels in [0, classes) or equal ignore_index, checked at the call
        (`check_label_bounds`)."""
        masked = check_label_bounds(Y, self.shape[1], ignore_index, "nll_loss")
        w = Y.ones_like(dtype=self.dtype) if weight is None else weight._gather(0, Y.flatten()).reshape(Y.shape)
        if masked:
            w = w * (Y != ignore_index)
        nll = -self._gather(1, Y.unsqueeze(1)).squeeze(1) * w  # checked above; ignore_index labels are masked by w
        return nll.sum() / w.sum() if reduction == "mean" else nll._do_reduction(reduction)

    def sparse_categorical_crossentropy(
        self: Tensor, Y: Tensor, ignore_index: int = -1, label_smoothing=0.0, reduction: str = "mean"
    ) -> Tensor:
        """Classes on the last dim; entries whose label is ignore_index don't count, the others must be in
        [0, classes) (checked at the call: `check_label_bounds`)."""
        masked = check_label_bounds(Y, self.shape[-1], ignore_index, "sparse_categorical_crossentropy")
        log_probs = self.log_softmax()
        keep = Y != ignore_index if masked else None
        y = Y.unsqueeze(-1)._one_hot_along(self.shape[-1])
        y = y if keep is None else y & keep.unsqueeze(-1)
        unreduced = y.where(log_probs, 0).sum(-1)
        if label_smoothing:
            smoothing = log_probs.mean(-1) if keep is None else log_probs.mean(-1) * keep
            unreduced = (1 - label_smoothing) * unreduced + label_smoothing * smoothing
        if reduction == "mean":
            return -unreduced.sum() / keep.sum() if keep is not None else -unreduced.mean()
        return -(unreduced.sum() if reduction == "sum" else unreduced)

    def binary_crossentropy(self: Tensor, Y: Tensor, reduction: str = "mean") -> Tensor:
        log_p, log_1mp = self.log().maximum(-100), (1 - self).log().maximum(-100)  # clamped as torch
        return (-(Y * log_p + (1 - Y) * log_1mp))._do_reduction(reduction)

    def binary_crossentropy_logits(
        self: Tensor, Y: Tensor, reduction: str = "mean", pos_weight: Tensor | None = None
    ) -> Tensor:
        pos = Y * self.logsigmoid() * (1 if pos_weight is None else pos_weight)
        return (-(pos + (1 - Y) * (-self).logsigmoid()))._do_reduction(reduction)

    def sequential(self: Tensor, ll: list[Callable[[Tensor], Tensor]]) -> Tensor:
        return functools.reduce(lambda x, f: f(x), ll, self)


def _parse_einsum(formula: str, xs: list) -> tuple[list[str], str]:
    """'ij,jk' -> (['ij', 'jk'], 'ik'); '...' becomes letters not used elsewhere, aligned from the right."""
    lhs, _, rhs = formula.partition("->")
    inputs = lhs.split(",")
    if "..." in formula:
        free = [c for c in string.ascii_letters if c not in formula]
        n_ell = max((x.ndim - (len(s) - 3) for s, x in zip(inputs, xs) if "..." in s), default=0)
        ell = "".join(free[:n_ell])
        inputs = [s.replace("...", ell[n_ell - (x.ndim - (len(s) - 3)) :]) for s, x in zip(inputs, xs)]
        if "->" in formula:
            rhs = rhs.replace("...", ell)
    if "->" not in formula:
        joined = "".join(inputs)
        rhs = ("".join(free[:n_ell]) if "..." in formula else "") + "".join(
            sorted(
                c
                for c in set(joined)
                if joined.count(c) == 1 and c.isalpha() and c not in ("".join(free[:n_ell]) if "..." in formula else "")
            )
        )
    return inputs, rhs


PANEL = 32  # columns of B per panel: a register tile's width, 4 AVX2 vectors or 2 AVX-512 vectors of float32
PANEL_MIN_ROW_BYTES = 4096  # B's rows a page or more apart: a column block's walk down K misses the caches
PANEL_MIN_ROWS = 128  # rows of A that share each panel (64x1024x1024 with w.T: 3.8 ms in the dot tile, 6.3 packed)
PANEL_MIN_DEPTH = 128  # a shorter column block stays in L1 however it is laid out
# below a page, B's rows a multiple of 2 KiB apart (512 floats) put a column block's walk down K in 1/32 of the L2's
# sets (1024 sets of 64-byte lines, a row 32 lines on; 8 ways: 256 lines per line of the block's width): over 256
# rows of B the block (2 lines a row) falls out of L2 all the same. There the copy pays from 64 rows of A on (the
# kernels, 1 core of a Zen 3 host, 512 KiB 8-way L2, copy included, alternating in one process: 256x784x512 3.8 ->
# 2.7 ms, mlp_step's forward; 256x512x512 2.3 -> 1.6; 128x784x512 2.1 -> 1.3; 64x784x512 0.86 -> 0.68; 32x784x512
# 0.55 -> 0.49 is noise; at a depth of 256, 512x256x512 1.66 -> 1.62 too)
PANEL_CONFLICT_ROW_BYTES = 2048
PANEL_CONFLICT_MIN_ROWS = 64
PANEL_CONFLICT_MIN_DEPTH = 257
# x @ W.T (nn.Linear: W (N, K) stored row-major, both operands contiguous along K) is otherwise a tile of dot products
# (codegen/opt/heuristic.py: dot_tile), which re-reads its rows of x, 8 x K floats, for every pair of W's rows: from
# L1 while they fit (32 KiB from K = 1024 on), from L2 beyond; and folds 16 vector accumulators per tile (noise only
# over a long K). From the panels, a broadcast of x per step feeds 2 vectors of W.T, and each line of x serves 16
# steps. On 1 core of an AVX-512 host (Zen 5), copy included, GFLOPS against numpy's, alternating: 2048x1536x384
# 0.63 -> 1.05, 256x1536x384 0.71-0.76 -> 0.95-1.02, 512x1024x1024 0.89-0.94 -> 0.96-0.99, 2048x384x384 0.87-0.93
# -> 0.99-1.02, 2048x768x768 0.90-0.92 -> 1.04-1.06; not at 512x384x384 (0.91-0.94 -> 0.85) nor 256x768x768 (1.03-1.06
# -> 0.94-0.97): the copy, K x N, is no longer noise beside the product there
TRANSPOSED_PANEL_MIN_ROWS = 1024
TRANSPOSED_PANEL_DEEP = 1024  # depth from which the dot tile's rows of x fall out of L1: PANEL_MIN_ROWS rows suffice
# Where K is no whole number of vectors the dot tile loads across cache lines and adds a tail after its horizontal
# sums (see PADDED_DEPTH_MIN_MACS below); the panels have neither (a broadcast of x per step of K, 32 columns of W.T
# 128 bytes apart) and pay from PANEL_MIN_ROWS rows and ~25M multiply-adds on (1 AVX-512 core, copy included,
# alternating: 256x1001x256 0.90 -> 0.66 ms, 512x263x384 0.82 -> 0.54, 512x257x384 0.61 -> 0.53, 256x263x384
# 0.45 -> 0.35, 128x1001x256 0.48 -> 0.41, 512x129x384 0.35 -> 0.33; not 256x257x256 0.25 -> 0.28, 128x1001x128)
TRANSPOSED_PANEL_TAIL_MIN_MACS = 24 << 20


def _packs_right_operand(x: Tensor, w: Tensor) -> bool:
    """Whether x @ w reads w, (..., K, N), from a copy stored in column panels. Without it a register tile's
    column block walks B down K with a stride of N floats: a page per row of B, a power-of-two stride that maps
    every row to a few cache sets, so the block falls out of L2 (2048^3 on 2 cores of an AVX2 host: 398 ms; in
    panels 144 ms, the copy included; 1024^3 29 -> 18 ms). Below a page per row only where the rows are a 2 KiB
    multiple apart, B is deep and A has rows enough to share the copy (PANEL_CONFLICT_*: 512^3 and mlp_step's
    256x784x512 yes, 512x256x512 no).
    Only float32 on the CPU backends: the tile is 32 floats wide there."""
    if x.ndim < 2 or w.ndim < 2 or not isinstance(w.device, str) or w.device.split(":")[0] != "CPU":
        return False
    if x.dtype != dtypes.float32 or w.dtype != dtypes.float32:
        return False
    m, (k, n) = _rows_per_matrix(x, w), w.shape[-2:]
    if not all(isinstance(v, int) for v in (m, k, n)) or n % PANEL or not _a_stored_matrix(w):
        return False
    if _contiguous_along_depth(w) and k >= PANEL_MIN_DEPTH:  # W.T: the dot tile's rows of x against the copy
        if m >= TRANSPOSED_PANEL_MIN_ROWS or (m >= PANEL_MIN_ROWS and k >= TRANSPOSED_PANEL_DEEP):
            return True
        if m >= PANEL_MIN_ROWS and m * k * n >= TRANSPOSED_PANEL_TAIL_MIN_MACS and k % _vector_lanes(w.device, 4):
            return True  # K no whole number of vectors: the dot tile's tail and misaligned rows (see above)
    row_bytes = n * w.dtype.itemsize
    if row_bytes < PANEL_MIN_ROW_BYTES:  # a 2 KiB multiple: the walk down K in a few cache sets (see above)
        return (
            row_bytes % PANEL_CONFLICT_ROW_BYTES == 0 and m >= PANEL_CONFLICT_MIN_ROWS and k >= PANEL_CONFLICT_MIN_DEPTH
        )
    return m >= PANEL_MIN_ROWS and k >= PANEL_MIN_DEPTH


def _rows_per_matrix(x: Tensor, w: Tensor) -> int:
    """The rows of x that x @ w multiplies by each matrix of w: x's rows times x's batch dims that w broadcasts along
    (a Linear over (batch, seq, K) multiplies batch * seq rows by its one weight)."""
    rows = x.shape[-2]
    w_batch = w.shape[:-2]
    for i, d in enumerate(reversed(x.shape[:-2])):
        if i >= len(w_batch) or w_batch[-1 - i] == 1:
            rows = rows * d
    return rows


def _contiguous_along_depth(w: Tensor) -> bool:
    """Whether w, (K, N), is a stored (N, K) matrix seen transposed (nn.Linear's weight.T): contiguous along K, the
    reduce, as x is."""
    u = w.uop
    if w.ndim != 2 or u.op is not Ops.PERMUTE or tuple(u.arg) != (1, 0):
        return False
    u = u.src[0]
    while u.op is Ops.RESHAPE:
        u = u.src[0]
    return u.op is Ops.BUFFER


# is_causal over more keys than this gates every step by the mask (`_causal_attention`): its key loops end at the
# query tile's last key. At 32 keys (one panel, the loop unrolled) nothing is skipped and the gated graph's kernels
# cost more than the additive mask's (examples/gpt_tiny.py's training step at ctx 32: 4.1 -> 4.8 ms on one core)
CAUSAL_SKIP_MIN_KEYS = 32


def _causal_attention(x: Tensor, value: Tensor, dropout_p: float) -> Tensor:
    """softmax(x) @ value over the keys torch's tril(ones(L, S)) keeps (key j <= query i), every step gated by the
    mask itself: the scores' max reduces where(seen, x, -inf), the exp's sum where(seen, e, 0), the product with value
    where(seen, e * v, 0). A masked key's contribution is so the reduce's identity whatever x and v hold (torch skips
    those keys: an inf or nan in them changes nothing), and codegen ends each key loop of a tile of query rows at the
    tile's last seen key (`codegen/gated_reduce.py`): half the work of the full rows. Key 0 is seen by every row, so the
    max is never -inf from the mask alone."""
    seen = _causal_mask(x)
    s = seen.where(x, -math.inf)
    e = seen.where((s - s.detach()._max(-1, keepdim=True)).exp(), 0)
    total = e.sum(-1, keepdim=True)
    products = e.dropout(dropout_p).unsqueeze(-1) * value.unsqueeze(-3)  # (..., L, S, D): a matmul's broadcast product
    out = seen.unsqueeze(-1).where(products, 0).sum(-2) / total
    return out if dropout_p > 0 else with_gradient(out, (x, value), _causal_attention_grad)


def _causal_mask(x: Tensor) -> Tensor:
    """torch's tril(ones(L, S)) for scores x of (..., L, S): key j seen by query i where j <= i"""
    L, S = x.shape[-2:]
    return type(x).arange(S, device=x.device).reshape(1, S) < type(x).arange(L, device=x.device).reshape(L, 1) + 1


def _causal_attention_grad(g: Tensor, out: Tensor, x: Tensor, value: Tensor) -> tuple[Tensor, ...]:
    """The gradient of the same attention with an additive mask, x + mask.where(0, -inf), and e @ v: its backward
    is the plain attention's kernels (the gated forms' would gate every product of dO @ v.T and e.T @ dO). Equal
    where the gated forward is: every row sees key 0, so its max is finite and a masked key's e is 0."""
    y = x + _causal_mask(x).where(0, -math.inf).cast(x.dtype)
    e = (y - y.detach()._max(-1, keepdim=True)).exp()
    return tuple((e @ value / e.sum(-1, keepdim=True)).gradient(x, value, gradient=g))


# x @ W.T's dot tile (codegen/opt/heuristic.py: dot_tile) loads a vector of K per step from each of its rows of x and
# of W. Where K is no multiple of the vector, its rows start inside vectors (loads that cross cache lines) and the
# K % lanes positions left over are a tail after the horizontal sums: one vector of its own where they are a power of
# two, else one scalar copy of the tile per position (K = 1001 with 16 lanes: 9 copies of 16 products). From copies of
# x and W whose rows are padded with zeros to a whole number of vectors, every load is aligned and there is no tail
# (0 * 0 adds 0: the sums are the same). The copies, O((M + N) * K) and two kernels more, pay where the tail's pieces
# (copies, or 1 vector) times M * N are more than (M + N) * K (TAIL_PIECES_PER_COPIED_DEPTH), from 2^26 multiply-adds
# on. 1 core of an AVX-512 host, copies included, alternating in one process: 1001^3 13.3 -> 9.4-9.7 ms,
# 512x1001x513 3.6 -> 2.8-2.9, 256x1001x256 0.93 -> 0.76-0.81, 512x263x513 1.12 -> 0.86, 1000x100x1000 1.57 -> 1.37,
# 1000x257x1000 3.17 -> 2.92; not at 512x257x513 (0.79 -> 0.82: one scalar copy over 16 vectors), 512x264x513
# (0.89 -> 0.93: the tail one vector), 512x129x513 0.44 -> 0.48, 256x257x256 0.24 -> 0.31, 128x1001x128 0.27 -> 0.30
PADDED_DEPTH_MIN_MACS = 1 << 26
TAIL_PIECES_PER_COPIED_DEPTH = 1.0


def _padded_depth(x: Tensor, w: Tensor) -> int:
    """The depth, K rounded up to a whole number of vectors, at which x @ w, w = W.T with W (N, K) a stored matrix
    (nn.Linear's weight), reads copies of x and W with their rows padded with zeros; 0 where it does not: K already a
    whole number of vectors, or a tail too cheap or a product too small to pay for the copies (see above), and where
    W.T is read from column panels (N a multiple of PANEL: `_packs_right_operand`, tried first)."""
    if x.ndim < 2 or not _contiguous_along_depth(w) or x.dtype != dtypes.float32 or w.dtype != dtypes.float32:
        return 0
    m, (k, n) = _rows_per_matrix(x, w), w.shape
    if not all(isinstance(v, int) for v in (m, k, n)) or m * k * n < PADDED_DEPTH_MIN_MACS:
        return 0
    if not (lanes := _vector_lanes(w.device, w.dtype.itemsize)) or not (tail := k % lanes):
        return 0
    pieces = 1 if tail & (tail - 1) == 0 else tail
    return -(-k // lanes) * lanes if m * n * pieces > TAIL_PIECES_PER_COPIED_DEPTH * (m + n) * k else 0


def _linear_gradients(g: Tensor, out: Tensor, x: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    """The gradients of x @ w, w = W.T (K, N) with W (N, K) stored, read from x and W themselves, not from the copies
    the product read (column panels, padded rows): g @ W, a matmul whose B is W row-major (N, K), and x.T @ g over
    all of x's rows. Through the copies, x's gradient reduced along the panels' split N, a tile of dot products of
    32 (256x1024x256 x @ W.T's backward on 1 AVX-512 core: 28 ms in panels, a few without)."""
    k, n = w.shape
    return g.dot(w.T), x.reshape(-1, k).T.dot(g.reshape(-1, n))


def _padded_along_depth(t: Tensor, depth: int) -> Tensor:
    """A copy of t whose last axis is padded with zeros to depth; its gradient is the gradient's first K columns."""
    k = t.shape[-1]
    copy = t.pad(((0, 0),) * (t.ndim - 1) + ((0, depth - k),)).contiguous()
    return with_gradient(copy, (t,), lambda g, out, src: (g[..., :k],))


def _keys_in_panels(q: Tensor, keys_t: Tensor) -> bool:
    """Whether attention reads its keys, k.T of shape (..., d, N), from a copy stored in panels of PANEL keys (d x 32
    each, contiguous): where its scores are computed in one kernel with no N x N buffer (schedule/cost.py:
    row_buffer_is_cheaper, over ROW_TILED_BUFFER_BYTES of scores), codegen's score tile (codegen/opt/heuristic.py:
    score_tile) loads a vector of keys per step of d: in panels, 32 bytes of one panel walked down d; from k itself,
    8 scalar loads and shuffles of keys 4*d bytes apart ((1, 1, 2048, 64) on 2 AVX2 cores, median kernel CPU time:
    0.72x the stored scores' kernels in panels, 1.05x gathered). The copy is O(N*d) memory and one small kernel.
    Float32 on the CPU backends (a GPU computes the scores in several kernels), keys a multiple of PANEL, and not
    where x @ k.T packs them already (`_packs_right_operand`)."""
    from zeptograd.schedule import cost  # (the bound is read at the call: tests lower it)

    if keys_t.ndim < 2 or not isinstance(keys_t.device, str) or keys_t.device.split(":")[0] != "CPU":
        return False
    if q.dtype != dtypes.float32 or keys_t.dtype != dtypes.float32:
        return False
    (m, d), n = q.shape[-2:], keys_t.shape[-1]
    batch = [max(a, b) for a, b in zip(q.shape[-3::-1], keys_t.shape[-3::-1])]
    if not all(isinstance(v, int) for v in (m, d, n, *batch)) or n % PANEL or m * n <= (m + n) * d:
        return False  # (scores no larger than q and k: stored, schedule/cost.py: expands)
    if math.prod(batch) * m * n * q.dtype.itemsize <= cost.ROW_TILED_BUFFER_BYTES:
        return False
    return not _packs_right_operand(q, keys_t)


NARROW_MAX_COLUMNS = 15  # fewer than two AVX2 vectors of float32: a vector along N is one vector and a tail
NARROW_MIN_ROWS = 64  # rows of A that share the copy
NARROW_MIN_DEPTH = 64  # a dot product of 8 vectors or more


def _transposes_right_operand(x: Tensor, w: Tensor) -> bool:
    """Whether x @ w reads w, (..., K, N) stored row-major with N narrow (a classifier's 10 outputs, not a multiple
    of 8), from a copy stored transposed, (..., N, K): the kernel is then a tile of dot products along K, both
    operands contiguous there, instead of one vector along N and a tail (codegen/opt/heuristic.py: dot_tile). The
    copy, N x K, is 1/M of the product; its gradient needs no kernel (the transposes cancel), and the gradient of x
    is then a matmul with B contiguous along its columns ((256, 10) @ (10, 512)), not a dot product of 10 (mlp_step's
    output layer, the kernels alone on 1 core of a Zen 3 host: h @ w 226 -> 46 us, g @ w.T 178 -> 55 us)."""
    if x.ndim < 2 or w.ndim < 2 or not isinstance(w.device, str) or w.device.split(":")[0] != "CPU":
        return False
    if x.dtype != dtypes.float32 or w.dtype != dtypes.float32:
        return False
    (m, k), n = x.shape[-2:], w.shape[-1]
    if not all(isinstance(v, int) for v in (m, k, n)):
        return False
    if n > NARROW_MAX_COLUMNS or n % 8 == 0 or m < NARROW_MIN_ROWS or k < NARROW_MIN_DEPTH:
        return False
    u = w.uop
    while u.op is Ops.RESHAPE:  # a buffer seen through reshapes only: stored row-major
        u = u.src[0]
    return u.op is Ops.BUFFER


def _a_stored_matrix(w: Tensor) -> bool:
    """Whether w is a buffer seen through reshapes, permutes, shrinks and flips (a weight, its transpose, a realized
    activation): not a computed value, whose copy would be its materialization, nor a broadcast (`Tensor.ones`,
    an expanded vector), whose reads are cheap where they repeat and which the copy would make a full matrix."""
    u = w.uop
    while u.op in (Ops.RESHAPE, Ops.PERMUTE, Ops.SHRINK, Ops.FLIP):
        u = u.src[0]
    return u.op is Ops.BUFFER


def _as_itself(copy: Tensor, w: Tensor) -> Tensor:
    """A copy of w in another layout, whose gradient is w's: handed straight to w, not through the copy's movement
    ops (each a gradient rule and Tensor ops at every backward: mlp_step's two copies cost more Python per step than
    their kernels saved)."""
    return with_gradient(copy, (w,), lambda g, out, x: (g,))


def _stored_in_column_panels(w: Tensor) -> Tensor:
    """The same (..., K, N) operand, read from a copy laid out as (..., N/32, K, 32): each panel of 32 columns
    contiguous (codegen/opt/heuristic.py tiles the columns 32 at a time and steps through the panels outside the
    row tiles, so one panel stays in L2 while every row of A passes it)."""
    *batch, k, n = w.shape
    panels = w.reshape(*batch, k, n // PANEL, PANEL).transpose(-3, -2).contiguous()
    return panels.transpose(-3, -2).reshape(*batch, k, n)


CHANNELS_LAST_MIN_MACS = 1 << 26  # a conv this large runs for milliseconds: the weight's copy and its kernel are noise


def _vector_lanes(device, itemsize: int) -> int:
    """How many elements of itemsize bytes a CPU device's vector holds (its renderer's width: 16 floats with AVX-512,
    8 with AVX2); 0 for other devices and tuples of devices."""
    if not isinstance(device, str) or device.split(":")[0] != "CPU":
        return 0
    from zeptograd.device import Device

    return Device[device].renderer.simd_bytes // max(itemsize, 1)


def _output_channels_contiguous(strides: tuple, bs, oyx: tuple, wshape: tuple, rcout: int, lanes: int) -> bool:
    """Whether a conv's weight is stored with its output channels contiguous first: where the last window axis steps
    the input by more than 1 (stride 2), no operand is contiguous along the output's last axis, and codegen's vector
    goes along the output channels instead (codegen/opt/heuristic.py), where the weight, so stored, is read with
    stride 1 and the input is one broadcast value per lane row ((8,64,56,56)x(128,64,3,3) stride 2: 2.2x -> 1.2x
    torch's time, the kernel on 1 core of an AVX2 host). With stride 1 too where the CPU's vector lanes do not divide
    the output's last axis while they divide the output channels: a vector along the columns would be narrower than
    the register, or none (on 1 core of an AVX-512 host, pad 1: (8,64,56,56)x(64,64,3,3) 8-lane columns 19 ms, 16
    output channels per vector 9 ms, torch 14; (8,512,7,7)x(512,512,3,3) no vector at all 850 ms, 17 ms, torch 9;
    AVX2's 8 lanes, measured as 8-lane code on that host: 7x7 850 -> 48 ms, (8,256,14,14)x(256,256,3,3) 82 -> 43,
    56 columns keep theirs); not a 1x1 conv, a matmul whose vector goes along its output positions ((8,1024,14,14)
    x(256,1024,1,1): 5.6 ms as it is, 7.0 along the channels). Only for convs large enough that the copy's kernel
    costs nothing beside them, and with 16+ output channels per group (two vectors)."""
    sizes = (bs, *oyx, *wshape)
    if not all(isinstance(v, int) for v in sizes):
        return False
    if strides[-1] <= 1 and not (wshape[-1] > 1 and lanes >= 8 and oyx[-1] % lanes and rcout % (2 * lanes) == 0):
        return False
    return bs * math.prod(oyx) * math.prod(wshape) >= CHANNELS_LAST_MIN_MACS


SUBSAMPLED_MIN_MACS = 1 << 20  # the copy is 1/cout of the conv's work: only a kernel's launch to pay for


def _subsampled_pointwise_input(strides: tuple, bs, oyx: tuple, wshape: tuple, lanes: int) -> bool:
    """Whether a strided 1x1 conv (ResNet's downsample) reads a stored copy of its subsampled input: a matmul along
    its output positions then, as a stride-1 1x1 conv, where the input read in place steps by the stride along every
    output position and no operand is contiguous there: with a channels-last weight the vector went along the output
    channels, the whole weight streamed once per few output positions; without, the reduce was unrolled along the
    input channels. On 1 core of an AVX-512 host, batch 1, ms before -> after (torch): (1,1024,14,14)x(2048,1024,1,1)
    stride 2 15.9 -> 3.5 (1.7), (1,512,28,28)x(1024,512,1,1) 5.8 -> 1.6 (1.1), (1,256,56,56)x(512,256,1,1) 2.2 -> 1.1
    (1.4), (1,1024,14,14)x(256,1024,1,1) 6.7 -> 0.5 (0.75). The copy's elements are 1/cout of the multiply-adds. On
    the CPU backends, for convs of at least SUBSAMPLED_MIN_MACS multiply-adds."""
    if lanes == 0 or any(k != 1 for k in wshape[2:]) or all(s == 1 for s in strides):
        return False
    sizes = (bs, *oyx, *wshape)
    return all(isinstance(v, int) for v in sizes) and bs * math.prod(oyx) * math.prod(wshape) >= SUBSAMPLED_MIN_MACS


def _padded_input_for_weight_gradient(x: Tensor, pads: list, wshape: tuple, out_shape: tuple) -> bool:
    """Whether a conv's weight gradient reads its input from a padded copy rather than through the pad's gates: its
    reduce runs over the output positions, so each gate is a mask built in the inner loop (the expander's vector
    lanes walk the output columns, and no border of an output loop can be peeled off: codegen/peel.py), and its
    register tile's masks spill. The copy costs one pass over the input; on the CPU backends, for convs large enough
    that it is noise ((8,64,56,56)x(64,64,3,3) pad 1 on one core of an AVX2 host: the weight gradient's kernel
    75 -> 41 ms, the copy ~2 ms)."""
    if not any(pads) or not isinstance(x.device, str) or x.device.split(":")[0] != "CPU":
        return False
    sizes = (*out_shape, *wshape[1:])
    return all(isinstance(v, int) for v in sizes) and math.prod(sizes) >= CHANNELS_LAST_MIN_MACS


WEIGHT_GRADIENT_PART_MIN_POSITIONS = 1024  # output positions per part: a 32x32 image
WEIGHT_GRADIENT_MAX_PARTS = 64
WEIGHT_GRADIENT_MAX_PART_ELEMENTS = 1 << 22  # the parts' sums, all together: 16 MiB of float32


def _weight_gradient_batch_parts(x: Tensor, g: Tensor, weight: Tensor, out_shape: tuple) -> int:
    """Into how many parts of the batch a conv's weight gradient is summed first, each part's sum stored and the
    parts then summed (1: one reduce over every output position). The weight gradient is a small output (cout x cin x
    window) over a long reduce (batch x output positions); as one reduce, each register tile of it streams the whole
    batch's output gradient and input from memory, which no cache holds (ResNet's (32,64,32,32) block: 5 MiB per tile,
    3072 tiles). Summed per part of the batch, a part's images stay in L2 while every weight tile passes them
    ((32,64,32,32) x (64,64,3,3), one image per part: 85 -> 55 ms; (8,64,56,56): 42 -> 29 ms, on 1 core of an AVX2
    host). A part holds the fewest images with WEIGHT_GRADIENT_PART_MIN_POSITIONS output positions (so each tile's
    accumulators are folded rarely), at most WEIGHT_GRADIENT_MAX_PARTS parts and WEIGHT_GRADIENT_MAX_PART_ELEMENTS
    elements of the parts' sums (a 512 x 512 x 3 x 3 weight: at most 1 part, no split). On the CPU backends, float32,
    for convs of at least CHANNELS_LAST_MIN_MACS multiply-adds."""
    if not isinstance(x.device, str) or x.device.split(":")[0] != "CPU":
        return 1
    if any(t.dtype != dtypes.float32 for t in (x, g, weight)):
        return 1
    bs, positions = out_shape[0], out_shape[2:]
    sizes = (*out_shape, *weight.shape[1:])
    if not all(isinstance(v, int) for v in sizes) or math.prod(sizes) < CHANNELS_LAST_MIN_MACS:
        return 1
    per_image, weight_elements = math.prod(positions), math.prod(weight.shape)
    for images in range(1, bs + 1):
        parts = bs // images
        if bs % images or images * per_image < WEIGHT_GRADIENT_PART_MIN_POSITIONS:
            continue
        if parts <= WEIGHT_GRADIENT_MAX_PARTS and parts * weight_elements <= WEIGHT_GRADIENT_MAX_PART_ELEMENTS:
            return parts
    return 1


def _weight_gradient_in_batch_parts(
    x: Tensor, g: Tensor, weight: Tensor, pads: list, groups: int, stride, dilation, parts: int
) -> Tensor:
    """conv2d's weight gradient, sum over (batch, output positions) of the output's gradient times the input's
    windows, as `parts` sums over the batch's parts (each stored), then their sum (`_weight_gradient_batch_parts`)."""
    bs, hw = x.shape[0], weight.shape[2:]
    cout, cin = weight.shape[:2]
    win = x.pad(pads)._pool(hw, stride, dilation)  # (bs, groups * cin, *out, *hw)
    out = win.shape[2 : 2 + len(hw)]
    win = win.reshape(parts, bs // parts, groups, 1, cin, *out, *hw)
    og = g.reshape(parts, bs // parts, groups, cout // groups, 1, *out, *[1] * len(hw))
    part_sums = (win * og).sum((1, *range(5, 5 + len(out))))  # (parts, groups, cout / groups, cin, *hw)
    return part_sums.sum(0).reshape(weight.shape)


OUTPUT_CHANNEL_BLOCK_VECTORS = 4  # a conv's register tile takes up to 4 vectors of output channels


def _output_channel_block(rcout: int, lanes: int) -> int:
    """The output channels of a block of the channels-last weight (`_stored_output_channels_last`): 4 vectors, the
    most a conv's register tile takes (codegen/opt/heuristic.py: 4 with AVX-512, 2 or 4 with AVX2), where they divide
    the channels, so a tile's weight is one contiguous stream (0: no blocks)."""
    block = OUTPUT_CHANNEL_BLOCK_VECTORS * lanes
    return block if lanes and rcout > block and rcout % block == 0 else 0


def _stored_output_channels_last(weight: Tensor, groups: int, block: int = 0) -> Tensor:
    """The same weight, (cout, cin, *hw), read from a copy laid out as (groups, cin, *hw, cout per group), or with
    block, as (groups, cout per group / block, cin, *hw, block): blocks of `block` output channels, each block's
    weight contiguous. A register tile of 4 vectors of output channels then reads its weight as one stream, not 256
    bytes of every cout * 4 (on 1 AVX-512 core, kernel only: (1,256,14,14)x(256,256,3,3) pad 1 2.1 -> 1.2 ms, torch
    1.1; (8,64,56,56)x(128,64,3,3) stride 2 4.7 -> 4.2; 512 channels at 7x7 1.9 -> 1.8)."""
    cout, nd = weight.shape[0], weight.ndim
    if block:
        w = weight.reshape(groups, cout // groups // block, block, *weight.shape[1:])  # (g, nb, block, cin, *hw)
        last = w.permute(0, 1, *range(3, nd + 2), 2).contiguous()  # (g, nb, cin, *hw, block)
        return last.permute(0, 1, nd + 1, *range(2, nd + 1)).reshape(weight.shape)
    w = weight.reshape(groups, cout // groups, *weight.shape[1:])  # (g, rcout, cin, *hw)
    last = w.permute(0, *range(2, nd + 1), 1).contiguous()  # (g, cin, *hw, rcout)
    return last.permute(0, nd, *range(1, nd)).reshape(weight.shape)


def _transposed_conv(
    x: Tensor, weight: Tensor, bias, groups, stride, dilation, padding, output_padding, weight_copy: bool = False
) -> Tensor:
    """conv_transpose2d as a conv2d; weight_copy: conv2d's gradient, the flipped weight stored first, since its
    index through the flip and the group transpose is divmods the simplifier keeps in the reduce's inner loop, and
    x (the output's gradient) stored, padded already where the stride is 1."""
    hw = weight.shape[2:]
    w = weight.unflatten(0, (groups, -1)).transpose(1, 2).flip(*range(3, weight.ndim + 1)).flatten(end_dim=1)
    w = w.contiguous() if weight_copy else w
    dil, out_pad = make_tuple(dilation, len(hw)), make_tuple(output_padding, len(hw))
    grouped = flat_to_grouped(resolve_pool_pads(padding, len(hw)))
    pads = [
        p
        for k, d, (pb, pa), op in reversed(list(zip(hw, dil, grouped, out_pad)))
        for p in ((k - 1) * d - pb, (k - 1) * d - pa + op)
    ]
    strides = make_tuple(stride, len(hw))
    if weight_copy and all(s == 1 for s in strides):
        x, pads = x.pad(pads).contiguous(), [0] * len(pads)
    elif weight_copy:
        x = x.contiguous()
    if any(s > 1 for s in strides):  # insert s-1 zeros after each input element
        x = x.reshape(*x.shape[:2], *[v for k in x.shape[2:] for v in (k, 1)])
        x = x.pad((None, None, *[p for s in strides for p in (None, (0, s - 1))]))
        x = x.reshape(*x.shape[:2], *[k * s for k, s in zip(x.shape[2::2], strides)])
        x = x.shrink((None, None, *[(0, k - (s - 1)) for k, s in zip(x.shape[2:], strides)]))
    return x.conv2d(w, groups=groups, bias=bias, dilation=dilation, padding=pads)
