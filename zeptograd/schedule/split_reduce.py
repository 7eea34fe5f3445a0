"""Split reduce: a reduce of a large input to a small output becomes two kernels.

    sum(x[16777216]) -> sum(contiguous(sum(x.reshape(256, 65536), axis=1)))

The first kernel has 256 independent outputs, so it runs on every core with vector accumulators; the second
reduces 256 numbers. Applied once per reduce, before rangeify. SPLIT_REDUCEOP=0 turns it off.
"""

from __future__ import annotations

from zeptograd.helpers import SPLIT_REDUCEOP, prod
from zeptograd.uop.ops import Ops, UOp
from zeptograd.viz.hook import named_pass  # VIZ=1: this pass is a named step of the trace

SPLIT_THRESHOLD = 32768  # input elements per output element before a reduce is split


def split_once(x: UOp) -> UOp | None:
    src, (op, axes) = x.src[0], x.arg
    if prod(x.tensor_shape) == 0 or prod(src.tensor_shape) // prod(x.tensor_shape) < SPLIT_THRESHOLD:
        return None
    for ax in axes:
        d = next((d for d in range(256, 7, -1) if src.tensor_shape[ax] % d == 0), None)
        if d is None or src.tensor_shape[ax] // d < 256:
            continue
        shape = src.tensor_shape[:ax] + (d, src.tensor_shape[ax] // d) + src.tensor_shape[ax + 1 :]
        inner_axes = tuple(a + (a >= ax) for a in axes if a != ax) + (ax + 1,)
        split = UOp(Ops.RESHAPE, src.dtype, (src,), shape)
        first = UOp(Ops.REDUCE_AXIS, x.dtype, (split,), (op, tuple(sorted(inner_axes))))
        second = UOp(Ops.REDUCE_AXIS, x.dtype, (UOp(Ops.CONTIGUOUS, x.dtype, (first,)),), (op, (ax,)))
        return UOp(Ops.RESHAPE, x.dtype, (second,), x.tensor_shape)
    return None


@named_pass("split_reduces", "a big reduce to a small output -> two reduces, the first parallel")
def split_reduces(sink: UOp) -> UOp:
    if not SPLIT_REDUCEOP:
        return sink
    mapping = {u: s for u in sink.toposort() if u.op is Ops.REDUCE_AXIS and (s := split_once(u)) is not None}
    return sink.substitute(mapping) if mapping else sink
