"""The rangeified graph (schedule/bufferize.py): materialized nodes as BUFFERIZE, and the foldings over it, each shown
on a graph before and after, plus the programs where a folding changes the kernels the scheduler makes."""

import numpy as np

from zeptograd import Tensor
from zeptograd.dtype import dtypes
from zeptograd.schedule.bufferize import Stored, bufferize_folds, stored_shape
from zeptograd.uop.ops import AxisType, Ops, UOp
from zeptograd.uop.upat import graph_rewrite

rng = np.random.default_rng(0)


def rngs(*sizes: int, start: int = 0) -> tuple[UOp, ...]:
    return tuple(UOp.range(s, start + i, AxisType.LOOP) for i, s in enumerate(sizes))


def node(name: float) -> UOp:
    """A stand-in for the tensor node a BUFFERIZE materializes (only its identity matters to the foldings)."""
    return UOp.const(dtypes.float, name)


def buf(value: UOp, ranges: tuple[UOp, ...], keep: bool, name: float) -> UOp:
    return UOp(Ops.BUFFERIZE, dtypes.float, (value, *ranges), Stored(node(name), keep))


def read(b: UOp, *idx: UOp) -> UOp:
    return UOp(Ops.INDEX, b.dtype, (b, *idx))


def input_read(i: UOp) -> UOp:
    """A read of an input buffer at flat index i."""
    return UOp(Ops.INDEX, dtypes.float, (UOp(Ops.DEFINE_GLOBAL, dtypes.float.ptr(64), (), 9), i))


class Policy:
    """The policy the foldings ask whether a BUFFERIZE is cheaper inlined: here, a fixed answer."""

    def __init__(self, inline: bool = False):
        self.inline = inline

    def cheaper_inlined(self, b: UOp) -> bool:
        return self.inline and not b.arg.keep


def fold(sink_src: UOp, inline: bool = False) -> UOp:
    return graph_rewrite(UOp(Ops.SINK, dtypes.void, (sink_src,)), bufferize_folds, ctx=Policy(inline)).src[0]


def test_bufferize_of_const_folds_to_the_const():
    r, s = rngs(4), rngs(4, start=1)
    three = UOp.const(dtypes.float, 3.0)
    inner = buf(three, r, keep=False, name=1)
    outer = buf(read(inner, s[0]) + 1, s, keep=True, name=2)
    # before: BUFFERIZE(INDEX(BUFFERIZE(3.0, r), s) + 1, s); after: BUFFERIZE(3.0 + 1, s)
    assert fold(outer) is buf(three + 1, s, keep=True, name=2)


def test_kept_bufferize_of_const_stays():
    r = rngs(4)
    out = buf(UOp.const(dtypes.float, 3.0), r, keep=True, name=1)
    assert fold(out) is out


def test_index_of_const_is_the_const():
    s = rngs(4)
    c = UOp.const(dtypes.float, 2.0)
    assert fold(buf(UOp(Ops.INDEX, dtypes.float, (c, s[0])) * 5, s, keep=True, name=1)) is buf(c * 5, s, True, 1)


def test_read_at_own_ranges_is_the_value():
    r = rngs(4, 8)
    x = input_read(r[0] * 8 + r[1]) * 3.0
    inner = buf(x, r, keep=False, name=1)
    # INDEX(BUFFERIZE(x, r0, r1), r0, r1) -> x
    assert fold(buf(read(inner, *r) + 1, r, keep=True, name=2)) is buf(x + 1, r, True, 2)


def test_read_at_no_loop_is_not_inlined():
    """A 0-d buffer read at () says nothing about where its reader runs: inlining would recompute it per element."""
    inner = buf(input_read(UOp.const(dtypes.index, 0)) * 3.0, (), keep=False, name=1)
    s = rngs(4)
    outer = buf(read(inner) + input_read(s[0]), s, keep=True, name=2)
    assert fold(outer) is outer


def test_copy_of_a_buffer_reads_the_first():
    r, s, t = rngs(4, 8), rngs(4, 8, start=2), rngs(8, 4, start=4)
    first = buf(input_read(r[0] * 8 + r[1]) * 3.0, r, keep=False, name=1)
    copy = buf(read(first, *s), s, keep=False, name=2)
    out = buf(read(copy, t[1], t[0]), t, keep=True, name=3)
    # INDEX(BUFFERIZE(INDEX(first, *s), *s), t1, t0) -> INDEX(first, t1, t0)
    assert fold(out) is buf(read(first, t[1], t[0]), t, True, 3)


