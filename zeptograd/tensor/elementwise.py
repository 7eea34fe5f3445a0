"""Binary arithmetic with broadcasting and torch's dtype promotion, comparisons, bitwise ops, casts, operators."""

from __future__ import annotations

import builtins
import math
from typing import TYPE_CHECKING, Any, Callable

from zeptograd.dtype import DType, DTypeLike, dtypes, least_upper_dtype, least_upper_float, to_dtype
from zeptograd.gradient import with_gradient
from zeptograd.helpers import ArgumentError, ArgumentTypeError
from zeptograd.schedule.fold import const_broadcast
from zeptograd.tensor.helpers import PY_CONST, broadcast_shape
from zeptograd.uop import variable
from zeptograd.uop.ops import Ops, UOp
from zeptograd.uop.variable import is_sint, sint_arg

if TYPE_CHECKING:
    from zeptograd.tensor import Tensor


_COMPARISONS = frozenset((Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ))  # (their result is bool)
_PY_NUMBERS = frozenset((float, int, bool))
# the most common ops as globals (on 3.11 an Ops.X read goes through the enum metaclass's getattr hook: uop/ops.py)
_ADD, _MUL = Ops.ADD, Ops.MUL


def _operator(op: Ops) -> Callable[[Any, Any], Tensor]:
    """`self <op> x` for a Python operator: _binary's common case (one shape, dtype and device) inline, one call
    fewer than through _binary, which takes every other case."""

    def operator(self, x):
        if (
            type(x) is type(self)
            and (u := self.uop).shape == (v := x.uop).shape
            and u.dtype is v.dtype
            and self.device == x.device
            and type(self.device) is str
        ):
            return self._new(UOp(op, u.dtype, (u, v)))
        return self._binary(op, x)

    return operator


def _category(dt: DType) -> int:
    return 0 if dt == dtypes.bool else 1 if dtypes.is_int(dt) else 2


def result_dtype(a: Tensor, b: Tensor) -> DType:
    """torch's rule: a 0-d tensor beside a dimensioned one only counts if it is of a higher kind (bool<int<float)."""
    if (a.ndim == 0) != (b.ndim == 0):
        dim, zero = (a, b) if b.ndim == 0 else (b, a)
        return dim.dtype if _category(zero.dtype) <= _category(dim.dtype) else zero.dtype
    return least_upper_dtype(a.dtype, b.dtype)


def scalar_dtype(x: bool | int | float, dt: DType) -> DType:
    """The dtype of `tensor op x` for a Python scalar x: x only lifts the kind (as torch's weak scalars)."""
    if isinstance(x, float) and not dtypes.is_float(dt):
        return dtypes.default_float
    if isinstance(x, int) and not isinstance(x, bool) and dt == dtypes.bool:
        return dtypes.int64
    return dt


def _pow_grad(g: Tensor, out: Tensor, base: Tensor, e: Tensor) -> tuple[Tensor, Tensor]:
    """torch's pow_backward_self and pow_backward_exponent."""
    d_base = (e == 0).where(0.0, g * (e * base.pow(e - 1)))
    return d_base, g * ((base == 0) & (e >= 0)).where(0.0, out * base.log())


