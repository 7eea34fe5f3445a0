"""exp2, log2 and sin of float32 vectors as ALU ops, for targets without vector versions of them.

A vector `exp2` otherwise becomes one libm call per lane. Written with +, *, compares, selects, shifts and
bitcasts, it stays 16 lanes wide (softmax, gelu, sigmoid). Each is accurate to a few ulp in float32; NaN, the
infinities and the overflow/underflow ranges behave as IEEE says.
"""

from __future__ import annotations

import math

from zeptograd.dtype import dtypes
from zeptograd.uop.ops import Ops, UOp
from zeptograd.uop.upat import PatternMatcher, UPat


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


def _floor(x: UOp) -> UOp:
    t = x.cast(_ints(x)).cast(x.dtype)  # truncation toward zero, exact for |x| < 2**31
    return _where(_lt(x, t), t - _c(x, 1.0), t)


def _pow2i(n: UOp, like: UOp) -> UOp:
    """2**n for integer n in [-126, 127], built in the exponent bits"""
    bits = UOp(Ops.SHL, n.dtype, (n + UOp.const(n.dtype, 127), UOp.const(n.dtype, 23)))
    return UOp(Ops.BITCAST, like.dtype, (bits,))


ROUND_MAGIC = 1.5 * 2**23  # x + M - M rounds a float32 to an integer (the sum's low bits are gone)
EXP2_COEFFS = [1.0] + [math.log(2) ** k / math.factorial(k) for k in range(1, 8)]


def xexp2(x: UOp) -> UOp:
    """2**x = 2**n * 2**f with n = round(x), |f| <= 1/2; 2**n is applied in two halves to reach subnormals"""
    xc = _where(_lt(x, _c(x, -150.0)), _c(x, -150.0), _where(_lt(_c(x, 128.0), x), _c(x, 129.0), x))
    nf = (xc + _c(x, ROUND_MAGIC)) - _c(x, ROUND_MAGIC)  # round to nearest: 2 ops, exact for |xc| < 2**22
    p = _horner(xc - nf, EXP2_COEFFS)
    n = nf.cast(_ints(x))
    n1 = UOp(Ops.SHR, n.dtype, (n, UOp.const(n.dtype, 1)))  # floor(n/2): arithmetic shift
    n2 = n - n1
    ret = p * _pow2i(n1, x) * _pow2i(n2, x)
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


PI_PARTS = [3.140625, 0.0009670257568359375, 6.2771141529083252e-07, 1.2154201256553420e-10]
SIN_COEFFS = [(-1) ** k / math.factorial(2 * k + 1) for k in range(7)]


def xsin(x: UOp) -> UOp:
    """sin(x) = (-1)**n sin(r), x = n*pi + r with pi in four parts (Cody-Waite), |r| <= pi/2, odd Taylor series"""
    nf = _floor(x * _c(x, 1 / math.pi) + _c(x, 0.5))
    r = x
    for part in PI_PARTS:
        r = r - nf * _c(x, part)
    s = r * _horner(r * r, SIN_COEFFS)
    odd = UOp(Ops.AND, _ints(x), (nf.cast(_ints(x)), UOp.const(_ints(x), 1)))
    ret = _where(_ne(odd, UOp.const(odd.dtype, 0)), -s, s)
    finite = _lt(x * _c(x, 0.0), _c(x, 1.0))  # false for inf and nan
    return _where(finite, ret, _c(x, math.nan))


def _vector_f32(x: UOp) -> bool:
    return x.dtype.count > 1 and x.dtype.scalar == dtypes.float32


pm_transcendental = PatternMatcher(
    [
        # exp2(x) -> polynomial * 2**n
        (UPat(Ops.EXP2, src=(UPat.var("x"),)), lambda x: xexp2(x) if _vector_f32(x) else None),
        # log2(x) -> exponent + series
        (UPat(Ops.LOG2, src=(UPat.var("x"),)), lambda x: xlog2(x) if _vector_f32(x) else None),
        # sin(x) -> reduced argument + series
        (UPat(Ops.SIN, src=(UPat.var("x"),)), lambda x: xsin(x) if _vector_f32(x) else None),
    ]
)
