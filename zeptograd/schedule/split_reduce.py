"""Split reduce: a reduce of a large input to a small output becomes two kernels.

    sum(x[16777216]) -> sum(contiguous(sum(x.reshape(256, 65536), axis=1)))

The first kernel has 256 independent outputs, so it runs on every core with vector accumulators; the second
reduces 256 numbers. Applied once per reduce, before rangeify. SPLIT_REDUCEOP=0 turns it off.

A size no d in 256..8 divides (2**24 + 3, a prime times a prime) is split all the same: its first M = (n//256)*256
elements as 256 rows, the n - M left over reduced beside the 256 partials in the second kernel:

    sum(x[n]) -> sum(contiguous(sum(x[:M].reshape(256, M/256), axis=1))) + sum(x[M:])

(unsplit, such a reduce ran as one loop on one core: 2**24 + 3 floats took twice the time of 2**24). A reduce over
several axes splits its first one that gives rows of 256+ elements with the others: (4096, 4096).sum() is 256 rows
of (16, 4096); a full reduce none of whose axes splits so, (1009, 1013).sum(), splits its flat tensor.
"""

from __future__ import annotations

from zeptograd.helpers import SPLIT_REDUCEOP, prod
from zeptograd.uop.ops import Ops, UOp
from zeptograd.viz.hook import named_pass  # VIZ=1: this pass is a named step of the trace

SPLIT_THRESHOLD = 32768  # input elements per output element before a reduce is split
SPLIT_ROWS = 256  # the first kernel's outputs where a divisor does not give them


def _split(src: UOp, ax: int, d: int) -> UOp:
    """src with axis ax of size d*m reshaped to (d, m)"""
    s = src.tensor_shape
    return UOp(Ops.RESHAPE, src.dtype, (src,), s[:ax] + (d, s[ax] // d) + s[ax + 1 :])


def _shrink(src: UOp, ax: int, start: int, end: int) -> UOp:
    arg = tuple((start, end) if i == ax else (0, s) for i, s in enumerate(src.tensor_shape))
    return UOp(Ops.SHRINK, src.dtype, (src,), arg)


def split_once(x: UOp) -> UOp | None:
    src, (op, axes) = x.src[0], x.arg
    if (out := prod(x.tensor_shape)) == 0 or prod(src.tensor_shape) // out < SPLIT_THRESHOLD:
        return None
    for ax in axes:
        n = src.tensor_shape[ax]
        if not isinstance(n, int):
            continue
        d = next((d for d in range(SPLIT_ROWS, 7, -1) if n % d == 0), None)
        # no divisor: SPLIT_ROWS rows of the largest part they divide, the rest reduced beside their partials (at
        # most 1/64 of the axis: that part runs in the second kernel, on one core)
        d, main = (d, n) if d is not None else (SPLIT_ROWS, n - n % SPLIT_ROWS)
        if main != n and (n - main) * 64 > n:
            continue
        # each row: main/d of this axis times the other reduced axes (a full sum of (4096, 4096): 256 rows of
        # 16 x 4096, where it was one loop on one core); rows made of the other axes only where the output has
        # fewer elements than the split's rows: batchnorm's statistics over (32, 64, 32, 32) have 64 outputs to
        # thread already, and split they cost a second kernel each (ResNet block step: 75 -> 98 kernels)
        other = prod(src.tensor_shape[a] for a in axes if a != ax)
        if main // d < 256 and (main // d * other < 256 or isinstance(out, int) and out >= d):
            continue
        inner_axes = tuple(a + (a >= ax) for a in axes if a != ax) + (ax + 1,)
        part = src if main == n else _shrink(src, ax, 0, main)
        first = UOp(Ops.REDUCE_AXIS, x.dtype, (_split(part, ax, d),), (op, tuple(sorted(inner_axes))))
        second = UOp(Ops.REDUCE_AXIS, x.dtype, (UOp(Ops.CONTIGUOUS, x.dtype, (first,)),), (op, (ax,)))
        out = UOp(Ops.RESHAPE, x.dtype, (second,), x.tensor_shape)
        if main == n:
            return out
        rest = UOp(Ops.REDUCE_AXIS, x.dtype, (_shrink(src, ax, main, n),), x.arg)
        return UOp(op, x.dtype, (out, rest))  # the two partial reduces combine by the reduce's own op
    shape = src.tensor_shape
    if len(shape) > 1 and len(axes) == len(shape) and all(isinstance(s, int) for s in shape):
        # a full reduce no axis splits (both sizes prime: (1009, 1013)): the same reduce of the flat tensor
        flat = UOp(Ops.RESHAPE, src.dtype, (src,), (prod(shape),))
        split = split_once(UOp(Ops.REDUCE_AXIS, x.dtype, (flat,), (op, (0,))))
        return None if split is None else UOp(Ops.RESHAPE, x.dtype, (split,), x.tensor_shape)
    return None


@named_pass("split_reduces", "a big reduce to a small output -> two reduces, the first parallel")
def split_reduces(sink: UOp) -> UOp:
    if not SPLIT_REDUCEOP:
        return sink
    mapping = {u: s for u in sink.toposort() if u.op is Ops.REDUCE_AXIS and (s := split_once(u)) is not None}
    return sink.substitute(mapping) if mapping else sink
