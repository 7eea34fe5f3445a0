"""Kernel counts of common expressions, each checked against numpy (or torch) too.

Every case states the kernel count a good fusing scheduler reaches: movement ops (also pad, flip, expand and
shrink in the middle of a chain) never make a kernel of their own, elementwise ops fuse into their consumer, a
reduce fuses with its elementwise prologue and epilogue, outputs of one shape from the same inputs are one
kernel, arange and index-only expressions feed their consumers, softmax/layernorm over the last axis take 1 (the
row statistics computed before the output row, schedule/policy.py: hoisted_reduce_requests), matmul + bias + relu
takes 1.

The count is checked twice: `len(schedule())` before running and GlobalCounters.kernel_count while realizing.
Where zeptograd schedules more kernels today the case carries an `xfail` reason naming the extra kernel; a count
mismatch raises KernelCountMismatch, and only that is an expected failure: wrong VALUES fail every case, xfail
or not. `python -m tests.schedule.test_schedule_cases [name ...]` prints each case's kernels (name and buffer shapes).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from tests.slow import fast_first
from zeptograd import Context, GlobalCounters, Tensor, dtypes

rng = np.random.default_rng(1234)


class KernelCountMismatch(AssertionError):
    """The values are right but the number of kernels is not the expected one."""


def rand(*shape, lo=-1.0, hi=1.0) -> tuple[Tensor, np.ndarray]:
    x = rng.uniform(lo, hi, shape).astype(np.float32)
    return Tensor(x), x


def randint(*shape, hi) -> tuple[Tensor, np.ndarray]:
    x = rng.integers(0, hi, shape).astype(np.int32)
    return Tensor(x), x


@dataclass
class Case:
    name: str
    build: Callable[[], tuple]  # -> (outputs, references[, Context kwargs]); outputs a Tensor or a list
    kernels: int
    rtol: float = 1e-5
    atol: float = 1e-6
    xfail: str | None = None  # why zeptograd schedules more kernels today (the extra kernels)
    at_most: bool = False  # `kernels` is an upper bound (softmax, layernorm)


CASES: list[Case] = []


def case(kernels: int, rtol: float = 1e-5, atol: float = 1e-6, xfail: str | None = None, at_most: bool = False):
    def deco(fn):
        CASES.append(Case(fn.__name__, fn, kernels, rtol, atol, xfail, at_most))
        return fn

    return deco


# ***** elementwise chains and broadcasting *****


@case(1)
def ew_broadcast_chain():
    (a, an), (b, bn), (c, cn) = rand(4, 1), rand(1, 5), rand(4, 5)
    return ((a + b) * c - a) / (b * b + 1), ((an + bn) * cn - an) / (bn * bn + 1)


@case(1)
def ew_three_way_broadcast_scalar():
    (a, an), (b, bn), (c, cn) = rand(3, 1, 5), rand(1, 4, 1), rand(5)
    return (a * b + 2 - c).relu() * 0.5, np.maximum(an * bn + 2 - cn, 0) * 0.5


@case(1, rtol=1e-4, atol=1e-5)
def ew_transcendental_chain():
    (a, an), (b, bn) = rand(6, 7), rand(7)
    t = (a.exp() + b.sigmoid()).log() * a.tanh() + (a * 3).sin()
    ref = np.log(np.exp(an) + 1 / (1 + np.exp(-bn))) * np.tanh(an) + np.sin(an * 3)
    return t, ref


@case(1)
def ew_lerp_by_hand():
    (a, an), (b, bn), (w, wn) = rand(40), rand(40), rand(40, lo=0, hi=1)
    return a * (1 - w) + b * w, an * (1 - wn) + bn * wn


@case(1)
def ew_lerp_method():
    (a, an), (b, bn), (w, wn) = rand(5, 8), rand(5, 8), rand(8, lo=0, hi=1)
    return a.lerp(b, w), an + (bn - an) * wn


@case(1)
def ew_where_broadcast():
    (c, cn), (a, an), (b, bn) = rand(4, 1), rand(1, 6), rand(4, 6)
    return (c > 0).where(a, b), np.where(cn > 0, an, bn)


@case(1)
def ew_where_scalar_branches():
    x, xn = rand(5, 6)
    return (x < 0.25).where(x * 2, -1.0) + 1, np.where(xn < 0.25, xn * 2, -1.0) + 1


@case(1)
def ew_compare_and_cast():
    (a, an), (b, bn) = rand(4, 5), rand(5)
    t = (a < b).float() * 2 + (a >= 0).int() - (a == a).cast(dtypes.float32)
    ref = (an < bn).astype(np.float32) * 2 + (an >= 0).astype(np.int32) - 1
    return t, ref.astype(np.float32)


@case(1)
def ew_clip_and_abs():
    x, xn = rand(50, lo=-3, hi=3)
    return x.clip(-1, 1) + x.abs().minimum(2), np.clip(xn, -1, 1) + np.minimum(np.abs(xn), 2)


@case(1)
def ew_int_arithmetic():
    (a, an), (b, bn) = randint(6, 4, hi=50), randint(4, hi=7)
    t = (a * 3 + b) % 11 - (a >> 1)
    return t, (an * 3 + bn) % 11 - (an >> 1)


# ***** movement ops inside fused chains *****


@case(1)
def mv_pad_in_chain():
    x, xn = rand(4, 5)
    return ((x + 1).pad(((1, 2), (0, 3))) * 2).exp2(), np.exp2(np.pad(xn + 1, ((1, 2), (0, 3))) * 2)


@case(1)
def mv_flip_in_chain():
    (x, xn), (y, yn) = rand(4, 5), rand(4, 5)
    return (x * 2).flip(0, 1) + y, (xn * 2)[::-1, ::-1] + yn


@case(1)
def mv_shrink_in_chain():
    (x, xn), (y, yn) = rand(6, 8), rand(3, 4)
    return (x - 1)[1:4, 2:6] * y, (xn - 1)[1:4, 2:6] * yn


@case(1)
def mv_pad_flip_shrink_combo():
    (x, xn), (y, yn) = rand(6, 5), rand(4, 9)
    t = ((x * 3).flip(1).pad(((1, 1), (2, 2)))[2:6, :] - y).relu().T
    ref = np.maximum(np.pad((xn * 3)[:, ::-1], ((1, 1), (2, 2)))[2:6, :] - yn, 0).T
    return t, ref


@case(1)
def mv_expand_reshape_permute_chain():
    (x, xn), (y, yn) = rand(3, 1, 4), rand(2, 3, 5, 4)
    t = (x.expand(3, 5, 4) + 1).reshape(1, 3, 5, 4).expand(2, 3, 5, 4) * y
    t = t.permute(0, 3, 1, 2).reshape(8, 15) - 0.5
    ref = ((np.broadcast_to(xn, (3, 5, 4)) + 1)[None] * yn).transpose(0, 3, 1, 2).reshape(8, 15) - 0.5
    return t, ref


@case(1)
def mv_strided_slice_and_repeat():
    x, xn = rand(6, 7)
    t = (x * 2)[::2, ::-3].repeat(2, 3) + 1
    return t, np.tile((xn * 2)[::2, ::-3], (2, 3)) + 1


@case(1)
def mv_roll():
    x, xn = rand(5, 6)
    return (x + 1).roll(2, 1) * 3, np.roll(xn + 1, 2, axis=1) * 3


@case(1)
def mv_tril_and_triu():
    (x, xn), (y, yn) = rand(6, 6), rand(6, 6)
    return x.tril() + y.triu(1), np.tril(xn) + np.triu(yn, 1)


# ***** cat / stack *****


@case(1)
def cat_two():
    (a, an), (b, bn) = rand(3, 4), rand(5, 4)
    return a.cat(b, dim=0) * 2, np.concatenate([an, bn], 0) * 2


@case(1)
def cat_three_last_axis_of_chains():
    (a, an), (b, bn), (c, cn) = rand(3, 2), rand(3, 4), rand(3, 1)
    t = (a + 1).cat(b * 2, c.exp2(), dim=1)
    return t, np.concatenate([an + 1, bn * 2, np.exp2(cn)], 1)


@case(1)
def stack_two():
    (a, an), (b, bn) = rand(4, 5), rand(4, 5)
    return Tensor.stack(a, b - a, dim=1), np.stack([an, bn - an], 1)


@case(1)
def stack_three():
    (a, an), (b, bn), (c, cn) = rand(6), rand(6), rand(6)
    return Tensor.stack(a, b, c * c).relu(), np.maximum(np.stack([an, bn, cn * cn]), 0)


# ***** reduces with prologue / epilogue *****


@case(1)
def red_prologue_and_epilogue():
    (x, xn), (b, bn) = rand(8, 16), rand(8)
    t = ((x - 0.5) * (x - 0.5)).sum(axis=1).sqrt() * 2 + b
    return t, np.sqrt(((xn - 0.5) ** 2).sum(1)) * 2 + bn


@case(1)
def red_sum_axis0_tall():
    x, xn = rand(256, 3)
    return x.sum(axis=0), xn.sum(0)


@case(1)
def red_full_sum_of_product():
    (a, an), (b, bn) = rand(12, 10), rand(12, 10)
    return (a * b).sum(), (an * bn).sum()


@case(1)
def red_transpose_then_reduce():
    x, xn = rand(6, 9)
    return (x.T * 2).sum(axis=1), (xn.T * 2).sum(1)


@case(1)
def red_expand_then_reduce():
    (x, xn), (y, yn) = rand(5, 1), rand(5, 7)
    return (x.expand(5, 7) * y).sum(axis=0), (np.broadcast_to(xn, (5, 7)) * yn).sum(0)


@case(1)
def red_max_over_two_axes():
    x, xn = rand(3, 4, 5)
    return x.max(axis=(0, 2)), xn.max((0, 2))


@case(1)
def red_min_over_two_axes_keepdim():
    x, xn = rand(3, 4, 5)
    return x.min(axis=(1, 2), keepdim=True) * 2, xn.min((1, 2), keepdims=True) * 2


@case(1)
def red_mean():
    x, xn = rand(6, 10)
    return x.mean(axis=1), xn.mean(1)


@case(1)
def red_sum_of_padded():
    x, xn = rand(4, 5)
    return (x.pad(((1, 0), (2, 2))) + 1).sum(axis=0), (np.pad(xn, ((1, 0), (2, 2))) + 1).sum(0)


@case(1)
def red_sum_and_max_of_same_rows():
    x, xn = rand(7, 9)
    return x.sum(axis=1) * x.max(axis=1), xn.sum(1) * xn.max(1)


@case(1)
def red_nested_reduce():
    x, xn = rand(4, 5, 6)
    return x.sum(axis=2).max(axis=1), xn.sum(2).max(1)


@case(1)
def red_var():
    x, xn = rand(6, 10)
    return x.var(axis=1), xn.var(1, ddof=1)


@case(1, rtol=1e-4)
def red_std_keepdim():
    x, xn = rand(6, 10)
    return x.std(axis=1, keepdim=True), xn.std(1, ddof=1, keepdims=True)


@case(1)
def red_argmax():
    x, xn = rand(6, 11)
    return x.argmax(axis=1), xn.argmax(1)


@case(1)
def red_cumsum():
    x, xn = rand(4, 12)
    return x.cumsum(1), np.cumsum(xn, 1)


@case(1, rtol=1e-5, atol=1e-5)
def red_logsumexp():
    x, xn = rand(5, 9)
    m = xn.max(1, keepdims=True)
    return x.logsumexp(1), (np.log(np.exp(xn - m).sum(1, keepdims=True)) + m)[:, 0]


@case(1, rtol=1e-5, atol=1e-6)
def red_l2_normalize():
    x, xn = rand(5, 8)
    return x.normalize(dim=1), xn / np.maximum(np.sqrt((xn * xn).sum(1, keepdims=True)), 1e-12)


# ***** softmax and normalization *****


@case(1, rtol=1e-5, atol=1e-6)
def softmax_last_axis():
    x, xn = rand(8, 30, lo=-3, hi=3)
    e = np.exp(xn - xn.max(-1, keepdims=True))
    return x.softmax(-1), e / e.sum(-1, keepdims=True)


@case(1, rtol=1e-5, atol=1e-5)
def log_softmax_last_axis():
    x, xn = rand(8, 30, lo=-3, hi=3)
    m = xn - xn.max(-1, keepdims=True)
    return x.log_softmax(-1), m - np.log(np.exp(m).sum(-1, keepdims=True))


@case(1, rtol=1e-4, atol=1e-5)
def layernorm_method():
    x, xn = rand(6, 32)
    y = xn - xn.mean(-1, keepdims=True)
    return x.layernorm(), y / np.sqrt((y * y).mean(-1, keepdims=True) + 1e-5)


@case(1, rtol=1e-4, atol=1e-5)
def layernorm_by_hand_affine():
    (x, xn), (g, gn), (b, bn) = rand(6, 32), rand(32), rand(32)
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    t = (x - mean) / (var + 1e-5).sqrt() * g + b
    ref = (xn - xn.mean(-1, keepdims=True)) / np.sqrt(xn.var(-1, keepdims=True) + 1e-5) * gn + bn
    return t, ref


# ***** matmul, conv *****


@case(1, rtol=1e-4, atol=1e-5)
def matmul_bias_relu():
    (x, xn), (w, wn), (b, bn) = rand(8, 16), rand(16, 12), rand(12)
    return (x @ w + b).relu(), np.maximum(xn @ wn + bn, 0)


@case(1, rtol=1e-4, atol=1e-5)
def linear_bias_relu():
    (x, xn), (w, wn), (b, bn) = rand(5, 10), rand(10, 7), rand(7)
    return x.linear(w, b).relu(), np.maximum(xn @ wn + bn, 0)


def _erf(x):
    return np.vectorize(math.erf)(x).astype(np.float32)


@case(2, rtol=1e-4, atol=1e-4)
def matmul_gelu_matmul():
    """gelu (erf, exp) feeds the second matmul through an expand: it is stored once as the first matmul's epilogue,
    not recomputed in the second matmul's loop once per output column."""
    (x, xn), (w1, w1n), (w2, w2n) = rand(6, 8), rand(8, 16), rand(16, 5)
    h = xn @ w1n
    return (x @ w1).gelu(approximate="none") @ w2, (0.5 * h * (1 + _erf(h / math.sqrt(2)))) @ w2n


