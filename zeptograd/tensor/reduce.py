"""Reductions (one REDUCE_AXIS each), scans, softmax, and sorting, composed from movement, ALU and reduce ops."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from zeptograd.dtype import DTypeLike, dtypes, sum_acc_dtype, to_dtype
from zeptograd.helpers import ArgumentError, ArgumentTypeError
from zeptograd.tensor.helpers import normalize_axis, prod
from zeptograd.uop.ops import GroupOp, Ops, UOp

# ops whose value may differ in the last bits between two kernels that compute it: an approximated op's vector
# polynomial and its scalar call round differently, a reduce adds in the order its kernel's vectorization gives
_INEXACT_RECOMPUTE = GroupOp.Approximated | {Ops.REDUCE_AXIS}
_STORED = frozenset((Ops.BUFFER, Ops.CONTIGUOUS))


def _recompute_may_differ(u: UOp) -> bool:
    """Whether u's graph (down to stored values) holds an op of _INEXACT_RECOMPUTE."""
    stack, seen = [u], {u}
    while stack:
        n = stack.pop()
        if n.op in _INEXACT_RECOMPUTE:
            return True
        if n.op in _STORED:
            continue
        for s in n.src:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return False


# a scan runs in blocks of this many (`_blocked_scan`; a scan through n x n windows would cost O(n^2)): each output
# element of a block combines this many shifted loads, and log_SCAN_BLOCK(n) levels scan the blocks' totals
SCAN_BLOCK = 16

if TYPE_CHECKING:
    from zeptograd.tensor import Tensor


