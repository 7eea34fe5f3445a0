"""Late lowering: what the targets can't compute directly becomes what they can."""

from __future__ import annotations

from zeptograd.dtype import dtypes
from zeptograd.uop.ops import GroupOp, Ops, UOp
from zeptograd.uop.upat import PatternMatcher, UPat

_HALF = (dtypes.float16, dtypes.bfloat16)
_TRANSCENDENTAL = GroupOp.Transcendental | {Ops.TRUNC}


def compute_in_float(x: UOp) -> UOp | None:
    """# bf16 math (and half transcendentals) -> cast to float32, compute, cast back"""
    if x.dtype.count != 1 or x.dtype not in _HALF or (x.dtype == dtypes.float16 and x.op not in _TRANSCENDENTAL):
        return None
    srcs = tuple(s.cast(dtypes.float32) if s.dtype in _HALF else s for s in x.src)
    return UOp(x.op, dtypes.float32, srcs).cast(x.dtype)


def compare_in_float(x: UOp) -> UOp | None:
    """# cmp(bf16, bf16) -> cmp(float, float)"""
    if not any(s.dtype == dtypes.bfloat16 for s in x.src):
        return None
    return UOp(x.op, x.dtype, tuple(s.cast(dtypes.float32) if s.dtype == dtypes.bfloat16 else s for s in x.src))


def guard_int_division(x: UOp, a: UOp, b: UOp) -> UOp | None:
    """# a // b -> a // (b == 0 ? 1 : b) for a divisor that may be zero (a trap in C, not a value)"""
    if b.op is Ops.CONST or not dtypes.is_int(b.dtype) or b.vmin > 0 or b.vmax < 0:
        return None
    if b.op is Ops.WHERE and b.src[0].op is Ops.CMPEQ and b.src[2] is b.src[0].src[0]:
        return None  # already guarded, also as a vector (its value range still spans 0: the rewrite would never end)
    safe = b.eq(UOp.const(b.dtype, 0)).where(UOp.const(b.dtype, 1), b)
    return UOp(x.op, x.dtype, (a, safe))


def cast_via_float(c: UOp, x: UOp) -> UOp | None:
    """# cast(half/bf16 <-> anything but float32) -> through float32: the renderers convert bf16 only to float, and
    LLVM's double/int <-> half conversions are compiler-rt calls a JIT'd kernel can't reach (a segfault)"""
    if c.dtype.scalar not in _HALF and x.dtype.scalar not in _HALF:
        return None
    if dtypes.float32 in (x.dtype.scalar, c.dtype.scalar) or x.dtype.scalar == c.dtype.scalar:
        return None
    f32 = dtypes.float32.vec(x.dtype.count)
    return x.cast(f32).cast(c.dtype)


pm_lower = PatternMatcher(
    [
        (UPat(GroupOp.ALU - GroupOp.Comparison - {Ops.WHERE}, name="x"), compute_in_float),
        (UPat(Ops.WHERE, dtype=dtypes.bfloat16, name="x"), compute_in_float),
        (UPat(GroupOp.Comparison, name="x"), compare_in_float),
        (UPat((Ops.IDIV, Ops.MOD), name="x", src=(UPat.var("a"), UPat.var("b"))), guard_int_division),
        (UPat(Ops.CAST, name="c", src=(UPat.var("x"),)), cast_via_float),
    ]
)