@case(1, rtol=1e-4, atol=1e-4)
def layernorm_then_matmul():
    """mean, variance, the matmul with the normalized rows inlined: the row statistics computed once per row before
    its output columns, the normalized rows at 6x32 @ 32x7 recomputed once per output column (1344 rsqrts) costs less
    than a kernel. At 256x256 the cost model stores them (tests/schedule/test_cost.py:
    test_a_costly_prologue_of_a_large_matmul_is_stored)."""
    (x, xn), (w, wn) = rand(6, 32), rand(32, 7)
    y = (xn - xn.mean(-1, keepdims=True)) / np.sqrt(xn.var(-1, keepdims=True) + 1e-5)
    return x.layernorm() @ w, y @ wn


@case(1, rtol=1e-5, atol=1e-5)
def erf_chain_not_cut():
    """erf's polynomial uses its inputs many times: the fused-ops limit counts each shared op once."""
    x, xn = rand(4, 8)
    return x.erf().erf().erf(), _erf(_erf(_erf(xn)))


@case(1, rtol=1e-4, atol=1e-5)
def batched_matmul():
    (x, xn), (w, wn) = rand(3, 4, 6), rand(6, 5)
    return x @ w, xn @ wn


@case(1, rtol=1e-4, atol=1e-5)
def einsum_matmul_transposed():
    (a, an), (b, bn) = rand(4, 6), rand(5, 6)
    return Tensor.einsum("ik,jk->ij", a, b), an @ bn.T


