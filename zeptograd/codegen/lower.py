"""Late lowering: what the targets can't compute directly becomes what they can."""

from __future__ import annotations

import struct

from zeptograd.dtype import PtrDType, dtypes, truncate
from zeptograd.uop.ops import GroupOp, Ops, UOp, _alu_range
from zeptograd.uop.upat import PatternMatcher, UPat, graph_rewrite
from zeptograd.viz.hook import named_pass  # VIZ=1: this pass is a named step of the trace

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


# ***** bfloat16 conversions as integer ops *****
# bf16 is float32's upper 16 bits. To the renderers a bf16 value is those raw bits (C, OpenCL and CUDA have no bf16
# type, LLVM's is i16), so its conversions are written here once, as integer ops every target has.

_BF16, _F32, _U16, _U32 = dtypes.bfloat16, dtypes.float32, dtypes.uint16, dtypes.uint32


def bf16_const(c: UOp) -> UOp:
    """# CONST bf16 v -> bitcast<bf16>(CONST uint16 (float32 bits of v) >> 16)"""
    bits = struct.unpack("<I", struct.pack("<f", truncate(_BF16, c.arg)))[0] >> 16
    return UOp.const(_U16, bits).bitcast(_BF16)


def bf16_to_float(c: UOp, x: UOp) -> UOp | None:
    """# float32(bf16 x) -> bitcast<float32>(uint32(bitcast<uint16>(x)) << 16): bf16 is float32's upper half;
    float32(bitcast<bf16>(CONST uint16 b)) -> CONST float32 (b << 16)"""
    if x.dtype.scalar != _BF16 or c.dtype.scalar != _F32:
        return None
    if x.op is Ops.BITCAST and x.src[0].op is Ops.CONST:
        return UOp.const(c.dtype, struct.unpack("<f", struct.pack("<I", x.src[0].arg << 16))[0])
    n = x.dtype.count
    bits = x.bitcast(_U16.vec(n)).cast(_U32.vec(n))
    return UOp(Ops.SHL, _U32.vec(n), (bits, UOp.const(_U32.vec(n), 16))).bitcast(c.dtype)


def float_to_bf16(c: UOp, x: UOp) -> UOp | None:
    """# bf16(float32 x) -> bitcast<bf16>(uint16((u + 0x7fff + ((u >> 16) & 1)) >> 16)), u = bitcast<uint32>(x):
    round to nearest, ties to even; a NaN (u & 0x7fffffff > 0x7f800000) -> (u >> 16) | 0x40, a quiet NaN (its payload
    rounded could become inf, or carry into the sign: -0)"""
    if c.dtype.scalar != _BF16 or x.dtype.scalar != _F32:
        return None
    n = x.dtype.count
    u32 = _U32.vec(n)

    def k(v: int) -> UOp:
        return UOp.const(u32, v)

    u = x.bitcast(u32)
    hi = UOp(Ops.SHR, u32, (u, k(16)))
    rounded = UOp(Ops.SHR, u32, (u + k(0x7FFF) + (hi & k(1)), k(16)))
    is_nan = k(0x7F800000) < (u & k(0x7FFFFFFF))
    return is_nan.where(hi | k(0x40), rounded).cast(_U16.vec(n)).bitcast(c.dtype)


def fold_bf16_bits(b: UOp, x: UOp) -> UOp | None:
    """# bitcast<T>(bitcast<bf16>(x of T)) -> x: the bits a bf16 value was made of (a rounded result read back)"""
    return x if b.dtype == x.dtype else None


pm_lower = PatternMatcher(
    [
        (UPat(GroupOp.ALU - GroupOp.Comparison, name="x"), compute_in_float),
        (UPat(GroupOp.Comparison, name="x"), compare_in_float),
        (UPat((Ops.IDIV, Ops.MOD), name="x", src=(UPat.var("a"), UPat.var("b"))), total_int_division),
        (UPat(Ops.CAST, name="c", src=(UPat.var("x"),)), cast_via_float),
        (UPat(Ops.CONST, dtype=dtypes.bfloat16, name="c"), bf16_const),
        (UPat(Ops.CAST, name="c", src=(UPat.var("x"),)), bf16_to_float),
        (UPat(Ops.CAST, name="c", src=(UPat.var("x"),)), float_to_bf16),
        (UPat(Ops.BITCAST, name="b", src=(UPat(Ops.BITCAST, dtype=_BF16, src=(UPat.var("x"),)),)), fold_bf16_bits),
    ]
)


