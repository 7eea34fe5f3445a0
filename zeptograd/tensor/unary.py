"""Unary math and activations, each composed from the primitive ALU UOps (EXP2 LOG2 SIN COS TAN SQRT RECIPROCAL
TRUNC)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from zeptograd.dtype import dtypes
from zeptograd.gradient import with_gradient
from zeptograd.helpers import ArgumentError
from zeptograd.uop.ops import Ops

if TYPE_CHECKING:
    from zeptograd.tensor import Tensor

# Abramowitz & Stegun 4.4.46 (asin, |error| <= 2e-8) and 7.1.26 (erf, |error| <= 1.5e-7), highest power first
_ASIN = [
    -0.0012624911,
    0.0066700901,
    -0.0170881256,
    0.0308918810,
    -0.0501743046,
    0.0889789874,
    -0.2145988016,
    1.5707963050,
]
_ERF = [1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592, 0.0]


def _clamp_grad(g: Tensor, out: Tensor, x: Tensor, lo: Tensor, hi: Tensor) -> tuple:
    """torch's clamp: x gets the gradient inside [lo, hi], the bounds included (not half of it, as maximum's tie);
    lo where it clamps x (and lo < hi), hi where it clamps x or lo > hi (then the result is hi everywhere)."""
    return (
        ((x >= lo) & (x <= hi)).where(g, 0),
        ((x < lo) & (lo < hi)).where(g, 0),
        ((x > hi) | (hi < lo)).where(g, 0),
    )


def _clamp_one_grad(upper: bool):
    """torch's clamp with one bound: x gets the gradient on its side of the bound (the bound included)."""

    def rule(g: Tensor, out: Tensor, x: Tensor, bound: Tensor) -> tuple:
        inside, clamped = (x <= bound, x > bound) if upper else (x >= bound, x < bound)  # a nan x: neither
        return inside.where(g, 0), clamped.where(g, 0)

    return rule


def _relu_rule(g: Tensor, out: Tensor, x: Tensor) -> tuple:
    return ((out == 0).where(0, g),)


