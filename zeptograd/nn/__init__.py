"""Neural-network layers, as tinygrad's `tinygrad.nn` (and initialized as PyTorch initializes them).

A layer is a plain object holding Tensors as attributes and computing with them in `__call__`: there is no Module
base class. `nn.state.get_parameters(model)` / `get_state_dict(model)` find the tensors by walking attributes,
lists and dicts, with names as PyTorch's (`layers.0.weight`). Weights are created lazily (random numbers are drawn
when first realized); an optimizer realizes them when it is built.

Shapes and conventions follow PyTorch: Linear's weight is (out, in), Conv weights are (out, in/groups, *kernel),
ConvTranspose weights are (in, out/groups, *kernel), LSTMCell gates are ordered i, f, g, o. BatchNorm normalizes
with the batch's statistics and updates its running statistics while `Tensor.training` is set, and uses the running
statistics otherwise.

Parameters (weights and biases) require grad from creation, as torch's nn.Parameter: `loss.backward()` fills their
`.grad` without an optimizer. Running statistics do not (`requires_grad=False`). Plain Tensors keep
requires_grad=None (not tracked) unless asked.
"""

from __future__ import annotations

import math

import numpy as np

from zeptograd.dtype import dtypes
from zeptograd.helpers import ArgumentError, ArgumentTypeError
from zeptograd.tensor import Tensor
from zeptograd.tensor.helpers import flatten, make_tuple, prod
from zeptograd.tensor.indexing import check_index_bounds

from . import optim, state  # noqa: E402,F401

__all__ = [
    "Linear",
    "Conv1d",
    "Conv2d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "BatchNorm",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "SyncBatchNorm",
    "GroupNorm",
    "InstanceNorm",
    "LayerNorm",
    "LayerNorm2d",
    "RMSNorm",
    "Embedding",
    "LSTMCell",
    "optim",
    "state",
]


def _param(t: Tensor) -> Tensor:
    """A layer's parameter: requires grad from the start, as torch's nn.Parameter, so loss.backward() fills its
    .grad before any optimizer exists. It stays lazy (drawn or filled when first realized)."""
    return t.requires_grad_(True)


def _uniform(*shape: int, bound: float) -> Tensor:
    return _param(Tensor.uniform(*shape, low=-bound, high=bound))


def _buffer(shape: tuple[int, ...], value: float, dtype=dtypes.float32) -> Tensor:
    """A tensor that is state but not a parameter (running statistics): optimizers realize it, never update it.
    Its own buffer from numpy (realized Tensor.full(...).contiguous() of one shape share a buffer today)."""
    t = Tensor(np.full(shape, value, dtype=np.float32), dtype=dtype)
    t.requires_grad = False
    return t