# ***** index dtypes: int32 unless the value range can leave it *****
# Index arithmetic (loop variables, GPU ids, variables, constants and the ALU ops over only these) is built in int32,
# and `symbolic` treats it as exact integers. Where a node's exact value range (its op over its sources' ranges,
# sources first) leaves int32 — a window's `ridx * 23850189`, a loop of 2**31 — it is computed in int64, and so is
# index arithmetic that reads it, until a value's range fits again (`big % 181` is narrowed back to int32). Data
# arithmetic and stores take their own width: int32 data reads a wide index cast to int32 (wraparound is the data's
# semantics: for + - * it is the same as wrapping at every step), int64 data widens an int32 index, a comparison
# widens its narrow side. Kernels where no value may leave int32 skip the rewrite (their source is unchanged).

_I32, _I64 = dtypes.int32, dtypes.int64
_I32_MIN, _I32_MAX = dtypes.min(_I32), dtypes.max(_I32)
_INDEX_LEAVES = (Ops.RANGE, Ops.SPECIAL, Ops.DEFINE_VAR, Ops.CONST)


class IndexWidths:
    """pm_index_dtype's context: the nodes known to be index arithmetic, and those of them that are 64-bit because
    their range leaves int32 (an int64 node outside it, or a CONST that fits, may be the user's int64 data)"""

    def __init__(self):
        self.index: set[UOp] = set()
        self.wide: set[UOp] = set()

    def add(self, u: UOp) -> None:
        self.index.add(u)
        if u.dtype.scalar is _I64:
            self.wide.add(u)


def _is_index(ctx: IndexWidths, u: UOp) -> bool:
    return u.dtype.scalar in (_I32, _I64) and (u.op in _INDEX_LEAVES or u in ctx.index)


def _is_wide_index(ctx: IndexWidths, u: UOp) -> bool:
    return u in ctx.wide or (u.dtype.scalar is _I64 and u.op in _INDEX_LEAVES and not _fits_int32(u.vmin, u.vmax))


def _wide(ctx: IndexWidths, u: UOp) -> UOp:
    if u.dtype.scalar != _I32:
        return u
    return UOp.const(_I64, u.arg) if u.op is Ops.CONST else u.cast(_I64.vec(u.dtype.count))


def _narrow(ctx: IndexWidths, u: UOp) -> UOp:
    if u.dtype.scalar != _I64:
        return u
    if u.op is Ops.CONST:
        return UOp.const(_I32, u.arg)
    ctx.add(ret := u.cast(_I32.vec(u.dtype.count)))  # still index arithmetic
    return ret


def _fits_int32(lo, hi) -> bool:
    return _I32_MIN <= lo and hi <= _I32_MAX


def _may_leave_int32(u: UOp) -> bool:
    """an int64 value, or an int32 one whose value range was clamped to all of int32 (or is a load's)"""
    scalar = u.dtype.scalar
    return scalar is _I64 or (scalar is _I32 and u.op is not Ops.RANGE and (u.vmin == _I32_MIN or u.vmax == _I32_MAX))


@named_pass("lower_index_dtypes", "index math in int64 where its value range leaves int32")
def lower_index_dtypes(sink: UOp) -> UOp:
    """pm_index_dtype where some value may leave int32; most kernels have none and skip the rewrite"""
    if not any(_may_leave_int32(u) for u in sink.toposort()):
        return sink
    return graph_rewrite(sink, pm_index_dtype, ctx=IndexWidths())