def test_copy_at_another_index_is_not_folded():
    r, s, t = rngs(4, 4), rngs(4, 4, start=2), rngs(4, 4, start=4)
    first = buf(input_read(r[0] * 4 + r[1]) * 3.0, r, keep=False, name=1)
    transposed = buf(read(first, s[1], s[0]), s, keep=False, name=2)  # a transposed copy: not the same buffer
    out = buf(read(transposed, *t), t, keep=True, name=3)
    assert fold(out) is out


def test_dead_axis_dropped_and_read_at_zero():
    r, s = rngs(4, 8), rngs(4, 8, start=2)
    zero = UOp.const(dtypes.index, 0)
    x = input_read(r[0]) * 3.0  # varies along r0 only
    out = buf(read(buf(x, r, keep=False, name=1), s[1] % 4, s[0]) * 2, s, keep=True, name=2)
    # BUFFERIZE(x, r0, r1) -> BUFFERIZE(x, r0, 0); INDEX(.., s1 % 4, s0) -> INDEX(.., s1 % 4, 0)
    shrunk = buf(x, (r[0], zero), keep=False, name=1)
    assert fold(out) is buf(read(shrunk, s[1] % 4, zero) * 2, s, True, 2)
    assert stored_shape(shrunk) == (4, 1)


def test_kept_bufferize_keeps_its_axes():
    r = rngs(4, 8)
    out = buf(input_read(r[0]) * 3.0, r, keep=True, name=1)
    assert fold(out) is out


def test_dead_axis_shrinks_an_intermediate_buffer():
    """exp of a broadcast column read at 9 shifted places is stored once (above MAX_REQUESTS reads): the folding
    stores it per row (64 values), not per element of the broadcast (64*64)."""
    a_np = rng.standard_normal((64, 1)).astype(np.float32)
    y = Tensor(a_np).expand(64, 64).exp()
    padded = y.pad(((1, 1), (1, 1)))
    t = sum(padded[i : i + 64, j : j + 64] for i in range(3) for j in range(3))
    items = t.schedule()
    assert len(items) == 2
    assert items[0].bufs[0].size == 64  # the intermediate: one value per row
    want = np.pad(np.exp(np.broadcast_to(a_np, (64, 64))), 1)
    want = sum(want[i : i + 64, j : j + 64] for i in range(3) for j in range(3))
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-5)


def test_read_of_a_bufferize_cheaper_inlined_is_its_value_at_the_read():
    r, s = rngs(6, 6), rngs(4, 4, start=2)
    x = input_read(r[0] * 6 + r[1]) * 2.0
    stored = buf(x, r, keep=False, name=1)
    valid = s[0] < 3
    out = buf(UOp(Ops.INDEX, dtypes.float, (stored, s[0] + 1, s[1] + 2, valid)), s, keep=True, name=2)
    # INDEX(BUFFERIZE(x, r0, r1), s0+1, s1+2, valid) -> valid ? x[r0 := s0+1, r1 := s1+2] : 0, x's reads gated
    read = x.src[0]
    gated = UOp(Ops.INDEX, dtypes.float, (read.src[0], read.src[1].substitute({r[0]: s[0] + 1, r[1]: s[1] + 2}), valid))
    inlined = gated * 2.0
    assert fold(out, inline=True) is buf(valid.where(inlined, UOp.const(dtypes.float, 0.0)), s, True, 2)
    assert fold(out, inline=False) is out


def test_stencil_of_an_elementwise_prologue_is_one_kernel():
    """A 3x3 box sum of a*2+1 reads the prologue at 9 index sets: the walk stores it (MAX_REQUESTS), and the cost
    model inlines it again (two ops per read cost less than a store, 9 loads and a kernel): one kernel."""
    a_np = rng.standard_normal((64, 64)).astype(np.float32)
    p = (Tensor(a_np) * 2 + 1).pad(((1, 1), (1, 1)))
    t = sum(p[i : i + 64, j : j + 64] for i in range(3) for j in range(3))
    (item,) = t.schedule()
    loads = [u for u in item.ast.toposort() if u.op is Ops.LOAD]
    gated = [ld for ld in loads if len(ld.src[0].src) == 3]
    assert len(loads) == 9 and len(gated) == 8  # every read but the centre's can leave the buffer: gated by the pad
    want = np.pad(a_np * 2 + 1, 1)
    np.testing.assert_allclose(
        t.numpy(), sum(want[i : i + 64, j : j + 64] for i in range(3) for j in range(3)), rtol=1e-5, atol=1e-5
    )