class Linear:
    """y = x @ weight.T + bias, weight (out_features, in_features); both uniform in +-1/sqrt(in_features)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        bound = 1 / math.sqrt(in_features)
        self.weight = _uniform(out_features, in_features, bound=bound)
        self.bias: Tensor | None = _uniform(out_features, bound=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.linear(self.weight.transpose(), self.bias)


class Conv2d:
    """N-d convolution (2-d with an int kernel_size; the kernel's length sets the rank). padding: int, per-dim
    ints, a flat torch-style (left, right, top, bottom) tuple, or 'same' (stride 1)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, ...],
        stride=1,
        padding: int | tuple[int, ...] | str = 0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
    ):
        self.kernel_size = make_tuple(kernel_size, 2)
        if in_channels % groups or out_channels % groups:
            raise ArgumentError(
                f"in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible by groups ({groups})"
            )
        if isinstance(padding, str):
            if padding.lower() != "same":
                raise ArgumentError(f"padding must be an int, a tuple of ints or 'same', got {padding!r}")
            if any(s != 1 for s in make_tuple(stride, len(self.kernel_size))):
                raise ArgumentError("padding='same' needs stride 1")
            dil = make_tuple(dilation, len(self.kernel_size))
            padding = tuple(
                flatten(
                    (d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2)
                    for d, k in zip(dil[::-1], self.kernel_size[::-1])
                )
            )
        self.stride, self.dilation, self.groups, self.padding = stride, dilation, groups, padding
        self.in_channels, self.out_channels = in_channels, out_channels
        bound = 1 / math.sqrt(in_channels // groups * prod(self.kernel_size))
        self.weight = _uniform(out_channels, in_channels // groups, *self.kernel_size, bound=bound)
        self.bias: Tensor | None = _uniform(out_channels, bound=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding)


def Conv1d(
    in_channels: int,
    out_channels: int,
    kernel_size: int,
    stride=1,
    padding: int | str = 0,
    dilation=1,
    groups: int = 1,
    bias: bool = True,
) -> Conv2d:
    """A 1-d convolution over (batch, channels, length): a Conv2d with a one-element kernel size."""
    return Conv2d(
        in_channels,
        out_channels,
        (kernel_size,) if isinstance(kernel_size, int) else kernel_size,
        stride,
        padding,
        dilation,
        groups,
        bias,
    )


class ConvTranspose2d(Conv2d):
    """The transpose (gradient) of Conv2d; weight (in_channels, out_channels/groups, *kernel)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, ...],
        stride=1,
        padding: int | tuple[int, ...] = 0,
        output_padding=0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
    ):
        if isinstance(padding, str):
            raise ArgumentError("ConvTranspose2d takes an int or tuple padding, not a string")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias=False)
        bound = 1 / math.sqrt(out_channels // groups * prod(self.kernel_size))  # PyTorch's fan_in: weight.size(1)
        self.weight = _uniform(in_channels, out_channels // groups, *self.kernel_size, bound=bound)
        self.bias = _uniform(out_channels, bound=bound) if bias else None
        self.output_padding = output_padding

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv_transpose2d(
            self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding, self.output_padding
        )


def ConvTranspose1d(
    in_channels: int,
    out_channels: int,
    kernel_size: int,
    stride=1,
    padding=0,
    output_padding=0,
    dilation=1,
    groups: int = 1,
    bias: bool = True,
) -> ConvTranspose2d:
    return ConvTranspose2d(
        in_channels,
        out_channels,
        (kernel_size,) if isinstance(kernel_size, int) else kernel_size,
        stride,
        padding,
        output_padding,
        dilation,
        groups,
        bias,
    )


class BatchNorm:
    """Batch normalization over every axis but 1 (BatchNorm1d/2d/3d are this class). While `Tensor.training` is
    set it normalizes with the batch's mean and biased variance and moves the running statistics towards them
    (running_var with the unbiased variance, as PyTorch); otherwise it uses the running statistics."""

    def __init__(
        self, sz: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True, momentum: float = 0.1
    ):
        self.eps, self.track_running_stats, self.momentum = eps, track_running_stats, momentum
        self.weight: Tensor | None = _param(Tensor.ones(sz)) if affine else None
        self.bias: Tensor | None = _param(Tensor.zeros(sz)) if affine else None
        self.num_batches_tracked = _buffer((), 0, dtypes.int64)
        if track_running_stats:
            self.running_mean, self.running_var = _buffer((sz,), 0.0), _buffer((sz,), 1.0)

    def calc_stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(mean, biased variance) over every axis but 1; the running ones in eval mode."""
        shape_mask = [1, -1, *([1] * (x.ndim - 2))]
        if self.track_running_stats and not Tensor.training:
            return self.running_mean, self.running_var.reshape(shape_mask).expand(x.shape)
        return self.batch_stats(x)[:2]

    def batch_stats(self, x: Tensor) -> tuple[Tensor, Tensor, int]:
        """(mean, biased variance, the number of values each is over) of the batch, over every axis but 1."""
        axes = tuple(a for a in range(x.ndim) if a != 1)
        batch_mean = x.mean(axis=axes)
        y = x - batch_mean.detach().reshape([1, -1, *([1] * (x.ndim - 2))])  # d(var)/d(mean) = 0
        return batch_mean, (y * y).mean(axis=axes), x.numel() // x.shape[1]

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 2 or (self.weight is not None and x.shape[1] != self.weight.shape[0]):
            raise ArgumentError(
                f"BatchNorm of {self.weight.shape[0] if self.weight is not None else '?'} channels "
                f"got an input of shape {x.shape} (channels on axis 1)"
            )
        if self.track_running_stats and not Tensor.training:
            batch_mean, batch_var = self.calc_stats(x)
        else:
            batch_mean, batch_var, n = self.batch_stats(x)
        if self.track_running_stats and Tensor.training:
            with Tensor.no_grad():
                self.running_mean.assign((1 - self.momentum) * self.running_mean + self.momentum * batch_mean.detach())
                self.running_var.assign(
                    (1 - self.momentum) * self.running_var + self.momentum * n / max(n - 1, 1) * batch_var.detach()
                )
                self.num_batches_tracked.assign(self.num_batches_tracked + 1)
        return x.batchnorm(self.weight, self.bias, batch_mean, batch_var.add(self.eps).rsqrt())


BatchNorm1d = BatchNorm2d = BatchNorm3d = BatchNorm


class SyncBatchNorm(BatchNorm):
    """BatchNorm whose training statistics are over the whole batch of every rank of a `zeptograd.distributed` job
    (torch's nn.SyncBatchNorm): each rank's sums are all-reduced in the forward and their gradients in backward, so
    2 ranks on two halves of a batch compute what one process computes on the whole batch. Every rank passes the
    same shape. Outside a job of several ranks (no `distributed.init()`, or one rank) it is BatchNorm, as torch's.
    The collectives run eagerly: not inside a TinyJit (`DataParallel.train_step(jit=False)`)."""

    def batch_stats(self, x: Tensor) -> tuple[Tensor, Tensor, int]:
        from zeptograd import distributed

        if not distributed.is_initialized() or distributed.world_size() == 1:
            return super().batch_stats(x)
        return distributed.sync_batch_stats(x, tuple(a for a in range(x.ndim) if a != 1))


class LayerNorm:
    """Normalizes over the last len(normalized_shape) axes, then weight * x + bias (ones and zeros)."""

    def __init__(self, normalized_shape: int | tuple[int, ...], eps: float = 1e-5, elementwise_affine: bool = True):
        self.normalized_shape: tuple[int, ...] = make_tuple(normalized_shape, 1)
        self.axis = tuple(-1 - i for i in range(len(self.normalized_shape)))
        self.eps, self.elementwise_affine = eps, elementwise_affine
        self.weight: Tensor | None = _param(Tensor.ones(*self.normalized_shape)) if elementwise_affine else None
        self.bias: Tensor | None = _param(Tensor.zeros(*self.normalized_shape)) if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        if x.shape[-len(self.normalized_shape) :] != self.normalized_shape:
            raise ArgumentError(
                f"LayerNorm{self.normalized_shape}: the last dimensions of the input {x.shape} must be "
                f"{self.normalized_shape}"
            )
        x = x.layernorm(eps=self.eps, axis=self.axis)
        return x if self.weight is None or self.bias is None else x * self.weight + self.bias


class LayerNorm2d(LayerNorm):
    """LayerNorm over the channels of an NCHW tensor."""

    def __call__(self, x: Tensor) -> Tensor:
        return super().__call__(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _channel_affine(x: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    if weight is None or bias is None:
        return x
    shape = (1, -1, *[1] * (x.ndim - 2))
    return x * weight.reshape(shape) + bias.reshape(shape)


class GroupNorm:
    """Normalizes each group of num_channels // num_groups channels (with all their positions) of each sample."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
        if num_channels % num_groups:
            raise ArgumentError(
                f"GroupNorm: num_channels ({num_channels}) must be divisible by num_groups ({num_groups})"
            )
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight: Tensor | None = _param(Tensor.ones(num_channels)) if affine else None
        self.bias: Tensor | None = _param(Tensor.zeros(num_channels)) if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        x = x.reshape(x.shape[0], self.num_groups, -1).layernorm(eps=self.eps).reshape(x.shape)
        return _channel_affine(x, self.weight, self.bias)


class InstanceNorm:
    """Normalizes each channel of each sample over its positions."""

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True):
        self.num_features, self.eps = num_features, eps
        self.weight: Tensor | None = _param(Tensor.ones(num_features)) if affine else None
        self.bias: Tensor | None = _param(Tensor.zeros(num_features)) if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        x = x.reshape(x.shape[0], self.num_features, -1).layernorm(eps=self.eps).reshape(x.shape)
        return _channel_affine(x, self.weight, self.bias)


class RMSNorm:
    """x / sqrt(mean(x^2, last axis) + eps) * weight, computed in float32 at least."""

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True):
        self.eps = eps
        self.weight: Tensor | None = _param(Tensor.ones(dim)) if elementwise_affine else None

    def _norm(self, x: Tensor) -> Tensor:
        return x * (x.square().mean(-1, keepdim=True) + self.eps).rsqrt()

    def __call__(self, x: Tensor) -> Tensor:
        y = self._norm(x.float() if x.dtype in (dtypes.float16, dtypes.bfloat16) else x).cast(x.dtype)
        return y if self.weight is None else y * self.weight


class Embedding:
    """A lookup table: integer indices of any shape -> rows of weight (vocab_size, embed_size), N(0, 1) at first.
    The lookup is a one-hot product, so its gradient is a plain reduce (no scatter). An index outside
    [0, vocab_size) is an IndexError at the call (as torch; the one-hot product would give a row of zeros)."""

    def __init__(self, vocab_size: int, embed_size: int):
        self.vocab_sz, self.embed_sz = vocab_size, embed_size
        self.weight = _param(Tensor.randn(vocab_size, embed_size))

    def __call__(self, idx: Tensor) -> Tensor:
        if not dtypes.is_int(idx.dtype):
            raise ArgumentTypeError(f"Embedding needs integer indices, got {idx.dtype}")
        if idx.numel() == 0:
            return Tensor.zeros(*idx.shape, self.embed_sz, dtype=self.weight.dtype, device=self.weight.device)
        check_index_bounds(idx, self.vocab_sz, 0, wrap=False, what="Embedding: ")  # else a row of zeros
        big = (*idx.shape, self.vocab_sz, self.embed_sz)
        classes = Tensor.arange(self.vocab_sz, device=self.weight.device).reshape(self.vocab_sz, 1).expand(big)
        hot = classes == idx.reshape(*idx.shape, 1, 1).expand(big)
        return hot.where(self.weight.expand(big), 0).sum(-2)


class LSTMCell:
    """One step of an LSTM: (x, (h, c)) -> (h', c'); weights and biases uniform in +-1/sqrt(hidden_size)."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
        stdv = 1.0 / math.sqrt(hidden_size)
        self.weight_ih = _uniform(hidden_size * 4, input_size, bound=stdv)
        self.weight_hh = _uniform(hidden_size * 4, hidden_size, bound=stdv)
        self.bias_ih: Tensor | None = _uniform(hidden_size * 4, bound=stdv) if bias else None
        self.bias_hh: Tensor | None = _uniform(hidden_size * 4, bound=stdv) if bias else None

    def __call__(self, x: Tensor, hc: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        if hc is None:
            zeros = Tensor.zeros(x.shape[0], self.weight_hh.shape[1], dtype=x.dtype, device=x.device)
            hc = (zeros, zeros)
        gates = x.linear(self.weight_ih.T, self.bias_ih) + hc[0].linear(self.weight_hh.T, self.bias_hh)
        i, f, g, o = gates.chunk(4, dim=1)
        i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
        new_c = f * hc[1] + i * g
        new_h = o * new_c.tanh()
        return new_h.contiguous(), new_c.contiguous()
