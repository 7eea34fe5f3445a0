"""Neural-network ops: products and einsum, convolutions and pooling (sliding windows + reduces), normalization,
attention, dropout and losses. All are compositions of the ops in the other modules. The layouts of the operands
they read are chosen in matmul_layout.py (products), conv_layout.py (convolutions) and attention.py."""

from __future__ import annotations

import functools
import math
import string
from typing import TYPE_CHECKING, Callable, Sequence

from zeptograd.dtype import DTypeLike, dtypes, least_upper_dtype, to_dtype
from zeptograd.gradient import with_gradient
from zeptograd.helpers import ArgumentError, ArgumentTypeError
from zeptograd.tensor.attention import (
    CAUSAL_SKIP_MIN_KEYS,
    _causal_attention,
    _keys_in_panels,
    _keys_padded_to_panels,
    _one_query_row_more,
    _padded_keys_masked,
)
from zeptograd.tensor.conv_layout import (
    _output_channel_block,
    _output_channels_contiguous,
    _output_gradient_channels_last,
    _padded_input_for_weight_gradient,
    _stored_channels_last,
    _stored_output_channels_last,
    _stored_padded_output_gradient,
    _subsampled_pointwise_input,
    _transposed_conv,
    _transposed_conv_in_phases,
    _weight_gradient_batch_parts,
    _weight_gradient_from_padded_output_gradient,
    _weight_gradient_in_batch_parts,
)
from zeptograd.tensor.helpers import argfix, argsort, flat_to_grouped, make_tuple, normalize_axis, resolve_pool_pads
from zeptograd.tensor.indexing import _index_values, check_label_bounds, check_one_hot_bounds, last_hit
from zeptograd.tensor.matmul_layout import (
    _as_itself,
    _contiguous_along_depth,
    _linear_gradients,
    _packs_left_operand,
    _packs_right_operand,
    _padded_along_depth,
    _padded_depth,
    _stored_in_column_panels,
    _stored_in_row_panels,
    _transposes_right_operand,
    _vector_lanes,
)

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
        if _packs_left_operand(x, w):
            x = _as_itself(_stored_in_row_panels(x), x)
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
                per_channel = math.prod(weight.shape[1:]) * weight.dtype.itemsize
                block = _output_channel_block(rcout, lanes, per_channel)
                weight = _stored_output_channels_last(weight, groups, block)
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
            xw, xw_pads = x.detach(), pads
            padded = _padded_input_for_weight_gradient(xw, pads, weight.shape, out.shape)
            parts = _weight_gradient_batch_parts(xw, g, weight, out.shape)
            lanes = _vector_lanes(x.device, x.dtype.itemsize)
            channels_last = _output_gradient_channels_last(g, weight, groups, strides, lanes)
            if padded and channels_last and all(s == 1 for s in strides):
                # the output gradient's channels-last copy stored padded: the weight gradient reads the input in place
                # and the input gradient's transposed conv reads that copy with no pad of its own
                g_pad = _stored_padded_output_gradient(g, weight, pads, dilation)
                dw = _weight_gradient_from_padded_output_gradient(xw, g_pad, weight, groups, dilation, parts)
                reach, zeros = [d * (k - 1) for k, d in zip(hw, dils)], [0] * len(hw)
                dx = _transposed_conv(g_pad, weight, None, groups, 1, dilation, reach, zeros, True, True)
                return dx.cast(x.dtype), dw
            grouped = flat_to_grouped(pads)
            out_pad = [
                i + pb + pa - d * (k - 1) - 1 - (o - 1) * s
                for i, o, k, s, d, (pb, pa) in zip(x.shape[2:], out.shape[2:], hw, strides, dils, grouped)
            ]
            # d/dx: a stride over 1 (no dilation) runs one conv per phase of the input (each reads the gradient at
            # the taps that reach it: no inserted zeros); otherwise the transposed conv, which reads a gradient
            # stored on a CPU in place through the pad's gates where that pays (conv_layout.py:
            # _output_gradient_read_in_place) and otherwise, or for a computed one, a padded copy (windows over
            # computed values would recompute them per window position)
            if any(s > 1 for s in strides) and all(d == 1 for d in dils) and all(isinstance(v, int) for v in out_pad):
                dx = _transposed_conv_in_phases(g, weight, groups, strides, grouped, x.shape[2:])
            else:
                dx = _transposed_conv(g, weight, None, groups, stride, dilation, pads, out_pad, True)
            if padded:
                xw, xw_pads = xw.pad(pads).contiguous(), [0] * len(pads)
            if channels_last or parts > 1:
                gw = _stored_channels_last(g) if channels_last else g
                dw = _weight_gradient_in_batch_parts(xw, gw, weight, xw_pads, groups, stride, dilation, parts)
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
        keys = key.shape[-2]
        keys_t = key.transpose(-2, -1)
        if _keys_in_panels(self, keys_t, is_causal):
            if self.shape[-2] % 2:  # (the score tile takes query rows in pairs: one row more, its output dropped)
                q, mask = _one_query_row_more(self, attn_mask)
                out = q.scaled_dot_product_attention(key, value, mask, dropout_p, is_causal, scale)
                return out.contiguous()[..., : self.shape[-2], :]
            key, value = _keys_padded_to_panels(key, value)
            keys_t = _stored_in_column_panels(key.transpose(-2, -1))
        scale = 1 / math.sqrt(self.shape[-1]) if scale is None else scale
        qk = self.matmul(keys_t) * scale
        qk = _padded_keys_masked(qk, keys)
        if is_causal and attn_mask is not None:
            raise ArgumentError("scaled_dot_product_attention: pass attn_mask or is_causal, not both")
        if is_causal and keys > CAUSAL_SKIP_MIN_KEYS:
            return _causal_attention(qk._float(), value, dropout_p, self, key, scale).cast(self.dtype)
        masked_rows = attn_mask is not None  # (is_causal's tril keeps key 0 in every row)
        if is_causal:  # keys in one panel: no key loop to end early, and the additive mask's kernels are fewer
            attn_mask = qk.ones_like(dtype=dtypes.bool).tril()
        if attn_mask is not None:
            if attn_mask.shape[-1] == keys != qk.shape[-1]:  # (the padded keys' scores are -inf already)
                attn_mask = attn_mask.pad(((0, 0),) * (attn_mask.ndim - 1) + ((0, qk.shape[-1] - keys),))
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

    def _loss_log_softmax(self: Tensor, axis: int) -> Tensor:
        """log_softmax for a loss that reduces it over the rows: x - lse, with torch's gradient g - exp(out) * sum(g)
        (reading x and lse only). Then lse, read inside the loss's reduce over the rows, is stored with the max and
        the sum of exp computed in its kernel (schedule/policy.py: is_unhoistable_row_statistic); the primitives'
        gradient reads the max and the sum themselves, so each was stored in a kernel of its own: one kernel more."""
        x = self._float()
        m = x.detach()._max(axis, keepdim=True)
        lse = (x - m).exp().sum(axis, keepdim=True).log() + m
        return with_gradient(x - lse, (x,), lambda g, out, x: (g - out.exp() * g.sum(axis, keepdim=True),))

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
        ret = -(x._loss_log_softmax(1) * y).sum(axis=1)
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
        log_probs = self._loss_log_softmax(-1)
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
