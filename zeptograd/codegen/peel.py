"""Peeling: an output loop whose gated window reads are valid in its interior runs as border and interior parts.

A padded input read through a sliding window (pooling or conv with padding, the PAD inlined by rangeify) is a load
gated by the pad's validity, `0 <= h + kh - 1 < H`, inside the reduce over the window. For most output rows the gate
holds for every window position; only the rows within the pad's reach of an edge need it. After the optimizer (so
every part keeps its actions: vector lanes, register tiles, cores), an output RANGE of a loop nest at the top of the
kernel is split where the gates that use it hold for every value of their other ranges:

    RANGE(n), gates true for lo <= r < hi:
    SINK(END(st, ..., r), ...) -> SINK(END(st[r := R(lo)], ...), END(st[r := lo + R(hi-lo)], ...),
                                       END(st[r := hi + R(n-hi)], ...), ...)

and symbolic folds the interior's gates to True (an INDEX gated by True loses its gate), so its loads are plain
(vector) loads with no branch or mask, and what the gates fed folds too (avg_pool's count of valid positions). The
parts run one after another (linearize: a kernel's nests in SINK order), each with fresh copies of the loops the nest
binds (as a tail, codegen/opt/tail.py); a border of one iteration is a constant. The interior part is peeled again on
its next range (at most MAX_PEELS ranges per nest): a 2-D window has 5 parts.

When it pays (measured on (8,64,56,56)): where every load that moves with a reduce is window-gated (pooling: the gate
and the mask are most of the work per element; avg_pool2d up to 1.4x, max_pool2d ~1.1x, noisy). With AVX-512, not where
a gated load meets an ungated one (a conv's weight): there the second load and the multiply-adds hide the gate, which
LLVM turns into one masked load (AVX-512 mask registers), and the border copies only double the compile time. The
interior must also hold at least half of the range, so the copies pay for themselves, and a nest expanded to more than
MAX_LANES lanes (a register tile of 8 rows x 2 vectors: 256) is left whole: its three copies doubled a pool's compile
time (0.45 -> 1.2 s) for a gain lost in the noise. On a target without mask registers (vectors narrower than 64 bytes:
AVX2), a gated vector load beside an ungated one (a conv vectorized along its output columns, the weight broadcast) is
peeled at any width: there each masked load costs a mask built from compares, packs and shifts in every iteration and a
vmaskmov (a third of the inner loop's instructions), and a register tile's masks spill (one core of an AVX2 host,
(8,64,56,56)x(64,64,3,3) pad 1: 8 channels x 1 vector 69 -> 44 ms, the window tile of codegen/opt/heuristic.py 44 -> 32
ms). Only along the gates that differ across the lanes (the output columns' loop: 3 nests, not 5): the rows' gates too
were as fast within the noise and took 2.4 s to compile against 1.6 (0.6 s unpeeled). A gated load that is a broadcast
across the vector lanes (a stride-2 conv vectorized along its output channels: one input value per row of the tile, each
gated by a branch) is peeled at any width, along the gates that differ between the tile's copies (the output columns):
the kernel of (8,64,56,56)x(128,64,3,3) stride 2 ~12% faster (process time, one core), compiled in ~2x the time. CPU
only: on a GPU a gate is a predicate per thread, and extra loop nests would run on one thread.

A gate `a < b` holds for every value of the other ranges when `coef*r + rest < 0` at rest's largest value, with
`a - b = coef*r + rest` (r linear; value ranges give rest's bounds); `!(a < b)` at rest's smallest.
"""

from __future__ import annotations

from zeptograd.codegen.expander import vector_ranges
from zeptograd.codegen.opt.tail import bound_ranges
from zeptograd.dtype import dtypes
from zeptograd.helpers import prod
from zeptograd.uop.ops import AxisType, Ops, UOp
from zeptograd.uop.symbolic import and_terms, build_sum, split_sum, symbolic
from zeptograd.uop.upat import PatternMatcher, UPat, graph_rewrite, graph_substitute
from zeptograd.viz.hook import named_pass  # VIZ=1: this pass is a named step of the trace

MAX_PEELS = 2  # ranges peeled per loop nest (each one adds two border copies of the nest)
MASK_REGISTER_BYTES = 64  # AVX-512's vectors: a gate is a mask register, narrower targets build it from compares
MAX_LANES = 32  # a nest expanded to more lanes (a register tile) is not copied: compile time, for little gain
_COPIES = (AxisType.UPCAST, AxisType.UNROLL)  # the ranges the expander makes lanes or copies of the body


