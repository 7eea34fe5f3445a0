"""Late lowering: what the targets can't compute directly becomes what they can."""

from __future__ import annotations

from zeptograd.dtype import dtypes
from zeptograd.uop.ops import GroupOp, Ops, UOp
from zeptograd.uop.upat import PatternMatcher, UPat

_HALF = (dtypes.float16, dtypes.bfloat16)
_TRANSCENDENTAL = GroupOp.Transcendental | {Ops.TRUNC}


def compute_in_float(x: UOp) -> UOp | None:
    """# bf16 math (and half transcendentals) -> cast to float32, compute, cast back; vectors lane for lane"""
    dt = x.dtype.scalar
    if dt not in _HALF or (dt == dtypes.float16 and x.op not in _TRANSCENDENTAL):
        return None
    srcs = tuple(s.cast(dtypes.float32.vec(s.dtype.count)) if s.dtype.scalar in _HALF else s for s in x.src)
    return UOp(x.op, dtypes.float32.vec(x.dtype.count), srcs).cast(x.dtype)


def compare_in_float(x: UOp) -> UOp | None:
    """# cmp(bf16, bf16) -> cmp(float, float): bf16 is its raw bits to the renderers, an integer compare is wrong"""
    if not any(s.dtype.scalar == dtypes.bfloat16 for s in x.src):
        return None
    srcs = tuple(s.cast(dtypes.float32.vec(s.dtype.count)) if s.dtype.scalar == dtypes.bfloat16 else s for s in x.src)
    return UOp(x.op, x.dtype, srcs)


def _division_hazards(a: UOp, b: UOp) -> tuple[bool, bool]:
    """Whether b may be 0, and whether b may be -1 while a may be the dtype's minimum (C traps on both)."""
    dt = b.dtype.scalar
    zero = b.vmin <= 0 <= b.vmax
    minus_one = not dtypes.is_unsigned(dt) and b.vmin <= -1 <= b.vmax and a.vmin <= dtypes.min(dt)
    return zero, minus_one


def _hazard(b: UOp, minus_one: bool) -> UOp:
    """b == 0 (or b == -1): the divisor values C can't divide by (INT_MIN / -1 overflows: SIGFPE on x86)."""
    zero = b.eq(UOp.const(b.dtype, 0))
    return zero | b.eq(UOp.const(b.dtype, -1)) if minus_one else zero


def _is_safe_divisor(b: UOp) -> bool:
    """b is where(hazard(d), 1, d): made by total_int_division (its value range still spans the hazards)"""
    if b.op is not Ops.WHERE or b.src[1] is not UOp.const(b.dtype, 1):
        return False
    return any(b.src[0] is _hazard(b.src[2], m1) for m1 in (False, True))


def total_int_division(x: UOp, a: UOp, b: UOp) -> UOp | None:
    """# a // b, a % b total as numpy's: x // 0 = x % 0 = 0, INT_MIN // -1 = INT_MIN (wraps), x % -1 = 0.
    a // b -> b == -1 ? -a : b == 0 ? 0 : a // safe and a % b -> a % safe, safe = (b == 0 | b == -1) ? 1 : b"""
    if not dtypes.is_int(b.dtype.scalar) or _is_safe_divisor(b):
        return None
    zero, minus_one = _division_hazards(a, b)
    if not zero and not minus_one:
        return None
    dt, one = x.dtype, UOp.const(b.dtype, 1)
    safe = _hazard(b, minus_one).where(one, b)
    if x.op is Ops.MOD:  # a % 1 = 0: the value wanted for b == 0 and b == -1
        return UOp(Ops.MOD, dt, (a, safe))
    q = UOp(Ops.IDIV, dt, (a, safe))
    if zero:
        q = b.eq(UOp.const(b.dtype, 0)).where(UOp.const(dt, 0), q)
    if minus_one:  # -a wraps at INT_MIN (the renderers make signed negation wrap)
        q = b.eq(UOp.const(b.dtype, -1)).where(UOp(Ops.NEG, dt, (a,)), q)
    return q


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
        (UPat(GroupOp.ALU - GroupOp.Comparison, name="x"), compute_in_float),
        (UPat(GroupOp.Comparison, name="x"), compare_in_float),
        (UPat((Ops.IDIV, Ops.MOD), name="x", src=(UPat.var("a"), UPat.var("b"))), total_int_division),
        (UPat(Ops.CAST, name="c", src=(UPat.var("x"),)), cast_via_float),
    ]
)
