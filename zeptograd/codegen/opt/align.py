"""Reduce inputs read through whole vectors: an output loop whose reduced loads all start off a vector boundary is
shifted back to it, its extra iterations' stores gated off (CPU renderers, before the optimizer's actions).

A slice of a reduce's result, `x.mean(0)[:, 1:-1]`, reaches the kernel as an output loop r over the n kept columns
whose loads read `x[k*128 + r + 1]`: every vector split off r then starts one float past a vector boundary and
spans two cache lines, on each of the reduce's k iterations (112 floats of 128 rows: 1.30 us, against 0.78 us
aligned, one core). The reduce over the aligned superset of those columns costs a few lanes more and reads whole
vectors; only the sliced lanes are stored:

    r in [0, n), loads at base + r + c, c % w = a != 0 (w: the vector's lanes)
      -> R in [0, n'), r = R - a, the stores (and the loads outside the reduce) gated on a <= R < a + n
    n' = n + a rounded up to a multiple of w where the loads stay inside their buffers (else n + a)

The loads at R < a (and R >= a + n) read base + c - a .. (the columns before and after the slice, in bounds: checked
on the index's value range), their values only reach the gated-off stores. A load outside the reduce (a bias[r]
applied after it, one per output) would read bias[-1]: it takes the slice's gate, ANDed with its own, as a store
does. A gated load inside the reduce that uses r leaves the kernel alone (its index may leave the buffer where its
gate is false). Loads at different offsets along r (x[r] + x[r+1]) leave it alone too: no shift aligns them all.
"""

from __future__ import annotations

from zeptograd.dtype import PtrDType
from zeptograd.uop.ops import AxisType, Ops, UOp
from zeptograd.uop.symbolic import split_sum, symbolic
from zeptograd.uop.upat import graph_rewrite, graph_substitute


def _offset(idx: UOp, r: UOp, lanes: int) -> int | None:
    """c % lanes where idx = base + r + c with base a multiple of lanes; None where idx is no such sum."""
    terms, const = split_sum(idx)
    if [c for t, c in terms if t is r] != [1]:
        return None
    if any(t is not r and (c % lanes != 0 or r in t.toposort()) for t, c in terms):
        return None
    return const % lanes


def _reduced_loads(sink: UOp) -> list[UOp]:
    """The INDEX of each buffer load inside a reduce whose index uses one of that reduce's ranges (it runs on
    every iteration of the reduce's loop, not once per output)."""
    out = []
    for red in (u for u in sink.toposort() if u.op is Ops.REDUCE):
        rranges = set(red.src[1:])
        for u in red.src[0].toposort():
            if u.op is Ops.LOAD and (idx := u.src[0]).op is Ops.INDEX and idx.src[0].op is Ops.DEFINE_GLOBAL:
                if rranges & set(idx.src[1].ranges):
                    out.append(idx)
    return out


def _in_bounds(idx: UOp, size: int) -> bool:
    return size > 0 and idx.vmin >= 0 and idx.vmax < size


def _gated(idx: UOp, gate: UOp) -> UOp:
    both = gate if len(idx.src) == 2 else idx.src[2] & gate
    return UOp(Ops.INDEX, idx.dtype, (idx.src[0], idx.src[1], both), idx.arg)


def align_reduced_loads(sink: UOp, simd_bytes: int) -> UOp:
    """The kernel with its reduced loads' vectors on whole-vector boundaries where a shift of one output loop does
    it (the module's algebra), else the kernel itself."""
    reduced = _reduced_loads(sink)
    if not reduced:
        return sink
    nodes = sink.toposort()
    stores = [u for u in nodes if u.op is Ops.STORE]
    loads = [u.src[0] for u in nodes if u.op is Ops.LOAD]
    for r in (u for u in nodes if u.op is Ops.RANGE and u.arg[1] is AxisType.LOOP and u.src[0].op is Ops.CONST):
        using = [idx for idx in reduced if r in idx.src[1].ranges]
        ptrs = [d for idx in using if isinstance(d := idx.src[0].dtype, PtrDType)]
        if not using or len(ptrs) != len(using) or any(len(idx.src) != 2 for idx in using):
            continue
        others = [idx for idx in loads if idx not in using and r in idx.toposort()]
        if any(idx.op is not Ops.INDEX or idx.src[0].op is not Ops.DEFINE_GLOBAL for idx in others):
            continue
        itemsize = max(p.base.itemsize for p in ptrs)
        lanes, n = simd_bytes // itemsize, r.src[0].arg
        if lanes < 2 or n < lanes:  # no whole vector in the loop: nothing to align
            continue
        offsets = {_offset(idx.src[1], r, lanes) for idx in using}
        a = offsets.pop() if len(offsets) == 1 else None
        if not a:  # loads at different offsets, or already on the boundary
            continue
        for size in dict.fromkeys(((n + a + lanes - 1) // lanes * lanes, n + a)):
            new_r = UOp(Ops.RANGE, r.dtype, (UOp.const(r.src[0].dtype, size),), r.arg)
            shifted = new_r + UOp.const(r.dtype, -a)
            if all(_in_bounds(graph_substitute(idx.src[1], {r: shifted}), p.size) for idx, p in zip(using, ptrs)):
                break
        else:
            continue
        kept = (UOp.const(r.dtype, a - 1) < new_r) & (new_r < UOp.const(r.dtype, a + n))
        # stores and the loads outside the reduce (a bias[r] after it: one per output) take the slice's gate
        mapping = {st.src[0]: _gated(st.src[0], kept) for st in stores if r in st.toposort()}
        mapping |= {idx: _gated(idx, kept) for idx in others}
        # then r -> R - a in them (graph_substitute does not substitute inside replacements) and everywhere else
        mapping = {k: graph_substitute(v, {r: shifted}) for k, v in mapping.items()} | {r: shifted}
        sink = graph_substitute(sink, mapping)
        # the loops' ENDs close the new range itself, not its shifted value
        ends = {
            u: u.replace(src=(u.src[0], *(new_r if s is shifted else s for s in u.src[1:])))
            for u in sink.toposort()
            if u.op is Ops.END and shifted in u.src[1:]
        }
        return graph_rewrite(graph_substitute(sink, ends), symbolic)
    return sink