class ElementwiseMixin:
    __slots__ = ()

    def _scalar(self: Tensor, x, dtype: DType) -> Tensor:
        return type(self)(const_broadcast(x, dtype, self.device, ()), device=self.device)

    def _operands(self: Tensor, x, reverse: bool = False) -> tuple[Tensor, Tensor]:
        """Both operands of a binary op, in one dtype (promoted as torch does) and broadcast to one shape."""
        if type(x) in _PY_NUMBERS and type(self.device) is str and not variable.in_use:
            # a Python number on one device, int sizes: the constant built at once at this tensor's shape (the same
            # nodes as a 0-d Tensor of it broadcast, without the Tensors and checks between)
            dt = scalar_dtype(x, self.dtype)
            a = self.cast(dt)
            other = a._new(const_broadcast(x, dt, self.device, a.uop.shape))  # (int sizes)
            return (other, a) if reverse else (a, other)
        if type(x) is type(self) and self.uop.dtype is x.uop.dtype and not variable.in_use:
            # (one dtype, int sizes: result_dtype's answer is that dtype, the casts are no-ops)
            a, b = (x, self) if reverse else (self, x)
            shape = broadcast_shape(a.uop.shape, b.uop.shape)
            return a._expand_to(shape), b._expand_to(shape)
        if isinstance(x, type(self)):
            dt, other = result_dtype(self, x), x
        elif isinstance(x, PY_CONST):
            x = x.item() if hasattr(x, "item") else x
            dt = scalar_dtype(x, self.dtype)
            other = self._scalar(x, dt)
        elif isinstance(x, UOp) and is_sint(x):  # a bound Variable (or an expression of them): an int scalar
            dt = scalar_dtype(1, self.dtype)
            other = self._scalar(sint_arg(x, "a Tensor operand"), dt)
        else:
            raise ArgumentTypeError(f"unsupported operand type {type(x).__name__} for a Tensor op")
        a, b = (other, self) if reverse else (self, other)
        shape = broadcast_shape(a.shape, b.shape)
        if variable.in_use:  # (a symbolic size: reshape's canonical form of it)
            return a.cast(dt)._broadcast_to(shape), b.cast(dt)._broadcast_to(shape)
        return a.cast(dt)._expand_to(shape), b.cast(dt)._expand_to(shape)

    def _expand_to(self: Tensor, shape: tuple[int, ...]) -> Tensor:
        """_broadcast_to a shape of ints that broadcast_shape gave for this tensor's (the same nodes, no checks)."""
        u = self.uop
        if u.shape == shape:
            return self
        t = self
        if len(u.shape) < len(shape):
            t = self._new(UOp(Ops.RESHAPE, u.dtype, (u,), (1,) * (len(shape) - len(u.shape)) + u.shape))
        return t if t.uop.shape == shape else t._new(UOp(Ops.EXPAND, u.dtype, (t.uop,), shape))

    def _broadcast_to(self: Tensor, shape: tuple[int, ...]) -> Tensor:
        if self.shape == tuple(shape):
            return self
        if len(shape) < self.ndim:
            raise ArgumentError(f"can't broadcast shape {self.shape} to {tuple(shape)}")
        broadcast_shape(self.shape, shape)  # raises a clear error if they don't broadcast
        return self.reshape((1,) * (len(shape) - self.ndim) + self.shape).expand(shape)

    def _alu(self: Tensor, op: Ops, *srcs: Tensor, dtype: DType | None = None) -> Tensor:
        """The elementwise op of this tensor and `srcs`: every op of several tensors (binary, where, and those built
        of them: matmul, cat, indexing, ...) comes here, so this is where tensors on different devices are refused
        (as torch does: a kernel reads one device's memory)."""
        uops = [self.uop]
        for s in srcs:
            if s.device != self.device:
                raise ArgumentError(f"tensors on different devices: {self.device} and {s.device}")
            uops.append(s.uop)
        return self._new(UOp(op, dtype or self.dtype, tuple(uops)))

    def _binary(self: Tensor, op: Ops, x, reverse: bool = False) -> Tensor:
        if (
            type(x) is type(self)
            and (u := self.uop).shape == (v := x.uop).shape
            and u.dtype is v.dtype
            and self.device == x.device
            and type(self.device) is str
        ):  # the common case: one shape, dtype and device, so nothing to promote, broadcast or refuse
            out = dtypes.bool if op in _COMPARISONS else u.dtype
            return self._new(UOp(op, out, (v, u) if reverse else (u, v)))
        a, b = self._operands(x, reverse)
        return a._alu(op, b, dtype=dtypes.bool if op in _COMPARISONS else a.dtype)

    def _float(self: Tensor) -> Tensor:
        return self.cast(least_upper_float(self.dtype))

    # ***** arithmetic *****
    def add(self: Tensor, x, reverse: bool = False) -> Tensor:
        return self._binary(_ADD, x, reverse)

    def sub(self: Tensor, x, reverse: bool = False) -> Tensor:
        a, b = self._operands(x, reverse)
        if a.dtype == dtypes.bool:
            raise ArgumentTypeError("subtracting bool tensors is not supported; use logical_xor or cast first")
        return a._alu(Ops.SUB, b)

    def mul(self: Tensor, x, reverse: bool = False) -> Tensor:
        return self._binary(_MUL, x, reverse)

    def div(self: Tensor, x, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
        a, b = self._operands(x, reverse)
        if rounding_mode == "trunc":
            return a._alu(Ops.IDIV, b) if dtypes.is_int(a.dtype) else (a / b).trunc()
        if rounding_mode == "floor":
            return a._floordiv(b)
        if rounding_mode is not None:
            raise ArgumentError(f"rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
        return a._float()._alu(Ops.FDIV, b._float())

    def _floordiv(self: Tensor, b: Tensor) -> Tensor:
        if not dtypes.is_int(self.dtype):
            return (self / b).floor()
        q = self._alu(Ops.IDIV, b)
        inexact = self._alu(Ops.MOD, b) != 0
        return (inexact & ((self < 0) != (b < 0))).where(q - 1, q)

    def mod(self: Tensor, x, reverse: bool = False) -> Tensor:
        """Python's %: the result has the sign of the divisor (torch.remainder)."""
        a, b = self._operands(x, reverse)
        r = a._fmod(b)
        return ((r != 0) & ((r < 0) != (b < 0))).where(r + b, r)

    def fmod(self: Tensor, x) -> Tensor:
        """C's fmod: the result has the sign of the dividend."""
        a, b = self._operands(x)
        return a._fmod(b)

    def _fmod(self: Tensor, b: Tensor) -> Tensor:
        return self._alu(Ops.MOD, b) if dtypes.is_int(self.dtype) else self - b * (self / b).trunc()

    def pow(self: Tensor, x, reverse: bool = False) -> Tensor:
        """torch.pow: C's pow at 0, inf, nan and negative bases, and torch's gradients there (gradient.py's
        `with_gradient`: d/dbase = e * base**(e-1), 0 where e == 0; d/de = out * log(base), 0 at base 0, e >= 0)."""
        x = x.item() if isinstance(x, PY_CONST) and hasattr(x, "item") else x
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            if reverse:
                return self._rpow_scalar(x)
            if dtypes.is_float(self.dtype) or isinstance(x, float):
                return self._float()._pow_scalar(float(x))
            if 0 <= x <= 64:
                return self._int_pow(x)
            if x < 0:
                raise ArgumentError("integers to negative integer powers are not allowed")
        a, b = self._operands(x, reverse)
        if not dtypes.is_float(a.dtype):
            return a.cast(dtypes.float64)._pow_float(b.cast(dtypes.float64)).round().cast(a.dtype)
        return with_gradient(a._pow_float(b), (a, b), _pow_grad)

    def _pow_scalar(self: Tensor, c: float) -> Tensor:
        """A float tensor to a constant power, by torch's special cases (x*x for 2, sqrt for 0.5, ...)."""
        if c == 0:
            ret = self.isnan().where(1.0, 1.0).cast(self.dtype)  # 1, still a function of self (its gradient is 0)
        elif c == 1:
            ret = self * 1.0  # a node of its own, which the gradient rule below can own
        elif c in (0.5, -0.5):
            ret = self.sqrt() if c > 0 else self.rsqrt()
        elif c.is_integer() and abs(c) <= 64:
            ret = self._int_pow(int(abs(c)))
            ret = ret.reciprocal() if c < 0 else ret
        else:
            ret = self._pow_float(self._scalar(c, self.dtype)._broadcast_to(self.shape))
        return with_gradient(ret, (self,), lambda g, out, x: (g.zeros_like() if c == 0 else g * (c * x.pow(c - 1)),))

    def _rpow_scalar(self: Tensor, c: int | float) -> Tensor:
        """c ** self for a Python number c: d/dself = out * log(c) (0 where c is 0 and self >= 0)."""
        dt = scalar_dtype(c, self.dtype)
        if not dtypes.is_float(dt):
            a, b = self._operands(c, True)
            return a.cast(dtypes.float64)._pow_float(b.cast(dtypes.float64)).round().cast(dt)
        e = self.cast(dt)
        if c == 1:
            ret = e.isnan().where(1.0, 1.0).cast(dt)  # 1 ** nan is 1, as C's pow
        else:
            ret = self._scalar(c, dt)._broadcast_to(e.shape)._pow_float(e)
        log_c = math.log(c) if c > 0 else -math.inf if c == 0 else math.nan

        def rule(g: Tensor, out: Tensor, e: Tensor) -> tuple:
            grad = out * log_c
            return (g * ((e >= 0).where(0.0, grad) if c == 0 else grad),)

        return with_gradient(ret, (e,), rule)

    def _int_pow(self: Tensor, n: int) -> Tensor:
        ret, base = None, self
        while n:  # square and multiply
            if n & 1:
                ret = base if ret is None else ret * base
            n >>= 1
            if n:
                base = base * base
        return self.ones_like() if ret is None else ret

    def _pow_float(self: Tensor, e: Tensor) -> Tensor:
        """C's pow for a float base and exponent of one shape: |b|**e = exp2(e * log2|b|), then the special cases."""
        mag = (e * self.abs().log2()).exp2()
        mag = (self.abs() == 1).where(1.0, mag)  # (+-1) ** +-inf is 1, not exp2(inf * 0)
        e_int = (e.trunc() == e) & (e.abs() != math.inf)
        odd = e_int & ((e * 0.5).trunc() * 2 != e)
        neg = (self < 0) | ((self == 0) & (self.reciprocal() < 0))  # -0.0 too: (-0.0) ** -1 is -inf
        # a negative base: the sign of an odd power; a non-integer power is nan, but not for -inf and -0.0 (0 or inf)
        # nor for an infinite power (|b| ** +-inf is 0, 1 or inf)
        unsigned = (self.abs() == math.inf) | (self == 0) | (e.abs() == math.inf)
        at_neg = e_int.where(odd.where(-mag, mag), unsigned.where(mag, math.nan))
        return ((e == 0) | (self == 1)).where(1.0, neg.where(at_neg, mag))

    def neg(self: Tensor) -> Tensor:
        return self.logical_not() if self.dtype == dtypes.bool else self._alu(Ops.NEG)

    def maximum(self: Tensor, x) -> Tensor:
        return self._binary(Ops.MAX, x)

    def minimum(self: Tensor, x) -> Tensor:
        a, b = self._operands(x)
        if dtypes.is_float(a.dtype):
            return -((-a).maximum(-b))
        return (a < b).where(a, b)

    def where(self: Tensor, x, y) -> Tensor:
        if isinstance(x, type(self)):
            a, b = x._operands(y)
        elif isinstance(y, type(self)):
            b, a = y._operands(x)
        else:
            dt = dtypes.from_py([x, y])
            a, b = self._scalar(x, dt), self._scalar(y, dt)
        shape = broadcast_shape(self.shape, a.shape, b.shape)
        cond = self.cast(dtypes.bool)._broadcast_to(shape)
        return cond._alu(Ops.WHERE, a._broadcast_to(shape), b._broadcast_to(shape), dtype=a.dtype)

    def lerp(self: Tensor, end: Tensor, weight) -> Tensor:
        return self + (end - self) * weight

    # ***** casts *****
    def cast(self: Tensor, dtype: DTypeLike) -> Tensor:
        if dtype is self.uop.dtype:  # (the common case: nothing to cast)
            return self
        dt = to_dtype(dtype)
        if dt == self.dtype:
            return self
        if dtypes.is_float(self.dtype) and dtypes.is_int(dt) and dt != dtypes.bool:
            return self._float_to_int(dt)
        return self._new(UOp(Ops.CAST, dt, (self.uop,)))

    def _float_to_int(self: Tensor, dt: DType) -> Tensor:
        """torch's float -> int conversion, defined for every value (x86's: nan and values out of range give
        INT_MIN of int32 or int64; narrower types wrap from int32, uint32 from int64 (torch's and numpy's scalar
        path; their vector path differs); uint64 converts x - 2**63 above 2**63 and sets the top bit, as gcc).
        C and LLVM leave an out-of-range conversion undefined (LLVM: poison), so the kernel only converts values
        in range, chosen by a select before the CAST."""
        x = self if self.dtype.itemsize >= 4 else self.cast(dtypes.float32)  # (half: 2**31 is inf)

        def convert(v: Tensor, to: DType) -> Tensor:
            return v._new(UOp(Ops.CAST, to, (v.uop,)))

        def to_signed(v: Tensor, bits: int) -> Tensor:  # to int32 or int64; nan and out of range: INT_MIN
            lo = -(2.0 ** (bits - 1))
            return convert(((v >= lo) & (v < -lo)).where(v, lo), dtypes.int64 if bits == 64 else dtypes.int32)

        if dt == dtypes.uint64:  # above 2**63: convert x - 2**63 and set the top bit
            top = 2.0**63
            return convert((x >= top).where(to_signed(x - top, 64) ^ -(2**63), to_signed(x, 64)), dt)
        wide = to_signed(x, 64 if dt.itemsize == 8 or dt == dtypes.uint32 else 32)
        return wide if wide.dtype == dt else convert(wide, dt)

    def bitcast(self: Tensor, dtype: DTypeLike) -> Tensor:
        dt = to_dtype(dtype)
        if dt.itemsize != self.dtype.itemsize or dtypes.bool in (dt, self.dtype):
            raise ArgumentTypeError(f"bitcast needs dtypes of equal size (and not bool): {self.dtype} -> {dt}")
        return self if dt == self.dtype else self._new(UOp(Ops.BITCAST, dt, (self.uop,)))

    def float(self: Tensor) -> Tensor:
        return self.cast(dtypes.float32)

    def half(self: Tensor) -> Tensor:
        return self.cast(dtypes.float16)

    def bfloat16(self: Tensor) -> Tensor:
        return self.cast(dtypes.bfloat16)

    def double(self: Tensor) -> Tensor:
        return self.cast(dtypes.float64)

    def int(self: Tensor) -> Tensor:
        return self.cast(dtypes.int32)

    def long(self: Tensor) -> Tensor:
        return self.cast(dtypes.int64)

    def short(self: Tensor) -> Tensor:
        return self.cast(dtypes.int16)

    def char(self: Tensor) -> Tensor:
        return self.cast(dtypes.int8)

    def byte(self: Tensor) -> Tensor:
        return self.cast(dtypes.uint8)

    def bool(self: Tensor) -> Tensor:
        return self.cast(dtypes.bool)

    # ***** comparisons *****
    def __lt__(self: Tensor, x):
        return self._binary(Ops.CMPLT, x)

    def __gt__(self: Tensor, x):
        return self._binary(Ops.CMPLT, x, reverse=True)

    def __le__(self: Tensor, x):
        a, b = self._operands(x)
        return (a < b) | a.eq(b)

    def __ge__(self: Tensor, x):
        a, b = self._operands(x)
        return (b < a) | a.eq(b)

    def eq(self: Tensor, x) -> Tensor:
        return self._binary(Ops.CMPEQ, x)

    def ne(self: Tensor, x) -> Tensor:
        return self._binary(Ops.CMPNE, x)

    def __eq__(self: Tensor, x):
        return self.eq(x)

    def __ne__(self: Tensor, x):
        return self.ne(x)

    # ***** bitwise (bools and ints) *****
    def _bitwise(self: Tensor, op: Ops, x, reverse: builtins.bool = False) -> Tensor:
        a, b = self._operands(x, reverse)
        if dtypes.is_float(a.dtype):
            raise ArgumentTypeError(f"bitwise {op.name} needs integer or bool tensors, got {a.dtype}")
        return a._alu(op, b)

    def bitwise_and(self: Tensor, x, reverse: builtins.bool = False) -> Tensor:
        return self._bitwise(Ops.AND, x, reverse)

    def bitwise_or(self: Tensor, x, reverse: builtins.bool = False) -> Tensor:
        return self._bitwise(Ops.OR, x, reverse)

    def bitwise_xor(self: Tensor, x, reverse: builtins.bool = False) -> Tensor:
        return self._bitwise(Ops.XOR, x, reverse)

    def lshift(self: Tensor, x, reverse: builtins.bool = False) -> Tensor:
        return self._shift(Ops.SHL, x, reverse)

    def rshift(self: Tensor, x, reverse: builtins.bool = False) -> Tensor:
        return self._shift(Ops.SHR, x, reverse)

    def _shift(self: Tensor, op: Ops, x, reverse: builtins.bool) -> Tensor:
        """A shift by a count outside [0, bits) as torch defines it: `<<` gives 0, `>>` the sign fill (0 or -1).
        The kernel never shifts by such a count (undefined in C and LLVM, taken modulo bits by OpenCL)."""
        a, b = self._operands(x, reverse)
        if a.dtype == dtypes.bool or dtypes.is_float(a.dtype):
            return a._bitwise(op, b)
        bits = a.dtype.itemsize * 8
        signed_shr = op is Ops.SHR and not dtypes.is_unsigned(a.dtype)
        fill = a._alu(Ops.SHR, a._scalar(bits - 1, a.dtype)._broadcast_to(a.shape)) if signed_shr else a * 0
        if not reverse and isinstance(x, int) and not isinstance(x, builtins.bool):  # a constant count: no select
            return a._alu(op, b) if 0 <= x < bits else fill
        in_range = (b >= 0) & (b < bits)
        return in_range.where(a._alu(op, in_range.where(b, 0)), fill)

    def bitwise_not(self: Tensor) -> Tensor:
        if dtypes.is_float(self.dtype):
            raise ArgumentTypeError(f"bitwise_not needs integer or bool tensors, got {self.dtype}")
        return self.logical_not() if self.dtype == dtypes.bool else self ^ -1

    def logical_not(self: Tensor) -> Tensor:
        return self.cast(dtypes.bool)._alu(
            Ops.CMPNE, self._scalar(True, dtypes.bool)._broadcast_to(self.shape), dtype=dtypes.bool
        )

    def logical_and(self: Tensor, x) -> Tensor:
        return self.bool() & (x.bool() if isinstance(x, type(self)) else bool(x))

    def logical_or(self: Tensor, x) -> Tensor:
        return self.bool() | (x.bool() if isinstance(x, type(self)) else bool(x))

    def logical_xor(self: Tensor, x) -> Tensor:
        return self.bool() ^ (x.bool() if isinstance(x, type(self)) else bool(x))

    # ***** Python operators *****
    __add__: Callable[[Any, Any], Tensor] = _operator(_ADD)  # `a + b` is the most common op of all

    def __radd__(self, x):
        return self._binary(_ADD, x, True)

    def __sub__(self, x):
        return self.sub(x)

    def __rsub__(self, x):
        return self.sub(x, True)

    __mul__: Callable[[Any, Any], Tensor] = _operator(_MUL)

    def __rmul__(self, x):
        return self._binary(_MUL, x, True)

    def __truediv__(self, x):
        return self.div(x)

    def __rtruediv__(self, x):
        return self.div(x, True)

    def __floordiv__(self, x):
        return self.div(x, rounding_mode="floor")

    def __rfloordiv__(self, x):
        return self.div(x, True, rounding_mode="floor")

    def __mod__(self, x):
        return self.mod(x)

    def __rmod__(self, x):
        return self.mod(x, True)

    def __pow__(self, x):
        return self.pow(x)

    def __rpow__(self, x):
        return self.pow(x, True)

    def __neg__(self):
        return self.neg()

    def __pos__(self):
        return self

    def __abs__(self):
        return self.abs()

    def __and__(self, x):
        return self.bitwise_and(x)

    def __rand__(self, x):
        return self.bitwise_and(x, True)

    def __or__(self, x):
        return self.bitwise_or(x)

    def __ror__(self, x):
        return self.bitwise_or(x, True)

    def __xor__(self, x):
        return self.bitwise_xor(x)

    def __rxor__(self, x):
        return self.bitwise_xor(x, True)

    def __lshift__(self, x):
        return self.lshift(x)

    def __rlshift__(self, x):
        return self.lshift(x, True)

    def __rshift__(self, x):
        return self.rshift(x)

    def __rrshift__(self, x):
        return self.rshift(x, True)

    def __invert__(self):
        return self.bitwise_not()

    # in place: the same Tensor object takes the new value (lazily, through assign)
    def __iadd__(self, x):
        return self.assign(self.add(x))

    def __isub__(self, x):
        return self.assign(self.sub(x))

    def __imul__(self, x):
        return self.assign(self.mul(x))

    def __itruediv__(self, x):
        return self.assign(self.div(x))

    def __ifloordiv__(self, x):
        return self.assign(self.__floordiv__(x))

    def __imod__(self, x):
        return self.assign(self.mod(x))

    def __ipow__(self, x):
        return self.assign(self.pow(x))

    def __iand__(self, x):
        return self.assign(self.bitwise_and(x))

    def __ior__(self, x):
        return self.assign(self.bitwise_or(x))

    def __ixor__(self, x):
        return self.assign(self.bitwise_xor(x))

    def __ilshift__(self, x):
        return self.assign(self.lshift(x))

    def __irshift__(self, x):
        return self.assign(self.rshift(x))

    def __imatmul__(self, x):
        return self.assign(self.matmul(x))
