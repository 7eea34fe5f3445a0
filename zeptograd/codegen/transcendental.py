"""exp2, log2, sin, cos and tan of float32 as ALU ops, for targets without (accurate) vector versions of them.

A vector `exp2` otherwise becomes one libm call per lane. Written with +, *, compares, selects, shifts and
bitcasts, it stays 16 lanes wide (softmax, gelu, sigmoid). exp2/log2 are accurate to a few ulp in float32, sin/cos/
tan to 2 ulp for every finite argument (a reduction by pi/2 exact enough at 3.4e38 and at multiples of pi/2); NaN,
the infinities and the overflow/underflow ranges behave as IEEE says. The costly reduction for |x| >= 4096
(Payne-Hanek) sits in a loop that runs once where a lane of the vector needs it and never otherwise: a branch made
of a RANGE, a REDUCE and AFTER, which the accumulator pass, the linearizer and every renderer already handle.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from zeptograd.dtype import dtypes
from zeptograd.uop.ops import AxisType, Ops, UOp
from zeptograd.uop.upat import PatternMatcher, UPat, graph_rewrite
from zeptograd.viz.hook import named_pass  # VIZ=1: this pass is a named step of the trace

if TYPE_CHECKING:
    from zeptograd.renderer import Renderer


def _c(x: UOp, v) -> UOp:
    return UOp.const(x.dtype, v)


def _where(c: UOp, a: UOp, b: UOp) -> UOp:
    return UOp(Ops.WHERE, a.dtype, (c, a, b))


def _lt(a: UOp, b: UOp) -> UOp:
    return UOp(Ops.CMPLT, dtypes.bool.vec(a.dtype.count), (a, b))


def _ne(a: UOp, b: UOp) -> UOp:
    return UOp(Ops.CMPNE, dtypes.bool.vec(a.dtype.count), (a, b))


def _horner(x: UOp, coeffs: list[float]) -> UOp:
    """coeffs[0] + x*(coeffs[1] + x*(...)), highest degree innermost"""
    acc = _c(x, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = UOp(Ops.MULACC, x.dtype, (acc, x, _c(x, c)))
    return acc


def _ints(x: UOp):
    return dtypes.int32.vec(x.dtype.count)


def _pow2i(n: UOp, like: UOp) -> UOp:
    """2**n for integer n in [-126, 127], built in the exponent bits"""
    bits = UOp(Ops.SHL, n.dtype, (n + UOp.const(n.dtype, 127), UOp.const(n.dtype, 23)))
    return UOp(Ops.BITCAST, like.dtype, (bits,))


ROUND_MAGIC = 1.5 * 2**23  # x + M - M rounds a float32 to an integer (the sum's low bits are gone)
EXP2_COEFFS = [1.0] + [math.log(2) ** k / math.factorial(k) for k in range(1, 8)]


def xexp2(x: UOp) -> UOp:
    """2**x = 2**n * 2**f with n = round(x), |f| <= 1/2; 2**n is applied in two halves to reach subnormals. Below
    -150 the result is 0 and is selected, computed from x = 0 instead: a product that underflows takes a microcode
    assist on x86 (3.4x slower over 2**20 floats of -1000 on this AVX-512 host), and exp of large negative values is
    common (a sigmoid or GELU of large activations)"""
    underflows = _lt(x, _c(x, -150.0))
    xc = _where(underflows, _c(x, 0.0), _where(_lt(_c(x, 128.0), x), _c(x, 129.0), x))
    nf = (xc + _c(x, ROUND_MAGIC)) - _c(x, ROUND_MAGIC)  # round to nearest: 2 ops, exact for |xc| < 2**22
    p = _horner(xc - nf, EXP2_COEFFS)
    n = nf.cast(_ints(x))
    n1 = UOp(Ops.SHR, n.dtype, (n, UOp.const(n.dtype, 1)))  # floor(n/2): arithmetic shift
    n2 = n - n1
    ret = _where(underflows, _c(x, 0.0), p * _pow2i(n1, x) * _pow2i(n2, x))
    return _where(_ne(x, x), x, ret)  # NaN stays NaN


def xlog2(x: UOp) -> UOp:
    """log2(x) = e + log2(m), m in [sqrt(1/2), sqrt(2)), log2(m) = 2/ln2 * atanh((m-1)/(m+1)) as an odd series"""
    ints = _ints(x)
    small = _lt(x, _c(x, 1.1754943508222875e-38))  # subnormal: scale up by 2**23 first
    xs = _where(small, x * _c(x, 8388608.0), x)
    bits = UOp(Ops.BITCAST, ints, (xs,))
    e = UOp(Ops.SHR, ints, (bits, UOp.const(ints, 23))) - UOp.const(ints, 127)
    mbits = UOp(Ops.OR, ints, (UOp(Ops.AND, ints, (bits, UOp.const(ints, 0x7FFFFF))), UOp.const(ints, 0x3F800000)))
    m = UOp(Ops.BITCAST, x.dtype, (mbits,))
    big = _lt(_c(x, 1.4142135623730951), m)
    m = _where(big, m * _c(x, 0.5), m)
    ef = e.cast(x.dtype) + _where(big, _c(x, 1.0), _c(x, 0.0)) - _where(small, _c(x, 23.0), _c(x, 0.0))
    t = (m - _c(x, 1.0)) / (m + _c(x, 1.0))
    t2 = t * t
    series = t * _horner(t2, [1.0, 1 / 3, 1 / 5, 1 / 7, 1 / 9, 1 / 11])
    ret = ef + series * _c(x, 2 / math.log(2))
    ret = _where(_ne(x, _c(x, math.inf)), ret, x)  # log2(inf) = inf
    ret = _where(_lt(x, _c(x, 0.0)), _c(x, math.nan), ret)  # log2(negative) = nan
    ret = _where(_ne(x, x), x, ret)  # log2(nan) = nan
    return _where(_ne(x, _c(x, 0.0)), ret, _c(x, -math.inf))  # log2(0) = -inf


# ***** sin, cos, tan: x = q*pi/2 + r, |r| <= pi/4, r kept as hi + lo (two floats), then a series in r *****
# No fused multiply-add is assumed (the C renderer's MULACC is a*b+c): every product the reduction relies on is
# exact because one factor has at most 12 significant bits, and sums keep their rounding error (Knuth's two-sum).

CW_LIMIT = 4096.0  # Cody-Waite below this: q = round(x*2/pi) < 2**12, so q times a 12-bit constant is exact
# pi/2 = C1 + C2 + C3 + C4 + C5 (+ 1.9e-25): C1..C4 of 12 significant bits each, C5 a float32
HALF_PI_PARTS = [1.57080078125, -4.453584551811218e-06, -8.706138032721356e-10, 6.222800053024002e-14]
HALF_PI_LAST = 5.721188916458728e-18
# Payne-Hanek: the 224 fraction bits of 2/pi as 32-bit words, least significant first (the 8th word is 0)
TWO_OVER_PI_WORDS = [
    0xFE5163AB,
    0x3C439041,
    0xDB629599,
    0xF534DDC0,
    0xFC2757D1,
    0x4E441529,
    0xA2F9836E,
    0x0,
]
# pi/2 * 2**-30 (a fixed-point fraction's unit) as two 12-bit parts and a float32 rest: pi/2 * 2**-62 parts * 2**32
FRAC_UNIT_PARTS = [p * 2.0**32 for p in (3.4050724479622874e-19, 1.0489684142938082e-22, 1.6370997713714376e-26)]
SIN_COEFFS = [(-1) ** (k + 1) / math.factorial(2 * k + 3) for k in range(5)]  # sin r = r + r**3 * P(r**2), |r| <= pi/4
COS_COEFFS = [(-1) ** k / math.factorial(2 * k + 4) for k in range(5)]  # cos r = 1 - r**2/2 + r**4 * P(r**2)
# tan r = r + r**3 * P(r**2): least squares on Chebyshev nodes of |r| <= 1.02*pi/4, |error of P| < 1.2e-8
TAN_COEFFS = [
    0.3333333326,
    0.1333334751,
    0.05396372354,
    0.02192424205,
    0.008542023533,
    0.004595130233,
    -0.00021143421,
    0.001892144706,
]


def _two_sum(a: UOp, b: UOp) -> tuple[UOp, UOp]:
    """s + e = a + b exactly, s = fl(a + b) (Knuth)"""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _fast_two_sum(a: UOp, b: UOp) -> tuple[UOp, UOp]:
    """s + e = a + b exactly where |a| >= |b| (Dekker)"""
    s = a + b
    return s, b - (s - a)


def _split12(x: UOp) -> tuple[UOp, UOp]:
    """x = hi + lo, each with at most 12 significant bits: the low 12 mantissa bits cleared (exact, no rounding)"""
    u32 = dtypes.uint32.vec(x.dtype.count)
    hi = (x.bitcast(u32) & UOp.const(u32, 0xFFFFF000)).bitcast(x.dtype)
    return hi, x - hi


def _reduce_cody_waite(ax: UOp) -> tuple[UOp, UOp, UOp]:
    """(q, hi, lo) with ax = q*pi/2 + hi + lo for 0 <= ax < CW_LIMIT, to about 2**-68 absolute"""
    q = (ax * _c(ax, 2 / math.pi) + _c(ax, ROUND_MAGIC)) - _c(ax, ROUND_MAGIC)
    s = ax - q * _c(ax, HALF_PI_PARTS[0])  # exact: q*C1 is (12 + 12 bits) and within a factor 2 of ax (Sterbenz)
    lo = _c(ax, 0.0)
    for part in HALF_PI_PARTS[1:]:
        s, err = _two_sum(s, q * _c(ax, -part))
        lo = lo + err
    hi, lo = _fast_two_sum(s, lo - q * _c(ax, HALF_PI_LAST))
    return q.cast(_ints(ax)), hi, lo


def _reduce_payne_hanek(ax: UOp) -> tuple[UOp, UOp, UOp]:
    """(q mod 4, hi, lo) with ax = q*pi/2 + hi + lo for CW_LIMIT <= ax < inf: ax = m * 2**e with a 24-bit integer m;
    ax*2/pi mod 4 = m * (a 96-bit window of 2/pi's bits chosen by e), in 64-bit integers (2 bits of quadrant, 62 of
    fraction; what lies above the window is a multiple of 4, what lies below changes the last bit at most). Only the
    three products and their sum are 64-bit: AVX2 has 32x32->64 multiplies, 32-bit conversions and 8 lanes of u32."""
    u32, u64, i32 = (d.vec(ax.dtype.count) for d in (dtypes.uint32, dtypes.uint64, dtypes.int32))

    def u(v: int) -> UOp:
        return UOp.const(u32, v)

    bits = ax.bitcast(u32)
    m = ((bits & u(0x7FFFFF)) | u(0x800000)).cast(u64)
    biased = UOp(Ops.SHR, u32, (bits, u(23))).maximum(u(139)).minimum(u(254))  # e = biased - 150 in [-11, 104]
    shift = u(280) - biased  # the window starts 224 - 94 - e = 280 - biased bits up
    word, bit = UOp(Ops.SHR, u32, (shift, u(5))), shift & u(31)
    at = [word.eq(u(j)) for j in range(5)]
    words = []
    for k in range(4):  # TWO_OVER_PI_WORDS[word + k]
        w = u(TWO_OVER_PI_WORDS[k])
        for j in range(1, 5):
            w = at[j].where(u(TWO_OVER_PI_WORDS[j + k]), w)
        words.append(w)
    # limb i = bits [32i + bit, 32i + bit + 32) of the words; the upper word shifted in two steps (bit may be 0)
    limbs = []
    for i in range(3):
        upper = UOp(Ops.SHL, u32, (UOp(Ops.SHL, u32, (words[i + 1], u(1))), u(31) - bit))
        limbs.append((UOp(Ops.SHR, u32, (words[i], bit)) | upper).cast(u64))
    # (m * window) >> 32 mod 2**64: each product of 24 by 32 bits fits in 64
    c32 = UOp.const(u64, 32)
    prod = UOp(Ops.SHL, u64, (m * limbs[2], c32)) + m * limbs[1] + UOp(Ops.SHR, u64, (m * limbs[0], c32))
    prod = prod + UOp.const(u64, 1 << 61)  # round the quadrant to nearest: the fraction becomes [-1/2, 1/2)
    top, low = UOp(Ops.SHR, u64, (prod, c32)).cast(u32), prod.cast(u32)
    q = UOp(Ops.SHR, u32, (top, u(30))).cast(_ints(ax))
    # the fraction in units of 2**-30 quarter turns: a 30-bit signed integer plus the low word's top 24 bits / 2**32
    whole = (top & u(0x3FFFFFFF)).cast(i32) - UOp.const(i32, 1 << 29)
    f_hi = whole.cast(ax.dtype)  # rounded to 24 bits
    low24 = UOp(Ops.SHR, u32, (low, u(8))).cast(i32).cast(ax.dtype)
    f_lo = (whole - f_hi.cast(i32)).cast(ax.dtype) + low24 * _c(ax, 2.0**-24)
    # r = (f_hi + f_lo) * unit, the unit in 12 + 12 bits + rest, f_hi in 12 + 12 bits: the large products are exact
    fa, fb = _split12(f_hi)
    pa, pb, pc = (_c(ax, p) for p in FRAC_UNIT_PARTS)
    tail = fa * pb + fb * pa + fb * pb + f_hi * pc + f_lo * (pa + pb)
    hi, lo = _fast_two_sum(fa * pa, tail)
    return q, hi, lo


def _gep(v: UOp, lanes: range) -> UOp:
    return UOp(Ops.GEP, v.dtype.scalar.vec(len(lanes)), (v,), tuple(lanes))


def _any_lane(c: UOp) -> UOp:
    """whether some lane of a bool vector is true, as one bool: its halves OR'ed until one lane is left (a log2 tree
    of vector ORs, which LLVM lowers to a few instructions; an odd width's last lane joins at the end)"""
    odd: list[UOp] = []
    while (n := c.dtype.count) > 1:
        if n % 2:
            odd.append(_gep(c, range(n - 1, n)))
        c = UOp(Ops.OR, c.dtype.scalar.vec(n // 2), (_gep(c, range(n // 2)), _gep(c, range(n // 2, n // 2 * 2))))
    for lane in odd:
        c = UOp(Ops.OR, dtypes.bool, (c, lane))
    return c


def _reduce_half_pi(ax: UOp, axis: int) -> tuple[UOp, UOp, UOp]:
    """(q, hi, lo) with ax = q*pi/2 + hi + lo, |hi| <= pi/4 (a little more at ties), for finite ax >= 0: Cody-Waite on
    every lane, Payne-Hanek (92 ops to Cody-Waite's 35, 64-bit products among them) only where some finite lane is
    >= CW_LIMIT; each lane takes the one its size asks for, so a lane's bits do not depend on the other lanes."""
    small = _lt(ax, _c(ax, CW_LIMIT))
    cw = _reduce_cody_waite(ax)
    huge = UOp(Ops.AND, small.dtype, (_ne(small, UOp.const(small.dtype, True)), _lt(ax, _c(ax, math.inf))))
    u32 = dtypes.uint32.vec(ax.dtype.count)
    branch = UOp(Ops.RANGE, dtypes.index, (_any_lane(huge).cast(dtypes.index),), (axis, AxisType.REDUCE))
    # the loop runs once or never: its REDUCE (ADD of the bits, 0 + bits = bits) is the result or 0; what is built
    # from AFTER(ax, loop) runs inside it, never hoisted before
    ph_parts = _reduce_payne_hanek(ax.after(branch))
    ph = [UOp(Ops.REDUCE, u32, (v.bitcast(u32), branch), Ops.ADD).bitcast(v.dtype) for v in ph_parts]
    q, hi, lo = (_where(small, a, b) for a, b in zip(cw, ph))
    return q, hi, lo


def _sin_cos_reduced(hi: UOp, lo: UOp) -> tuple[UOp, UOp]:
    """sin and cos of hi + lo, |hi| <= pi/4, each within about 0.6 ulp"""
    z = hi * hi
    sin_tail = hi * z * _horner(z, SIN_COEFFS) + lo * (_c(hi, 1.0) - z * _c(hi, 0.5))
    # cos: 1 - hi**2/2 with hi**2 split exactly (hi = a + b, a and b of 12 bits), the rounding of 1 - a*a/2 kept
    a, b = _split12(hi)
    half_aa = a * a * _c(hi, -0.5)
    one, err = _fast_two_sum(_c(hi, 1.0), half_aa)
    cos_tail = err - a * b - b * b * _c(hi, 0.5) + z * z * _horner(z, COS_COEFFS) - lo * hi
    return hi + sin_tail, one + cos_tail


def _tan_reduced(hi: UOp, lo: UOp, odd: UOp) -> UOp:
    """tan(hi + lo), or -1/tan(hi + lo) where odd, |hi| <= pi/4"""
    z = hi * hi
    t, t_lo = _fast_two_sum(hi, hi * z * _horner(z, TAN_COEFFS) + lo * (_c(hi, 1.0) + z))
    inv = _c(hi, -1.0) / t
    return _where(odd, inv + inv * inv * t_lo, t)  # -1/(t + t_lo) = -1/t + t_lo/t**2


def _with_sign_of(v: UOp, x: UOp) -> UOp:
    """v with its sign bit flipped where x's is set (sin and tan are odd; -0.0 stays -0.0)"""
    u32 = dtypes.uint32.vec(x.dtype.count)
    sign = x.bitcast(u32) & UOp.const(u32, 0x80000000)
    return (v.bitcast(u32) ^ sign).bitcast(x.dtype)


def xtrig(x: UOp, op: Ops, axis: int) -> UOp:
    """sin, cos or tan of float32 x: reduced by pi/2 from |x| (Cody-Waite below CW_LIMIT, Payne-Hanek above, chosen
    per lane; Payne-Hanek in a loop `axis` that runs only where a lane needs it), then a series on [-pi/4, pi/4] by
    the quadrant. Within 2 ulp for every finite x."""
    ax = _where(_lt(x, _c(x, 0.0)), -x, x)
    q, hi, lo = _reduce_half_pi(ax, axis)
    ints = q.dtype
    if op is Ops.TAN:
        ret = _with_sign_of(_tan_reduced(hi, lo, _ne(q & UOp.const(ints, 1), UOp.const(ints, 0))), x)
    else:
        sin_r, cos_r = _sin_cos_reduced(hi, lo)
        quadrant = (q + UOp.const(ints, 1 if op is Ops.COS else 0)) & UOp.const(ints, 3)
        odd = _ne(quadrant & UOp.const(ints, 1), UOp.const(ints, 0))
        neg = _ne(quadrant & UOp.const(ints, 2), UOp.const(ints, 0))
        ret = _where(odd, cos_r, sin_r)
        ret = _where(neg, -ret, ret)
        if op is Ops.SIN:
            ret = _with_sign_of(ret, x)
    finite = _lt(x * _c(x, 0.0), _c(x, 1.0))  # false for inf and nan
    return _where(finite, ret, _c(x, math.nan))


@dataclass
class TranscendentalContext:
    renderer: Renderer
    axes: Iterator[int]  # ids for the loops that branch around Payne-Hanek, after the kernel's own


def _alu_vector(ctx: TranscendentalContext, op: Ops, x: UOp) -> bool:
    return x.dtype.count > 1 and x.dtype.scalar == dtypes.float32 and op in ctx.renderer.alu_transcendentals


def trig(ctx: TranscendentalContext, t: UOp, x: UOp) -> UOp | None:
    """float32 (and half, computed in float32) sin/cos/tan as ALU ops where the renderer asks for them"""
    if x.dtype.scalar not in (dtypes.float32, dtypes.float16, dtypes.bfloat16):
        return None
    if not ctx.renderer.alu_trig and not (x.dtype.count > 1 and t.op in ctx.renderer.alu_transcendentals):
        return None
    f32 = dtypes.float32.vec(x.dtype.count)
    return xtrig(x.cast(f32), t.op, next(ctx.axes)).cast(t.dtype)


pm_transcendental = PatternMatcher(
    [
        # exp2(x) -> polynomial * 2**n
        (UPat(Ops.EXP2, src=(UPat.var("x"),)), lambda ctx, x: xexp2(x) if _alu_vector(ctx, Ops.EXP2, x) else None),
        # log2(x) -> exponent + series
        (UPat(Ops.LOG2, src=(UPat.var("x"),)), lambda ctx, x: xlog2(x) if _alu_vector(ctx, Ops.LOG2, x) else None),
        # sin/cos/tan(x) -> argument reduced by pi/2 + series
        (UPat((Ops.SIN, Ops.COS, Ops.TAN), name="t", src=(UPat.var("x"),)), trig),
    ]
)


@named_pass("rewrite_transcendentals", "exp2/log2/sin/cos/tan the target lacks -> range reductions and polynomials")
def rewrite_transcendentals(sink: UOp, renderer: Renderer) -> UOp:
    """pm_transcendental on a kernel: what `renderer` asks for as ALU ops; new loops numbered after the kernel's"""
    axes = [u.arg[0] for u in sink.toposort() if u.op is Ops.RANGE]
    ctx = TranscendentalContext(renderer, itertools.count(max(axes, default=-1) + 1))
    return graph_rewrite(sink, pm_transcendental, ctx=ctx)