def _linear(x: UOp, r: UOp) -> tuple[int, UOp] | None:
    """(coef, rest) with x == coef*r + rest and rest free of r; None when r is inside another term."""
    terms, const = split_sum(x)
    coef = sum(c for t, c in terms if t is r)
    rest = [(t, c) for t, c in terms if t is not r]
    if any(r in t.toposort() for t, _ in rest):
        return None
    return coef, build_sum(rest, const, x)


def true_interval(term: UOp, r: UOp, n: int) -> tuple[int, int] | None:
    """[lo, hi): the values of r for which term holds whatever the other ranges are; None if it can't be told."""
    neg = (
        term.op is Ops.CMPNE and term.src[0].op is Ops.CMPLT and term.src[1].op is Ops.CONST and term.src[1].arg is True
    )
    cmp = term.src[0] if neg else term
    if cmp.op is not Ops.CMPLT or not dtypes.is_int(cmp.src[0].dtype) or cmp.src[0].dtype.count != 1:
        return None
    a, b = (_linear(s, r) for s in cmp.src)
    if a is None or b is None or a[0] == b[0]:
        return None
    coef, rest = a[0] - b[0], graph_rewrite(a[1] - b[1], symbolic)  # a < b  <=>  coef*r + rest < 0
    if not isinstance(rest.vmin, int) or not isinstance(rest.vmax, int):
        return None
    if not neg:  # coef*r < -max(rest)
        return (0, -(rest.vmax // coef)) if coef > 0 else (rest.vmax // -coef + 1, n)
    return (-(rest.vmin // coef), n) if coef > 0 else (0, rest.vmin // -coef + 1)  # coef*r >= -min(rest)


def window_gates(
    nest: UOp,
    r: UOp,
    vectors: frozenset[UOp] = frozenset(),
    broadcast_only: bool = False,
    built_masks: bool = False,
) -> list[UOp]:
    """The conjuncts that move with r and with a reduce's range, of the gates on the loads inside that reduce, when
    every load that moves with the reduce is gated (pooling: the gate is most of the work per element), or when the
    gated ones are broadcasts across the vector lanes (their index uses none of `vectors`: a conv vectorized along its
    output channels reads one input value per row of its register tile, and each gate is a branch per row). When a
    gated vector load meets an ungated one (a conv's weight, vectorized along the output's columns), only where the
    target builds each mask from compares (`built_masks`: no mask registers); with AVX-512's mask registers the second
    load and the multiply-add hide the gate, which LLVM turns into one masked load."""
    out: list[UOp] = []
    for red in nest.toposort():
        if red.op is not Ops.REDUCE:
            continue
        moving = [
            u for u in red.src[0].toposort() if u.op is Ops.LOAD and any(x in u.src[0].toposort() for x in red.src[1:])
        ]
        terms = [
            [t for t in and_terms(u.src[0].src[2]) if r in t.toposort() and any(x in t.toposort() for x in red.src[1:])]
            if len(u.src[0].src) > 2
            else []
            for u in moving
        ]
        if moving and all(terms) and not broadcast_only:
            out.extend(t for ts in terms for t in ts)
            continue
        gated = [u for u, ts in zip(moving, terms) if ts]
        ungated = len(gated) < len(moving)  # (a conv's weight)
        if gated and ungated and built_masks and vectors and all(vectors & set(u.src[0].toposort()) for u in gated):
            # masked vector loads: the gates that differ across the lanes (the output columns' loop), the ones built
            # from compares in every iteration; a row's gate is one compare per row, not worth a compile-time copy
            out.extend(t for ts in terms for t in ts if vectors & set(t.toposort()))
            continue
        if gated and vectors and all(not vectors & set(u.src[0].toposort()) for u in gated):
            # broadcasts: only the gates that differ between the tile's copies (a branch each); one that moves with
            # loops alone (a conv's row gate, 2*oh + kh - 1 >= 0) is one predictable branch for all of them
            out.extend(
                t for ts in terms for t in ts if any(x.op is Ops.RANGE and x.arg[1] in _COPIES for x in t.toposort())
            )
    return out


def interior(
    nest: UOp, r: UOp, vectors: frozenset[UOp] = frozenset(), broadcast_only: bool = False, built_masks: bool = False
) -> tuple[int, int] | None:
    """Where every window gate using r holds, if that is a proper part of r holding at least half of it."""
    n = r.src[0].arg
    gates = window_gates(nest, r, vectors, broadcast_only, built_masks)
    lo, hi = 0, n
    for t in gates:
        if (iv := true_interval(t, r, n)) is not None:
            lo, hi = max(lo, iv[0]), min(hi, iv[1])
    if not gates or (lo, hi) == (0, n) or 2 * (hi - lo) < n:
        return None
    return lo, hi


def lanes(nest: UOp) -> int:
    """The copies of the nest's body the expander makes: the product of its vector lanes and unrolled copies."""
    return prod(
        u.src[0].arg for u in nest.toposort() if u.op is Ops.RANGE and u.arg[1] in (AxisType.UPCAST, AxisType.UNROLL)
    )


def _part(nest: UOp, r: UOp, start: int, size: int, next_id: int) -> tuple[UOp, int]:
    """The nest over r in start..start+size-1, with fresh copies of the loops it binds."""
    from zeptograd.codegen.opt import pm_fix_range_lists

    fresh: dict[UOp, UOp] = {}
    for s in bound_ranges(nest):  # fresh ids in the same order: the part's loops nest as the nest's did
        fresh[s] = UOp.range(size if s is r else s.src[0], next_id, s.arg[1])
        next_id += 1
    if size == 1:
        fresh[r] = UOp.const(r.dtype, start)
    elif start:
        fresh[r] = fresh[r] + UOp.const(r.dtype, start)
    part = graph_rewrite(graph_substitute(nest, fresh), pm_fix_range_lists)
    return (part.src[0] if len(part.src) == 1 else part), next_id


def _drop_true_gate(idx: UOp) -> UOp | None:
    """# INDEX(buf, i, True) -> INDEX(buf, i)"""
    return idx.replace(src=idx.src[:2]) if idx.src[2].op is Ops.CONST and idx.src[2].arg is True else None


pm_peeled = symbolic + PatternMatcher([(UPat(Ops.INDEX, src=(UPat(), UPat(), UPat()), name="idx"), _drop_true_gate)])


@named_pass("peel_borders", "window reads gated by a pad: border and interior parts, the interior ungated")
def peel_borders(sink: UOp, max_vec_bytes: int = 64) -> UOp:
    """Each loop nest whose window gates hold in the interior of an output range: border and interior parts."""
    if sink.op is not Ops.SINK or not any(u.op is Ops.LOAD and len(u.src[0].src) > 2 for u in sink.toposort()):
        return sink
    vectors = vector_ranges(sink, max_vec_bytes)
    built_masks = max_vec_bytes < MASK_REGISTER_BYTES
    next_id = max((u.arg[0] for u in sink.toposort() if u.op is Ops.RANGE), default=-1) + 1
    out: list[UOp] = []
    work = [(nest, 0) for nest in sink.src]
    while work:
        nest, peeled = work.pop(0)
        cut = None
        if nest.op is Ops.END and peeled < MAX_PEELS:
            # a register tile wider than MAX_LANES is copied only for broadcast gates, a branch per row, or for
            # masks the target builds
            wide = lanes(nest) > MAX_LANES
            for r in nest.src[1:]:
                if (
                    r.op is Ops.RANGE
                    and r.arg[1] is AxisType.LOOP
                    and r.src[0].op is Ops.CONST
                    and (cut := interior(nest, r, vectors, wide, built_masks)) is not None
                ):
                    break
        if cut is None:
            out.append(nest)
            continue
        lo, hi = cut
        n = r.src[0].arg
        parts = []
        for start, end in ((0, lo), (lo, hi), (hi, n)):
            if end > start:
                part, next_id = _part(nest, r, start, end - start, next_id)
                parts.append(graph_rewrite(part, pm_peeled))
        mid = 1 if lo > 0 else 0
        out.extend(p for i, p in enumerate(parts) if i < mid)
        work.insert(0, (parts[mid], peeled + 1))  # the interior: peeled again on its next range
        rest = [p for i, p in enumerate(parts) if i > mid]
        if rest:  # the upper border follows the interior
            work.insert(1, (rest[0], MAX_PEELS))
    return sink.replace(src=tuple(out)) if tuple(out) != sink.src else sink