@case(1, rtol=1e-4, atol=1e-5)
def conv2d_batchnorm_relu():
    import torch

    (x, xn), (w, wn) = rand(2, 3, 6, 6), rand(4, 3, 3, 3)
    (g, gn), (b, bn), (m, mn) = rand(4), rand(4), rand(4)
    v, vn = rand(4, lo=0.5, hi=2.0)
    t = x.conv2d(w, padding=1).batchnorm(g, b, m, (v + 1e-5).rsqrt()).relu()
    conv = torch.nn.functional.conv2d(torch.from_numpy(xn), torch.from_numpy(wn), padding=1)
    bnorm = torch.nn.functional.batch_norm(
        conv,
        torch.from_numpy(mn),
        torch.from_numpy(vn),
        torch.from_numpy(gn),
        torch.from_numpy(bn),
        training=False,
        eps=1e-5,
    )
    return t, bnorm.relu().numpy()


@case(1, rtol=1e-4, atol=1e-5)
def conv2d_bias_hand_bn_relu():
    import torch

    (x, xn), (w, wn), (cb, cbn) = rand(1, 2, 5, 5), rand(3, 2, 3, 3), rand(3)
    (m, mn), (v, vn) = rand(3), rand(3, lo=0.5, hi=2.0)
    t = ((x.conv2d(w, cb) - m.reshape(1, 3, 1, 1)) / (v.reshape(1, 3, 1, 1) + 1e-5).sqrt()).relu()
    conv = torch.nn.functional.conv2d(torch.from_numpy(xn), torch.from_numpy(wn), torch.from_numpy(cbn)).numpy()
    ref = np.maximum((conv - mn.reshape(1, 3, 1, 1)) / np.sqrt(vn.reshape(1, 3, 1, 1) + 1e-5), 0)
    return t, ref


