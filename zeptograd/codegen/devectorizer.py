"""Devectorize: split the vector ops a target can't express into lanes, and fold lane shuffles away.

Vectors stay wherever the renderer can express them (`Renderer.keeps_vector`), which is what tinygrad's
DEVECTORIZE=0 asks for; DEVECTORIZE=2 splits every vector ALU op into lanes (to measure what vectors buy).
"""

from __future__ import annotations

from zeptograd.dtype import dtypes
from zeptograd.helpers import DEVECTORIZE
from zeptograd.uop.ops import GroupOp, Ops, UOp
from zeptograd.uop.upat import PatternMatcher, UPat


def split_vector_alu(ctx, x: UOp) -> UOp | None:
    """# op(vector a, vector b) -> VECTORIZE(op(a[0], b[0]), op(a[1], b[1]), ...) where the target lacks it"""
    n = max([x.dtype.count] + [s.dtype.count for s in x.src])
    if n == 1 or (ctx.keeps_vector(x) and DEVECTORIZE < 2):
        return None
    lanes = tuple(UOp(x.op, x.dtype.scalar, tuple(_lane(s, i) for s in x.src), x.arg) for i in range(n))
    return UOp(Ops.VECTORIZE, x.dtype.scalar.vec(n), lanes)


def split_masked_load(ctx, ld: UOp, idx: UOp) -> UOp | None:
    """# LOAD(INDEX(buf, i, vector valid)) -> VECTORIZE(LOAD(INDEX(buf, i+k, valid[k]))...) where the target has no
    masked vector loads"""
    if len(idx.src) < 3 or idx.src[2].dtype.count == 1 or ctx.masked_vectors:
        return None
    return UOp(
        Ops.VECTORIZE,
        ld.dtype,
        tuple(UOp(Ops.LOAD, ld.dtype.scalar, (_lane_index(idx, k),)) for k in range(ld.dtype.count)),
    )


def split_masked_store(ctx, st: UOp, idx: UOp) -> UOp | None:
    """# STORE(INDEX(buf, i, vector valid), x) -> GROUP(STORE(INDEX(buf, i+k, valid[k]), x[k])...)"""
    if len(idx.src) < 3 or idx.src[2].dtype.count == 1 or ctx.masked_vectors:
        return None
    val = st.src[1]
    return UOp(Ops.GROUP, dtypes.void, tuple(_lane_index(idx, k).store(_lane(val, k)) for k in range(val.dtype.count)))


def _lane_index(idx: UOp, k: int) -> UOp:
    i = idx.src[1] if k == 0 else idx.src[1] + UOp.const(idx.src[1].dtype, k)
    return UOp(Ops.INDEX, idx.dtype, (idx.src[0], i, _lane(idx.src[2], k)))


def _lane(x: UOp, i: int) -> UOp:
    return x if x.dtype.count == 1 else UOp(Ops.GEP, x.dtype.scalar, (x,), (i,))


def fold_gep_vectorize(g: UOp, v: UOp) -> UOp:
    """# VECTORIZE(a, b, c)[1] -> b; VECTORIZE(a, b, c)[2, 0] -> VECTORIZE(c, a)"""
    if len(g.arg) == 1:
        return v.src[g.arg[0]]
    return UOp(Ops.VECTORIZE, g.dtype, tuple(v.src[i] for i in g.arg))


def fold_vectorize_gep(v: UOp) -> UOp | None:
    """# VECTORIZE(x[0], x[1], ..., x[n-1]) -> x"""
    first = v.src[0]
    if first.op is not Ops.GEP or first.src[0].dtype != v.dtype:
        return None
    if all(s.op is Ops.GEP and s.src[0] is first.src[0] and s.arg == (i,) for i, s in enumerate(v.src)):
        return first.src[0]
    return None


pm_devectorize = PatternMatcher(
    [
        (UPat(GroupOp.ALU | {Ops.CAST, Ops.BITCAST}, name="x"), split_vector_alu),
        (UPat(Ops.LOAD, name="ld", src=(UPat(Ops.INDEX, name="idx"),)), split_masked_load),
        (UPat(Ops.STORE, name="st", src=(UPat(Ops.INDEX, name="idx"), UPat())), split_masked_store),
        (UPat(Ops.GEP, name="g", src=(UPat(Ops.VECTORIZE, name="v"),)), fold_gep_vectorize),
        (UPat(Ops.VECTORIZE, name="v"), fold_vectorize_gep),
    ]
)