def widen_index(ctx: IndexWidths, x: UOp) -> UOp | None:
    """# index op(a, b) -> op(int64 a, int64 b) where a source's or the result's exact range leaves int32, else
    op(int32 a, int32 b): a wide source whose range fits (`big % 181`) is narrowed again; ops of only int64
    user values are left alone"""
    if x.dtype.scalar not in (_I32, _I64):
        return None
    vals = x.src[1:] if x.op is Ops.WHERE else x.src
    if not all(_is_index(ctx, s) for s in vals):
        return None
    if x.dtype.scalar is _I64 and all(s.dtype.scalar is _I64 for s in vals):
        if not any(_is_wide_index(ctx, s) for s in vals):
            return None  # an int64 value of the user's (its constants look like index leaves)
    ctx.add(x)  # index arithmetic: what reads it may be too
    r = _alu_range(x.op, [s.vrange for s in x.src]) if x.op in GroupOp.ALU else (x.vmin, x.vmax)
    fits = all(_fits_int32(s.vmin, s.vmax) for s in vals) and (r is None or _fits_int32(*r))
    to, cast = (_I32, _narrow) if fits else (_I64, _wide)
    src = tuple(cast(ctx, s) if s in vals else s for s in x.src)
    if x.dtype.scalar == to and src == x.src:
        return None
    ctx.add(ret := UOp(x.op, to.vec(x.dtype.count), src, x.arg))
    return ret


def range_width(ctx: IndexWidths, r: UOp) -> UOp | None:
    """# RANGE(end) -> an int64 loop variable where it counts past int32, else int32"""
    end = r.src[0]
    to, cast = (_I32, _narrow) if _fits_int32(end.vmin, end.vmax) else (_I64, _wide)
    if r.dtype == to and end.dtype == to:
        return None
    return UOp(Ops.RANGE, to, (cast(ctx, end), *r.src[1:]), r.arg)


def match_data_width(x: UOp) -> UOp | None:
    """# data op(int64, int32 index) -> op(int64, int64(index)); int32 op(int32, int64 index) -> op(int32,
    int32(index)): the data's own width decides (an int32 value wraps as int32)"""
    to = x.dtype.scalar
    if to not in (_I32, _I64) or not any(s.dtype.scalar in (_I32, _I64) and s.dtype.scalar is not to for s in x.src):
        return None
    srcs = tuple(s.cast(to.vec(s.dtype.count)) if s.dtype.scalar in (_I32, _I64) else s for s in x.src)
    return UOp(x.op, x.dtype, srcs, x.arg)


def widen_compare(x: UOp) -> UOp | None:
    """# cmp(int32 a, int64 b) -> cmp(int64 a, int64 b)"""
    if {s.dtype.scalar for s in x.src} != {_I32, _I64}:
        return None
    return UOp(x.op, x.dtype, tuple(_wide(IndexWidths(), s) for s in x.src), x.arg)


def store_width(st: UOp, idx: UOp, val: UOp) -> UOp | None:
    """# STORE(int32 buffer, int64 index value) -> STORE(int32 buffer, int32(value)), and int32 into int64"""
    base = idx.dtype.base.scalar if isinstance(idx.dtype, PtrDType) else idx.dtype.scalar
    if val.dtype.scalar is base or {val.dtype.scalar, base} != {_I32, _I64}:
        return None
    return UOp(Ops.STORE, st.dtype, (idx, val.cast(base.vec(val.dtype.count)), *st.src[2:]), st.arg)


pm_index_dtype = PatternMatcher(
    [
        (UPat(Ops.RANGE, name="r"), range_width),
        # VECTORIZE(int64 lane, int32 lane) -> VECTORIZE of int64 lanes; GEP(int64 vector)[i] -> int64
        (UPat(Ops.VECTORIZE, name="x"), lambda ctx, x: widen_index(ctx, x) or match_data_width(x)),
        (UPat(Ops.GEP, name="x"), widen_index),
        (UPat(GroupOp.Comparison, name="x"), widen_compare),
        (UPat(GroupOp.ALU - GroupOp.Comparison, name="x"), lambda ctx, x: widen_index(ctx, x) or match_data_width(x)),
        # CAST(int64 -> int64) -> nothing: a widened source already has the type
        (UPat(Ops.CAST, name="c", src=(UPat.var("s"),)), lambda c, s: s if s.dtype == c.dtype else None),
        (UPat(Ops.STORE, name="st", src=(UPat(Ops.INDEX, name="idx"), UPat.var("val"))), store_width),
    ]
)