@case(1)
def max_pool2d():
    x, xn = rand(2, 2, 6, 6)
    return x.max_pool2d(2), xn.reshape(2, 2, 3, 2, 3, 2).max((3, 5))


@case(1)
def avg_pool2d():
    x, xn = rand(1, 3, 4, 6)
    return x.avg_pool2d(2), xn.reshape(1, 3, 2, 2, 3, 2).mean((3, 5))


# ***** indexing and gather *****


@case(1)
def index_with_int_tensor():
    (x, xn), (i, idn) = rand(10), randint(7, hi=10)
    return x[i] * 2, xn[idn] * 2


@case(1)
def index_rows_with_int_tensor():
    (x, xn), (i, idn) = rand(6, 4), randint(5, hi=6)
    return x[i] + 1, xn[idn] + 1


@case(1)
def index_columns_with_int_tensor():
    (x, xn), (i, idn) = rand(4, 6), randint(5, hi=6)
    return x[:, i] * x[:, i], xn[:, idn] * xn[:, idn]


@case(1)
def index_1d_after_ellipsis():  # the one spelling of x[int tensor] that works today
    (x, xn), (i, idn) = rand(9), randint(6, hi=9)
    return (x + 1)[..., i] * 2, (xn + 1)[idn] * 2


@case(1)
def ellipsis_basic_index_in_chain():
    x, xn = rand(3, 4, 5)
    return (x * 2)[..., 1:4] + x[1, ...].reshape(1, 4, 5)[..., :3], (xn * 2)[..., 1:4] + xn[1, ...][None, :, :3]


