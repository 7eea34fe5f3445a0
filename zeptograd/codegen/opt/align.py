"""Reduce inputs read through whole vectors: an output loop whose reduced loads all start off a vector boundary is
shifted back to it, its extra iterations' stores gated off (CPU renderers, before the heuristic's actions).

A slice of a reduce's result, `x.mean(0)[:, 1:-1]`, reaches the kernel as an output loop r over the n kept columns
whose loads read `x[k*128 + r + 1]`: every vector split off r then starts one float past a vector boundary and
spans two cache lines, on each of the reduce's k iterations (112 floats of 128 rows: 1.30 us, against 0.78 us
aligned, one core). The reduce over the aligned superset of those columns costs a few lanes more and reads whole
vectors; only the sliced lanes are stored:

    r in [0, n), loads at base + r + c, c % w = a != 0 (w: the vector's lanes)
      -> R in [0, n'), r = R - a, every store gated on a <= R < a + n
    n' = n + a rounded up to a multiple of w where the loads stay inside their buffers (else n + a)

The loads at R < a (and R >= a + n) read base + c - a .. (the columns before and after the slice, in bounds: checked
on the index's value range), their values only reach the gated-off stores. A load or store already gated on r keeps
its gate (the store's is ANDed with the new one); a gated load that uses r leaves the kernel alone (its index may
leave the buffer where its gate is false, and the shift moves the gate).
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


def align_reduced_loads(sink: UOp, simd_bytes: int) -> UOp:
    """The kernel with its reduced loads' vectors on whole-vector boundaries where a shift of one output loop does
    it (the module's algebra), else the kernel itself."""
    loads = _reduced_loads(sink)
    if not loads:
        return sink
    stores = [u.src[0] for u in sink.toposort() if u.op is Ops.STORE and u.src[0].op is Ops.INDEX]
    nodes = sink.toposort()
    for r in (u for u in nodes if u.op is Ops.RANGE and u.arg[1] is AxisType.LOOP and u.src[0].op is Ops.CONST):
        using = [idx for idx in loads if r in idx.src[1].ranges]
        if not using or any(len(idx.src) != 2 for idx in using):
            continue
        itemsize = max(idx.src[0].dtype.base.itemsize for idx in using if isinstance(idx.src[0].dtype, PtrDType))
        lanes, n = simd_bytes // itemsize, r.src[0].arg
        if lanes < 2 or n < lanes:  # no whole vector in the loop: nothing to align
            continue
        offsets = {_offset(idx.src[1], r, lanes) for idx in using}
        if len(offsets) != 1 or (a := offsets.pop()) in (None, 0):
            continue
        assert a is not None
        for size in dict.fromkeys(((n + a + lanes - 1) // lanes * lanes, n + a)):
            new_r = UOp(Ops.RANGE, r.dtype, (UOp.const(r.src[0].dtype, size),), r.arg)
            shifted = new_r + UOp.const(r.dtype, -a)
            if all(
                _in_bounds(graph_substitute(idx.src[1], {r: shifted}), idx.src[0].dtype.size)
                for idx in using
                if isinstance(idx.src[0].dtype, PtrDType)
            ):
                break
        else:
            continue
        kept = (UOp.const(r.dtype, a - 1) < new_r) & (new_r < UOp.const(r.dtype, a + n))
        mapping = {r: shifted}
        for st in stores:
            if r not in st.toposort():
                continue
            gate = kept if len(st.src) == 2 else st.src[2] & kept
            mapping[st] = UOp(Ops.INDEX, st.dtype, (st.src[0], st.src[1], gate), st.arg)
        # the stores' new INDEX nodes hold r in their index: substituted in them too
        mapping = {k: (graph_substitute(v, {r: shifted}) if k is not r else v) for k, v in mapping.items()}
        sink = graph_substitute(sink, mapping)
        # the loops' ENDs close the new range itself, not its shifted value
        ends = {u: u.replace(src=(u.src[0], *(new_r if s is shifted else s for s in u.src[1:]))) for u in sink.toposort() if u.op is Ops.END and shifted in u.src[1:]}
        return graph_rewrite(graph_substitute(sink, ends), symbolic)
    return sink