class UnaryMixin:
    __slots__ = ()

    def _unary_float(self: Tensor, op: Ops) -> Tensor:
        return self._float()._alu(op)

    def _poly(self: Tensor, coeffs: list[float]) -> Tensor:
        ret = self.zeros_like() + coeffs[0]
        for c in coeffs[1:]:
            ret = ret * self + c
        return ret

    # ***** the primitives *****
    def exp2(self: Tensor) -> Tensor:
        return self._unary_float(Ops.EXP2)

    def log2(self: Tensor) -> Tensor:
        return self._unary_float(Ops.LOG2)

    def sin(self: Tensor) -> Tensor:
        return self._unary_float(Ops.SIN)

    def sqrt(self: Tensor) -> Tensor:
        return self._unary_float(Ops.SQRT)

    def reciprocal(self: Tensor) -> Tensor:
        return self._unary_float(Ops.RECIPROCAL)

    def trunc(self: Tensor) -> Tensor:
        return self._alu(Ops.TRUNC) if dtypes.is_float(self.dtype) else self

    # ***** exponentials and logarithms *****
    def exp(self: Tensor) -> Tensor:
        return (self._float() * (1 / math.log(2))).exp2()

    def log(self: Tensor) -> Tensor:
        return self.log2() * math.log(2)

    def log10(self: Tensor) -> Tensor:
        return self.log2() * math.log10(2)

    def rsqrt(self: Tensor) -> Tensor:
        return self.sqrt().reciprocal()

    def square(self: Tensor) -> Tensor:
        return self * self

    # ***** trigonometry *****
    # cos and tan are primitives too: sin(pi/2 - x) rounds pi/2 - x to the float first (cos(1e6) off by 3e-3), and
    # sin/cos divides two rounded results (tan up to 3 ulp); each is reduced by pi/2 from the exact argument instead
    def cos(self: Tensor) -> Tensor:
        return self._unary_float(Ops.COS)

    def tan(self: Tensor) -> Tensor:
        return self._unary_float(Ops.TAN)

    def asin(self: Tensor) -> Tensor:
        a = self._float().abs()
        return self._float().sign() * (math.pi / 2 - (1.0 - a).sqrt() * a._poly(_ASIN))

    def acos(self: Tensor) -> Tensor:
        return math.pi / 2 - self.asin()

    def atan(self: Tensor) -> Tensor:
        a = self._float().abs()
        big = a > 1
        y = big.where(a.maximum(1.0).reciprocal(), a)  # atan(a) = pi/2 - atan(1/a) keeps the argument in [0, 1]
        r = (y / (y * y + 1).sqrt()).asin()
        return self._float().sign() * big.where(math.pi / 2 - r, r)

    def sinh(self: Tensor) -> Tensor:
        return (self.exp() - (-self).exp()) * 0.5

    def cosh(self: Tensor) -> Tensor:
        return (self.exp() + (-self).exp()) * 0.5

    def tanh(self: Tensor) -> Tensor:
        return 2.0 * (2.0 * self._float()).sigmoid() - 1.0

    def asinh(self: Tensor) -> Tensor:
        a = self._float().abs()
        return self._float().sign() * (a + (a * a + 1).sqrt()).log()

    def acosh(self: Tensor) -> Tensor:
        x = self._float()
        return (x + (x * x - 1).sqrt()).log()

    def atanh(self: Tensor) -> Tensor:
        x = self._float()
        return ((1 + x) / (1 - x)).log() * 0.5

    def erf(self: Tensor) -> Tensor:
        x = self._float()
        t = 1.0 / (1.0 + 0.3275911 * x.abs())
        return x.sign() * (1.0 - t._poly(_ERF) * (-x.square()).exp())

    # ***** rounding and signs *****
    def floor(self: Tensor) -> Tensor:
        t = self.trunc()
        return (t > self).where(t - 1, t) if dtypes.is_float(self.dtype) else self

    def ceil(self: Tensor) -> Tensor:
        t = self.trunc()
        return (t < self).where(t + 1, t) if dtypes.is_float(self.dtype) else self

    def round(self: Tensor) -> Tensor:
        """Half to even, as torch."""
        if not dtypes.is_float(self.dtype):
            return self
        f = self.floor()
        d = self - f
        f_odd = (f * 0.5).floor() * 2 != f
        return (d > 0.5).where(f + 1, (d < 0.5).where(f, f_odd.where(f + 1, f)))

    def sign(self: Tensor) -> Tensor:
        if self.dtype == dtypes.bool:
            return self
        if not dtypes.is_float(self.dtype):
            return (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype)
        return (self > 0).where(1.0, (self < 0).where(-1.0, 0.0)).cast(self.dtype)  # sign(nan) is 0, as torch

    def abs(self: Tensor) -> Tensor:
        if self.dtype == dtypes.bool or dtypes.is_unsigned(self.dtype):
            return self
        return self * self.sign() if dtypes.is_float(self.dtype) else (self < 0).where(-self, self)

    def copysign(self: Tensor, other) -> Tensor:
        x = self._float()
        o = other if isinstance(other, type(self)) else self._scalar(float(other), x.dtype)
        neg = (o < 0) | ((o == 0) & (o._float().reciprocal() < 0)) if dtypes.is_float(o.dtype) else (o < 0)
        return neg.where(-x.abs(), x.abs())

    def logaddexp(self: Tensor, other) -> Tensor:
        a, b = self._float()._operands(other)
        m = a.maximum(b)
        return m + ((a - m).exp() + (b - m).exp()).log()

    # ***** tests *****
    def isnan(self: Tensor) -> Tensor:
        return self != self

    def isinf(self: Tensor, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
        return ((self == math.inf) & detect_positive) | ((self == -math.inf) & detect_negative)

    def isfinite(self: Tensor) -> Tensor:
        return (self.isinf() | self.isnan()).logical_not()

    def isclose(self: Tensor, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
        """torch.isclose: equal, or |a - b| <= atol + rtol * |b| where |a - b| is finite (inf is close only to
        itself); nan is close to nan only with equal_nan."""
        if rtol < 0 or atol < 0:
            raise ArgumentError(f"isclose: rtol and atol must be >= 0, got rtol={rtol}, atol={atol}")
        a, b = self._operands(other)
        close = a == b
        if equal_nan:
            close = close | (a.isnan() & b.isnan())
        if rtol == 0 and atol == 0:
            return close
        err = (a._float() - b._float()).abs()  # ints in float, as torch: no wrapping difference
        return close | (err.isfinite() & (err <= atol + (rtol * b._float()).abs()))

    def allclose(self: Tensor, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
        return self.isclose(other, rtol, atol, equal_nan).all()

    def clamp(self: Tensor, min_=None, max_=None) -> Tensor:
        """torch.clamp: min(max(x, lo), hi) (hi where lo > hi, nan where x or a bound is nan), with torch's gradient
        (x's inside [lo, hi], the bounds included; a tensor bound's where it clamps)."""
        if min_ is None and max_ is None:
            raise ArgumentError("clamp needs at least one of min_ and max_")
        x, lo, hi = self, None, None
        if min_ is not None:
            x, lo = x._operands(min_)
        if max_ is not None:
            x, hi = x._operands(max_)
            lo = None if lo is None else lo.cast(x.dtype)._broadcast_to(x.shape)
        # min(max(x, lo), hi) as selections, not MAX: a graph of its own (an explicit maximum keeps its tie rule)
        ret, is_float = x, dtypes.is_float(x.dtype)
        if lo is not None:
            ret = (ret < lo).where(lo, ret)
            ret = lo.isnan().where(lo, ret) if is_float else ret  # a nan bound gives nan, as torch
        if hi is not None:
            ret = (ret > hi).where(hi, ret)
            ret = hi.isnan().where(hi, ret) if is_float else ret
        inputs = tuple(t for t in (x, lo, hi) if t is not None)
        return with_gradient(
            ret, inputs, _clamp_grad if lo is not None and hi is not None else _clamp_one_grad(lo is None)
        )

    def clip(self: Tensor, min_=None, max_=None) -> Tensor:
        return self.clamp(min_, max_)

    # ***** activations *****
    def relu(self: Tensor) -> Tensor:
        # relu(nan) is nan, relu(-0.0) is -0.0 (as torch's). Its gradient reads the output, as torch's
        # threshold_backward (none at 0 or -0.0; nan passes it): the next layer reads the output anyway, where the
        # where's own gradient would read the condition, a buffer of its own. (A rule on this node, not on every
        # (x < 0).where(0, x): written by hand, torch's where passes the gradient at 0.)
        return with_gradient((self < 0).where(0, self), (self,), _relu_rule)

    def relu6(self: Tensor) -> Tensor:
        # torch's hardtanh(0, 6): no gradient at 6 (nor at 0, relu's)
        return (self >= 6).where(6, self.relu())

    def leaky_relu(self: Tensor, neg_slope: float = 0.01) -> Tensor:
        return (self < 0).where(self * neg_slope, self)

    def sigmoid(self: Tensor) -> Tensor:
        x = self._float()
        e = (-x.abs()).exp()  # never overflows, so neither the value nor its gradient is inf * 0
        return (x >= 0).where(1 / (1 + e), e / (1 + e))

    def logsigmoid(self: Tensor) -> Tensor:
        return -(-self).softplus()

    def hardsigmoid(self: Tensor, alpha: float = 1 / 6, beta: float = 0.5) -> Tensor:
        return (alpha * self + beta).relu() - (alpha * self + beta - 1).relu()

    def hardswish(self: Tensor) -> Tensor:
        return self * (self + 3).relu6() * (1 / 6)

    def hardtanh(self: Tensor, min_val: float = -1, max_val: float = 1) -> Tensor:
        return self.clip(min_val, max_val)

    def elu(self: Tensor, alpha: float = 1.0) -> Tensor:
        return (self > 0).where(self, alpha * (self.minimum(0).exp() - 1))

    def celu(self: Tensor, alpha: float = 1.0) -> Tensor:
        return self.maximum(0) + (alpha * ((self.minimum(0) / alpha).exp() - 1))

    def selu(self: Tensor, alpha: float = 1.67326, gamma: float = 1.0507) -> Tensor:
        return gamma * self.elu(alpha)

    def gelu(self: Tensor, approximate: str = "tanh") -> Tensor:
        if approximate == "none":
            return 0.5 * self * (1 + (self * (1 / math.sqrt(2))).erf())
        if approximate != "tanh":
            raise ArgumentError(f"gelu approximate must be 'tanh' or 'none', got {approximate!r}")

        k, c = math.sqrt(2 / math.pi), 0.044715

        def sigmoid_of_cubic(x: Tensor) -> Tensor:
            # 0.5 (1 + tanh(u)) = sigmoid(2u), u = k (x + c x^3): one exp and one division (tanh's stable sigmoid
            # takes an abs, a where and two divisions). exp overflowing to inf gives 0, and x * 0 torch's -0 and nan
            return 1 / (1 + (-2 * k * (x + c * x * x * x)).exp())

        def rule(g: Tensor, out: Tensor, x: Tensor) -> tuple:
            # torch's 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3c x^2) with 0.5 (1 + t) = s, 0.5 (1 - t^2) = 2 s (1 - s),
            # sharing only s with the forward: the primitives' gradients read their intermediates (tanh's sigmoid:
            # exp, abs, where), each of which a kernel of its own stored between the two matmuls around a GELU.
            # Half dtypes compute it in float32, as torch does: in float16, 1 - s is 0 from x ~ 2.5 on
            half = x.dtype in (dtypes.float16, dtypes.bfloat16)
            xf = x.cast(dtypes.float32) if half else x
            s = sigmoid_of_cubic(xf)
            grad = g.cast(xf.dtype) * (s + 2 * k * xf * s * (1 - s) * (1 + 3 * c * xf * xf))
            return (grad.cast(x.dtype) if half else grad,)

        return with_gradient(self * sigmoid_of_cubic(self), (self,), rule)

    def quick_gelu(self: Tensor) -> Tensor:
        return self * (self * 1.702).sigmoid()

    def silu(self: Tensor) -> Tensor:
        return self * self.sigmoid()

    def swish(self: Tensor) -> Tensor:
        return self.silu()

    def softplus(self: Tensor, beta: float = 1.0) -> Tensor:
        x = self._float() * beta
        return (x.maximum(0) + (1 + (-x.abs()).exp()).log()) * (1 / beta)

    def mish(self: Tensor) -> Tensor:
        return self * self.softplus().tanh()

    def softsign(self: Tensor) -> Tensor:
        return self / (1 + self.abs())