def _compare_exchange(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """(smaller, larger) of a and b elementwise, nan above +inf (torch's sort order): the values are moved, never
    combined, so a nan stays where it sorts instead of spreading through min/max."""
    if not dtypes.is_float(a.dtype):
        return a.minimum(b), a.maximum(b)
    swap = (a > b) | (a.isnan() & b.isnan().logical_not())
    return swap.where(b, a), swap.where(a, b)


def _combine(op: Ops, a: Tensor, b: Tensor) -> Tensor:
    """a op b for a scan's op."""
    return a + b if op is Ops.ADD else a * b if op is Ops.MUL else a.maximum(b)


def _sort_eq(a: Tensor, b: Tensor) -> Tensor:
    """Equality as sort sees it: nan equals nan."""
    return (a == b) | (a.isnan() & b.isnan()) if dtypes.is_float(a.dtype) else a == b


class ReduceMixin:
    __slots__ = ()

    def _axes(self: Tensor, axis) -> tuple[int, ...]:
        if type(axis) is int and -(n := len(self.shape)) <= axis < n:  # (one axis in range: normalize_axis's answer)
            return (axis + n if axis < 0 else axis,)
        if axis is None:
            return tuple(range(self.ndim))
        axes = (axis,) if not isinstance(axis, (tuple, list)) else tuple(axis)  # normalize_axis checks each
        return tuple(sorted({normalize_axis(a, self.ndim) for a in axes}))

    def _reduce(self: Tensor, op: Ops, axis=None, keepdim: bool = False) -> Tensor:
        """One REDUCE_AXIS over the reduced axes (kept as size 1), then a reshape if not keepdim."""
        axes = self._axes(axis)
        if self.ndim == 0 or not axes:
            return self
        if op is Ops.MAX and self.requires_grad and dtypes.is_float(self.dtype) and _recompute_may_differ(self.uop):
            # the gradient compares x with its max (`x == max`): x is stored once, so that the backward's x has the
            # very bits the max was taken of (recomputed in another kernel, one ulp off, it matched no element); where
            # the schedule stores x anyway (a matmul's output), that buffer is the copy (bufferize.contiguous_aliases)
            self = self.contiguous()
        ret = self._new(UOp(Ops.REDUCE_AXIS, self.dtype, (self.uop,), (op, axes)))
        return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def _acc_reduce(self: Tensor, op: Ops, axis, keepdim: bool, dtype: DTypeLike | None) -> Tensor:
        """sum/prod: ints accumulate (and return) int64, halves accumulate in float32 and return half, as torch."""
        out = self.cast(to_dtype(dtype) if dtype is not None else sum_acc_dtype(self.dtype))._reduce(op, axis, keepdim)
        return out.cast(self.dtype) if dtype is None and self.dtype in (dtypes.float16, dtypes.bfloat16) else out

    def sum(self: Tensor, axis=None, keepdim: bool = False, dtype: DTypeLike | None = None) -> Tensor:
        return self._acc_reduce(Ops.ADD, axis, keepdim, dtype)

    def prod(self: Tensor, axis=None, keepdim: bool = False, dtype: DTypeLike | None = None) -> Tensor:
        return self._acc_reduce(Ops.MUL, axis, keepdim, dtype)

    def max(self: Tensor, axis=None, keepdim: bool = False) -> Tensor:
        self._nonempty_reduce("max", axis)
        return self._max(axis, keepdim)

    def _max(self: Tensor, axis=None, keepdim: bool = False) -> Tensor:
        """max without the empty-axis error: over an axis of size 0 it is the identity, dtypes.min (any, softmax and
        logsumexp of an empty axis, as torch; the scheduler folds it to that constant, no kernel)."""
        return self._reduce(Ops.MAX, axis, keepdim)

    def _nonempty_reduce(self: Tensor, name: str, axis) -> None:
        """max/min/argmax/argmin have no identity: over an axis of size 0 they are an IndexError at the call (as
        torch), not dtypes.min. (A symbolic size is known only when the kernel runs: not checked.)"""
        if self.ndim == 0:
            return
        if axis is None and 0 in self.shape:  # torch: a RuntimeError for max/min, an IndexError for argmax/argmin
            raise (IndexError if name.startswith("arg") else ArgumentError)(
                f"{name}(): the tensor of shape {self.shape} has no elements to reduce; specify the "
                f"reduction dim (over the others the result is empty)"
            )
        for a in self._axes(axis):
            if isinstance(self.shape[a], int) and self.shape[a] == 0:
                raise IndexError(f"{name}(): Expected reduction dim {a} to have non-zero size (shape {self.shape})")

    def _inverse(self: Tensor) -> Tensor:
        """An order-reversing bijection: max of the inverse is the inverse of the min."""
        if dtypes.is_float(self.dtype):
            return -self
        return self.logical_not() if self.dtype == dtypes.bool else ~self

    def min(self: Tensor, axis=None, keepdim: bool = False) -> Tensor:
        self._nonempty_reduce("min", axis)
        return self._inverse()._max(axis, keepdim)._inverse()

    def any(self: Tensor, axis=None, keepdim: bool = False) -> Tensor:
        ret = self.bool()._max(axis, keepdim)  # over an empty axis: False (all: True), as torch
        return ret.cast(dtypes.uint8) if self.dtype == dtypes.uint8 else ret  # torch keeps uint8

    def all(self: Tensor, axis=None, keepdim: bool = False) -> Tensor:
        ret = self.logical_not().any(axis, keepdim).logical_not()
        return ret.cast(dtypes.uint8) if self.dtype == dtypes.uint8 else ret

    def mean(self: Tensor, axis=None, keepdim: bool = False, *, dtype: DTypeLike | None = None) -> Tensor:
        """The mean of a float tensor; an integer or bool one needs `dtype` (a float dtype it is cast to), as in
        torch (tinygrad returns a float)."""
        if dtype is not None:
            dt = to_dtype(dtype)
            if not dtypes.is_float(dt):
                raise ArgumentTypeError(
                    f"mean(): could not infer output dtype. Optional dtype must be either a floating point or "
                    f"complex dtype. Got: {dt}"
                )
            return self.cast(dt).mean(axis, keepdim)
        if not dtypes.is_float(self.dtype):
            raise ArgumentTypeError(
                f"mean(): could not infer output dtype. Input dtype must be either a floating point or complex "
                f"dtype. Got: {self.dtype}; pass dtype=dtypes.float32 (or cast first)"
            )
        x = self
        n = prod(self.shape[a] for a in self._axes(axis)) if self.ndim else 1
        out = x.sum(axis, keepdim, dtype=sum_acc_dtype(x.dtype))
        if isinstance(n, UOp):  # a symbolic count (a bound Variable): divided at run time
            return (out / n).cast(x.dtype)
        return (out / n if n else out * float("nan")).cast(x.dtype)

    def var(self: Tensor, axis=None, keepdim: bool = False, correction: int = 1) -> Tensor:
        self._float_only("std and var")
        x = self
        n = prod(self.shape[a] for a in self._axes(axis)) if self.ndim else 1
        sq = (x - x.mean(axis, keepdim=True)).square().sum(axis, keepdim)
        return sq / (n - correction).maximum(0) if isinstance(n, UOp) else sq / max(0, n - correction)

    def std(self: Tensor, axis=None, keepdim: bool = False, correction: int = 1) -> Tensor:
        return self.var(axis, keepdim, correction).sqrt()

    def _float_only(self: Tensor, what: str):
        """torch's error for var/std of an integer or bool tensor."""
        if not dtypes.is_float(self.dtype):
            raise ArgumentTypeError(
                f"{what} only support floating point and complex dtypes, got {self.dtype}; cast to a float dtype first"
            )

    def var_mean(self: Tensor, axis=None, keepdim: bool = False, correction: int = 1) -> tuple[Tensor, Tensor]:
        self._float_only("var_mean")
        return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

    def std_mean(self: Tensor, axis=None, keepdim: bool = False, correction: int = 1) -> tuple[Tensor, Tensor]:
        self._float_only("std_mean")
        return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

    def argmax(self: Tensor, axis=None, keepdim: bool = False) -> Tensor:
        """The index of the first maximum (int64, as torch)."""
        return self._argmax(axis, keepdim, "argmax")

    def _argmax(self: Tensor, axis, keepdim: bool, name: str) -> Tensor:
        self._nonempty_reduce(name, axis)
        if axis is None:
            return self.flatten()._argmax(0, False, name).reshape((1,) * self.ndim if keepdim else ())
        d = normalize_axis(axis, self.ndim)
        n = self.shape[d] if self.ndim else 1
        x = self if self.ndim else self.reshape(1)
        rev = type(self).arange(n, 0, -1, dtype=dtypes.int64, device=self.device)
        rev = rev.reshape(tuple(n if i == d else 1 for i in range(x.ndim)))
        hit = x == x.detach()._max(d, keepdim=True)  # (no gradient: x is not stored for one, see _reduce)
        if dtypes.is_float(x.dtype):  # a nan is the max of its row (max propagates it) but equals nothing
            hit = hit | x.isnan()
        idx = hit.where(rev, 0)._max(d, keepdim)
        return (n - idx).reshape(()) if self.ndim == 0 else n - idx

    def argmin(self: Tensor, axis=None, keepdim: bool = False) -> Tensor:
        return self._inverse()._argmax(axis, keepdim, "argmin")

    def logsumexp(self: Tensor, axis=None, keepdim: bool = False) -> Tensor:
        x = self._float()
        m = x.detach()._max(axis, keepdim=True)  # over an empty axis: -inf, made 0 below (the result is log(0) = -inf)
        m = m.isinf().where(0, m)
        ret = (x - m).exp().sum(axis, keepdim=True).log() + m
        return ret if keepdim else ret.reshape(x._max(axis).shape)

    # ***** scans: in blocks of shifted copies (`_blocked_scan`); a symbolic length through a triangular mask, each
    # output i reducing the inputs j <= i (one reduce) *****
    def _scan_windows(self: Tensor, d: int, identity) -> tuple[Tensor, Tensor]:
        """(x moved to the last axis and repeated as rows i: x[..., i, j] = x[j] where j <= i, else identity; mask)"""
        x = self.transpose(d, -1)
        n = x.shape[-1]
        rows = type(self).arange(n, device=self.device).reshape(n, 1)
        mask = type(self).arange(n, device=self.device).reshape(1, n) <= rows
        return mask.where(x.unsqueeze(-2).expand(*x.shape[:-1], n, n), identity), mask

    def _scan(self: Tensor, axis: int, op: Ops, dtype=None) -> Tensor:
        d = normalize_axis(axis, self.ndim)  # a 0-d tensor takes axis 0 or -1 (as torch), not any axis
        if self.ndim == 0:
            return self.cast(dtype or self.dtype)
        x = self.cast(dtype or self.dtype)
        identity = {Ops.ADD: 0, Ops.MUL: 1, Ops.MAX: dtypes.min(x.dtype)}[op]
        if isinstance(x.shape[d], int):
            return x.transpose(d, -1)._blocked_scan(op, identity).transpose(d, -1)
        windows, _ = x._scan_windows(d, identity)  # its length is known when the kernel runs: no blocks
        return windows._reduce(op, -1).transpose(d, -1)

    def _blocked_scan(self: Tensor, op: Ops, identity) -> Tensor:
        """The scan along the last axis in blocks of SCAN_BLOCK (`_scan_terms`), its terms combined from the
        smallest (the element's own block) to the largest (the blocks before it at the top level): each op rounds at
        the magnitude of its partial result, one op at the magnitude of the total."""
        terms = self._scan_terms(op, identity)
        out = terms[0]
        for t in terms[1:]:
            out = _combine(op, out, t)
        return out

    def _scan_terms(self: Tensor, op: Ops, identity) -> list[Tensor]:
        """Terms, each of self's shape, whose op over all is the inclusive scan along the last axis: the scan within
        each block of SCAN_BLOCK elements (`_shifted_scan`: elementwise, no reduce loop), then the terms of the
        exclusive scan of the blocks' totals (the one reduce per level), each broadcast over its block's elements:
        log_SCAN_BLOCK(n) levels, O(n * SCAN_BLOCK) loads."""
        n = self.shape[-1]
        if n <= SCAN_BLOCK:
            return [self._shifted_scan(op, identity)]
        nb = -(-n // SCAN_BLOCK)
        keep = tuple(None for _ in self.shape[:-1])
        blocks = self.pad(((0, 0),) * (self.ndim - 1) + ((0, nb * SCAN_BLOCK - n),), value=identity)
        blocks = blocks.reshape(*self.shape[:-1], nb, SCAN_BLOCK)
        totals = blocks._reduce(op, -1)  # (..., nb)
        before = totals.pad(((0, 0),) * (totals.ndim - 1) + ((1, -1),), value=identity)  # exclusive: one block on
        terms = [blocks._shifted_scan(op, identity)]
        terms += [t.unsqueeze(-1).expand(*blocks.shape) for t in before._scan_terms(op, identity)]
        return [t.reshape(*self.shape[:-1], nb * SCAN_BLOCK).shrink(keep + ((0, n),)) for t in terms]

    def _shifted_scan(self: Tensor, op: Ops, identity) -> Tensor:
        """The inclusive scan along a short last axis of n as op over its n copies shifted right by 0..n-1 (the
        identity shifted in), combined as a balanced tree: each output element its n gated loads (a vector load per
        copy where the axis is the vector's), no reduce: no horizontal sum per element, no chain of n dependent adds."""
        n = self.shape[-1]
        keep = tuple(None for _ in self.shape[:-1])
        copies = [self] + [
            self.pad(((0, 0),) * (self.ndim - 1) + ((s, 0),), value=identity).shrink(keep + ((0, n),))
            for s in range(1, n)
        ]
        while len(copies) > 1:
            pairs = [_combine(op, a, b) for a, b in zip(copies[::2], copies[1::2])]
            copies = pairs + copies[len(copies) - len(copies) % 2 :]
        return copies[0]

    def _acc_scan(self: Tensor, axis: int, op: Ops) -> Tensor:
        """cumsum/cumprod: ints and bools accumulate (and return) int64, halves accumulate in float32 and return half,
        as torch (in half, each of a blocked scan's levels would round its partial sums to 11 bits)."""
        out = self._scan(axis, op, sum_acc_dtype(self.dtype))
        return out.cast(self.dtype) if self.dtype in (dtypes.float16, dtypes.bfloat16) else out

    def cumsum(self: Tensor, axis: int = 0) -> Tensor:
        return self._acc_scan(axis, Ops.ADD)

    def cumprod(self: Tensor, axis: int = 0) -> Tensor:
        return self._acc_scan(axis, Ops.MUL)

    def cummax(self: Tensor, axis: int = 0) -> tuple[Tensor, Tensor]:
        """(running max, index of the last element equal to it), as torch."""
        values = self._scan(axis, Ops.MAX)
        if self.ndim == 0:
            return values, type(self)(0, dtype=dtypes.int64, device=self.device)
        d = normalize_axis(axis, self.ndim)
        windows, mask = self._scan_windows(d, dtypes.min(self.dtype))
        n = windows.shape[-1]
        hit = mask & (windows == values.transpose(d, -1).unsqueeze(-1))
        # _max: over an empty scanned dim the windows are (..., 0, 0) and the result is empty, not an error
        idx = hit.where(type(self).arange(n, dtype=dtypes.int64, device=self.device), -1)._max(-1)
        return values, idx.transpose(d, -1)

    def cummin(self: Tensor, axis: int = 0) -> tuple[Tensor, Tensor]:
        values, idx = self._inverse().cummax(axis)
        return values._inverse(), idx

    def logcumsumexp(self: Tensor, axis: int = 0) -> Tensor:
        d = normalize_axis(axis, self.ndim)
        if self.ndim == 0:
            return self._float()
        x = self._float()
        cm = x.cummax(d)[0].transpose(d, -1).unsqueeze(-1)
        cm = cm.isinf().where(0, cm).detach()
        windows, mask = x._scan_windows(d, 0.0)
        ret = mask.where((windows - cm).exp(), 0).sum(-1).log() + cm.squeeze(-1)
        return ret.transpose(d, -1)

    # ***** softmax *****
    def softmax(self: Tensor, axis: int = -1, dtype: DTypeLike | None = None) -> Tensor:
        x = self.cast(dtype) if dtype is not None else self._float()
        e = (x - x.detach()._max(axis, keepdim=True)).exp()
        return e / e.sum(axis, keepdim=True)

    def log_softmax(self: Tensor, axis: int = -1, dtype: DTypeLike | None = None) -> Tensor:
        x = self.cast(dtype) if dtype is not None else self._float()
        m = x - x.detach()._max(axis, keepdim=True)
        return m - m.exp().sum(axis, keepdim=True).log()

    def softmin(self: Tensor, axis: int = -1, dtype: DTypeLike | None = None) -> Tensor:
        return (-self).softmax(axis, dtype)

    # ***** sorting: a bitonic network of compare-exchange steps (moves by `where`), one kernel per step *****
    def sort(self: Tensor, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
        """(sorted values, int64 indices into self); equal values keep their order."""
        d = normalize_axis(dim, self.ndim) if self.ndim else 0
        if self.ndim == 0 or self.shape[d] <= 1:
            return self, self.zeros_like(dtype=dtypes.int64)
        n = self.shape[d]
        s = (n - 1).bit_length()
        # the padding sorts last: nan is above +inf (as torch), so a float pads with nan when ascending
        fill = math.nan if dtypes.is_float(self.dtype) else dtypes.max(self.dtype)
        fill = dtypes.min(self.dtype) if descending else fill
        x = self.pad(tuple((0, 2**s - n) if i == d else None for i in range(self.ndim)), value=fill)
        x = x.unflatten(d, (2,) * s)  # bit k of the position is dim d + s - 1 - k

        def bit(k: int) -> int:
            return d + s - 1 - k

        for stage in range(1, s + 1):
            flips = [bit(k) for k in range(stage)]
            if stage != s:  # reverse the upper half of each 2^(stage+1) block: its merge then sorts it backwards
                lo, hi = x.split(1, bit(stage))
                x = lo.cat(hi.flip(flips), dim=bit(stage))
            for sub in range(stage - 1, -1, -1):  # half-cleaners: compare-exchange at distance 2^sub
                a, b = x.split(1, bit(sub))
                small, big = _compare_exchange(a, b)
                x = (big.cat(small, dim=bit(sub)) if descending else small.cat(big, dim=bit(sub))).contiguous()
            if stage != s:
                lo, hi = x.split(1, bit(stage))
                x = lo.cat(hi.flip(flips), dim=bit(stage))
        x = x.flatten(d, d + s - 1)._slice_dim(d, 0, n)
        return x, self._sort_indices(x, d)

    def _sort_indices(self: Tensor, x: Tensor, d: int) -> Tensor:
        """Where each sorted value came from: among equal values, the k-th in x is the k-th in self."""
        n = self.shape[d]
        tri = type(self).ones(n, n, dtype=dtypes.bool, device=self.device).tril()
        tri = tri.reshape((n, n) + (1,) * (self.ndim - d - 1))

        def rank(t: Tensor) -> Tensor:  # how many equal values come before (and at) each position
            return (tri & _sort_eq(t.unsqueeze(d), t.unsqueeze(d + 1))).sum(d + 1)

        same = _sort_eq(self.unsqueeze(d + 1), x.unsqueeze(d)) & (rank(self).unsqueeze(d + 1) == rank(x).unsqueeze(d))
        pos = type(self).arange(n, dtype=dtypes.int64, device=self.device)
        pos = pos.reshape((n,) + (1,) * (self.ndim - d))
        return same.where(pos, 0).sum(d)

    def argsort(self: Tensor, dim: int = -1, descending: bool = False) -> Tensor:
        return self.sort(dim, descending)[1]

    def topk(self: Tensor, k: int, dim: int = -1, largest: bool = True, sorted_: bool = True) -> tuple[Tensor, Tensor]:
        d = normalize_axis(dim, self.ndim) if self.ndim else 0
        if not 0 <= k <= (self.shape[d] if self.ndim else 1):
            raise ArgumentError(f"topk: k={k} is out of range for dimension {d} of shape {self.shape}")
        values, idx = self.sort(d, descending=largest)
        return (values, idx) if self.ndim == 0 else (values._slice_dim(d, 0, k), idx._slice_dim(d, 0, k))