@case(1)
def gather_dim1():
    (x, xn), (i, idn) = rand(4, 6), randint(4, 3, hi=6)
    return x.gather(1, i), np.take_along_axis(xn, idn.astype(np.int64), 1)


@case(1)
def one_hot():
    i, idn = randint(7, hi=5)
    return i.one_hot(5), np.eye(5, dtype=np.int64)[idn]


@case(1)
def setitem_loop():
    t = Tensor.empty(10)
    for i in range(10):
        t[i] = i
    return t, np.arange(10, dtype=np.float32)


@case(1)
def setitem_slices():
    x, xn = rand(8)
    t = Tensor.empty(8)
    t[:4] = x[4:]
    t[4:] = x[:4] * 2
    return t, np.concatenate([xn[4:], xn[:4] * 2])


@case(1)
def masked_fill():
    (x, xn), (m, mn) = rand(4, 5), rand(5)
    return x.masked_fill(m > 0, -9.0), np.where(mn > 0, -9.0, xn).astype(np.float32)


# ***** multi-output, constants, arange, contiguous, split reduce *****


@case(1)
def multi_output_same_shape():
    x, xn = rand(4, 6)
    return [(x + 1).exp2(), x * x - 2], [np.exp2(xn + 1), xn * xn - 2]


@case(1)
def multi_output_three_from_two_inputs():
    (a, an), (b, bn) = rand(5, 5), rand(5)
    return [a + b, a * b, (a - b).relu()], [an + bn, an * bn, np.maximum(an - bn, 0)]


@case(0)
def const_fold_elementwise():
    return Tensor.ones(10) * 15 + Tensor.ones(10) * 30, np.full(10, 45, np.float32)


@case(0)
def const_full_sum():
    return Tensor.full((4, 6), 2.5).sum(), np.float32(60.0)


@case(0)
def const_full_reduce_axis_chain():
    return (Tensor.full((3, 4), 2.0).sum(axis=1) * Tensor.ones(3) + 1).max(), np.float32(9.0)


@case(1)
def arange_times_x():
    x, xn = rand(12)
    return x * Tensor.arange(12), xn * np.arange(12)


@case(1)
def arange_fed_reduce():
    x, xn = rand(3, 4)
    return (x * Tensor.arange(12).reshape(3, 4) + 1).sum(axis=1), (xn * np.arange(12).reshape(3, 4) + 1).sum(1)


@case(1)
def eye_times_x():
    x, xn = rand(5, 5)
    return Tensor.eye(5) * x + 1, np.eye(5, dtype=np.float32) * xn + 1


@case(2)
def explicit_contiguous_in_chain():
    x, xn = rand(5, 6)
    return ((x + 1).contiguous() * 2).exp2(), np.exp2((xn + 1) * 2)


@case(2, rtol=1e-4, atol=1e-3)
def large_full_sum_split():
    x, xn = rand(1 << 20)
    return x.sum(), xn.astype(np.float64).sum()


@case(1, rtol=1e-4, atol=1e-3)
def large_full_sum_unsplit():
    x, xn = rand(1 << 20)
    return x.sum(), xn.astype(np.float64).sum(), {"SPLIT_REDUCEOP": 0}


# ***** the test *****


def _seeded_build(c: Case) -> tuple:
    global rng
    rng = np.random.default_rng(zlib.crc32(c.name.encode()))  # each case's inputs, whatever order cases run in
    return c.build()


def _run(c: Case):
    built = _seeded_build(c)
    outs, refs = built[0], built[1]
    ctx = built[2] if len(built) > 2 else {}
    outs = outs if isinstance(outs, list) else [outs]
    refs = refs if isinstance(refs, list) else [refs]
    with Context(**ctx):
        scheduled = len(outs[0].schedule(*outs[1:]))
        GlobalCounters.reset()
        outs[0].realize(*outs[1:])
        ran = GlobalCounters.kernel_count
    return outs, refs, scheduled, ran


@pytest.mark.parametrize(
    "c",
    fast_first(
        [
            pytest.param(
                c,
                id=c.name,
                marks=[pytest.mark.xfail(reason=c.xfail, raises=KernelCountMismatch, strict=True)] if c.xfail else [],
            )
            for c in CASES
        ]
    ),
)
def test_case(c: Case):
    outs, refs, scheduled, ran = _run(c)
    for i, (o, r) in enumerate(zip(outs, refs)):  # values first: a wrong value is never an expected failure
        got = o.numpy()
        assert got.shape == np.shape(r), f"output {i}: shape {got.shape}, expected {np.shape(r)}"
        np.testing.assert_allclose(got, r, rtol=c.rtol, atol=c.atol, err_msg=f"output {i} of {c.name}")
    ok = (lambda n: n <= c.kernels) if c.at_most else (lambda n: n == c.kernels)
    if not (ok(scheduled) and ok(ran)):
        raise KernelCountMismatch(
            f"{c.name}: scheduled {scheduled}, ran {ran}, expected {'at most ' if c.at_most else ''}{c.kernels}"
        )


def test_enough_cases():
    assert len(CASES) >= 45 and len({c.name for c in CASES}) == len(CASES)


def describe(c: Case) -> list[tuple[str, list[int]]]:
    """[(kernel name, the sizes of its buffers, output first)] of a case's schedule."""
    from zeptograd.codegen import kernel_name

    built = _seeded_build(c)
    outs = built[0] if isinstance(built[0], list) else [built[0]]
    with Context(**(built[2] if len(built) > 2 else {})):
        return [(kernel_name(item.ast), [b.size for b in item.bufs]) for item in outs[0].schedule(*outs[1:])]


if __name__ == "__main__":
    import sys

    for c in CASES:
        if len(sys.argv) == 1 or c.name in sys.argv[1:]:
            print(f"{c.name:<36} expect {'<=' if c.at_most else ''}{c.kernels}  got {describe(c)}")
