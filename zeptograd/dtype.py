"""Data types, the promotion lattice, and conversions to and from numpy and Python values."""

from __future__ import annotations

import builtins
import functools
import math
import struct
from dataclasses import dataclass, field
from typing import Union

import numpy as np

from zeptograd.helpers import ArgumentTypeError


@dataclass(frozen=True, eq=False)
class DType:
    """A scalar, vector or pointer type. Instances are unique (vec/ptr are cached), so `==` is identity."""

    priority: int  # orders dtypes of the same kind; larger is wider
    itemsize: int  # bytes of one scalar
    name: str
    fmt: str | None  # struct format character, None where struct has none (bfloat16)
    count: int = 1  # vector width: >1 is a vector of `count` scalars
    _scalar: DType | None = None
    scalar: DType = field(init=False, repr=False)  # the element type (itself for a scalar); an attribute: read often

    def __post_init__(self):
        object.__setattr__(self, "scalar", self._scalar if self._scalar is not None else self)

    @functools.cache
    def vec(self, n: int) -> DType:
        assert self.count == 1, f"can't vectorize {self}"
        return self if n == 1 else DType(self.priority, self.itemsize * n, f"{self.name}{n}", None, n, self)

    def ptr(self, size: int = -1, local: bool = False) -> PtrDType:
        return _ptr(self, size, local)

    def __reduce__(self):
        if self._scalar is not None:
            return (DType.vec, (self._scalar, self.count))
        return (getattr, (dtypes, self.name))

    @property
    def nbytes_scalar(self) -> int:
        return self.scalar.itemsize

    @property
    def min(self):
        """The smallest value (-inf for floats), as tinygrad's `dtypes.int8.min`; the same as `dtypes.min(d)`."""
        return dtypes.min(self)

    @property
    def max(self):
        """The largest value (inf for floats), as tinygrad's `dtypes.uint8.max`; the same as `dtypes.max(d)`."""
        return dtypes.max(self)

    def __repr__(self):
        return f"dtypes.{self.name}"

    def __lt__(self, other: DType) -> bool:
        return (self.priority, self.itemsize, self.name) < (other.priority, other.itemsize, other.name)


@dataclass(frozen=True, eq=False)
class PtrDType(DType):
    base: DType = field(kw_only=True)  # what the pointer points to
    size: int = field(default=-1, kw_only=True)  # number of elements, -1 when unknown
    local: bool = field(default=False, kw_only=True)  # GPU shared memory

    def __repr__(self):
        return f"{self.base}.ptr({self.size})"

    def __reduce__(self):
        return (_ptr, (self.base, self.size, self.local))


@functools.cache
def _ptr(base: DType, size: int, local: bool) -> PtrDType:
    return PtrDType(
        base.priority, base.itemsize, base.name, base.fmt, base.count, base._scalar, base=base, size=size, local=local
    )


DTypeLike = Union[str, DType]


class dtypes:
    void = DType(-1, 0, "void", None)
    bool = DType(0, 1, "bool", "?")
    int8 = DType(1, 1, "char", "b")
    uint8 = DType(2, 1, "uchar", "B")
    int16 = DType(3, 2, "short", "h")
    uint16 = DType(4, 2, "ushort", "H")
    int32 = DType(5, 4, "int", "i")
    uint32 = DType(6, 4, "uint", "I")
    int64 = DType(7, 8, "long", "q")
    uint64 = DType(8, 8, "ulong", "Q")
    float16 = DType(9, 2, "half", "e")
    bfloat16 = DType(10, 2, "bfloat16", None)
    float32 = DType(11, 4, "float", "f")
    float64 = DType(12, 8, "double", "d")
    # aliases
    half, float, double, int, long = float16, float32, float64, int32, int64
    char, uchar, short, ushort, uint, ulong = int8, uint8, int16, uint16, uint32, uint64
    default_float: DType = float32
    default_int: DType = int32
    index = int32  # the dtype of index arithmetic

    ints = (int8, int16, int32, int64, uint8, uint16, uint32, uint64)
    uints = (uint8, uint16, uint32, uint64)
    floats = (float16, bfloat16, float32, float64)
    all = (bool, int8, uint8, int16, uint16, int32, uint32, int64, uint64, float16, bfloat16, float32, float64)

    @staticmethod
    def is_float(x: DType) -> builtins.bool:  # plain `bool` in this class is dtypes.bool
        return x.scalar in _FLOATS

    @staticmethod
    def is_int(x: DType) -> builtins.bool:
        return x.scalar in _INTS

    @staticmethod
    def is_unsigned(x: DType) -> builtins.bool:
        return x.scalar in _UINTS

    @staticmethod
    def is_bool(x: DType) -> builtins.bool:
        return x.scalar == dtypes.bool

    @staticmethod
    def from_py(x) -> DType:
        if isinstance(x, (bool, np.bool_)):
            return dtypes.bool
        if isinstance(x, (int, np.integer)):  # an int past int32 (arange(2**31 + 8)'s stop) needs int64
            return dtypes.default_int if -(2**31) <= x < 2**31 or dtypes.default_int.itemsize == 8 else dtypes.int64
        if isinstance(x, (float, np.floating)):
            return dtypes.default_float
        if isinstance(x, (list, tuple)):
            return max((dtypes.from_py(e) for e in x), default=dtypes.default_float)
        raise ArgumentTypeError(f"can't infer a dtype from Python value {x!r} of type {type(x).__name__}")

    @staticmethod
    def min(d: DType):
        return _limits(d.scalar)[0]

    @staticmethod
    def max(d: DType):
        return _limits(d.scalar)[1]


# membership sets of the kinds (a DType hashes by identity: a set lookup, not a scan of the tuple)
_INTS, _UINTS, _FLOATS = frozenset(dtypes.ints), frozenset(dtypes.uints), frozenset(dtypes.floats)


@functools.cache
def _limits(d: DType) -> tuple:
    """(smallest, largest) value of scalar dtype d: asked for every constant and value range built."""
    if d in _INTS:
        if d in _UINTS:
            return 0, 2 ** (8 * d.itemsize) - 1
        return -(2 ** (8 * d.itemsize - 1)), 2 ** (8 * d.itemsize - 1) - 1
    return (False, True) if d == dtypes.bool else (-math.inf, math.inf)


_INT_LIMITS = {d: _limits(d) for d in dtypes.ints}  # scalar ints only (a vector's itemsize is its whole width)
_by_name = {n: d for n, d in vars(dtypes).items() if isinstance(d, DType)}


def to_dtype(x: DTypeLike) -> DType:
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in _by_name:
        return _by_name[x]
    raise ArgumentTypeError(
        f"unknown dtype {x!r}; use one of zeptograd.dtypes ({', '.join(d.name for d in dtypes.all)})"
    )


# promotion as in tinygrad / PyTorch: the least upper bound of two dtypes in this lattice
_promo_lattice = {
    dtypes.bool: [dtypes.int8, dtypes.uint8],
    dtypes.int8: [dtypes.int16],
    dtypes.int16: [dtypes.int32],
    dtypes.int32: [dtypes.int64],
    dtypes.int64: [dtypes.float16, dtypes.bfloat16],
    dtypes.uint8: [dtypes.int16, dtypes.uint16],
    dtypes.uint16: [dtypes.int32, dtypes.uint32],
    dtypes.uint32: [dtypes.int64, dtypes.uint64],
    dtypes.uint64: [dtypes.float16, dtypes.bfloat16],
    dtypes.float16: [dtypes.float32],
    dtypes.bfloat16: [dtypes.float32],
    dtypes.float32: [dtypes.float64],
}


@functools.cache
def _upper_set(d: DType) -> frozenset[DType]:
    return frozenset([d]).union(*[_upper_set(u) for u in _promo_lattice.get(d, [])])


@functools.cache
def least_upper_dtype(*ds: DType) -> DType:
    common = frozenset.intersection(*[_upper_set(d) for d in ds])
    return min(common) if common else dtypes.float64


def least_upper_float(d: DType) -> DType:
    return d if dtypes.is_float(d) else least_upper_dtype(d, dtypes.default_float)


def sum_acc_dtype(d: DType) -> DType:
    """The dtype a sum accumulates in: ints and bools in int64 (as torch returns), half floats in float32."""
    if dtypes.is_unsigned(d) and d.itemsize == 8:
        return dtypes.uint64
    if dtypes.is_int(d) or d == dtypes.bool:
        return dtypes.int64
    if d in (dtypes.float16, dtypes.bfloat16):
        return dtypes.float32
    return d


_np_to_dtype = {
    np.dtype(np.bool_): dtypes.bool,
    np.dtype(np.int8): dtypes.int8,
    np.dtype(np.uint8): dtypes.uint8,
    np.dtype(np.int16): dtypes.int16,
    np.dtype(np.uint16): dtypes.uint16,
    np.dtype(np.int32): dtypes.int32,
    np.dtype(np.uint32): dtypes.uint32,
    np.dtype(np.int64): dtypes.int64,
    np.dtype(np.uint64): dtypes.uint64,
    np.dtype(np.float16): dtypes.float16,
    np.dtype(np.float32): dtypes.float32,
    np.dtype(np.float64): dtypes.float64,
}
_dtype_to_np = {v: k for k, v in _np_to_dtype.items()}
_dtype_to_np[dtypes.bfloat16] = np.dtype(np.uint16)  # stored as raw bits; converted in to_numpy


def from_numpy_dtype(d: np.dtype) -> DType:
    if d not in _np_to_dtype:
        raise ArgumentTypeError(
            f"numpy dtype {d} is not supported; supported: {', '.join(str(k) for k in _np_to_dtype)}"
        )
    return _np_to_dtype[d]


def to_numpy_dtype(d: DType) -> np.dtype:
    return _dtype_to_np[d.scalar]


_F32 = struct.Struct("f")


def truncate(d: DType, x):
    """A Python value as a scalar of dtype `d` would hold it (wraparound for ints, rounding for floats)."""
    if type(x) is int and (lim := _INT_LIMITS.get(d)) is not None and lim[0] <= x <= lim[1]:
        return x  # the common case, an index constant: it fits, nothing wraps
    if d == dtypes.bool:
        return bool(x)
    if dtypes.is_int(d):
        if isinstance(x, float):
            if math.isnan(x) or math.isinf(x):
                return 0
            x = math.trunc(x)
        x = int(x) & ((1 << (8 * d.itemsize)) - 1)
        if not dtypes.is_unsigned(d) and x >= 1 << (8 * d.itemsize - 1):
            x -= 1 << (8 * d.itemsize)
        return x
    x = float(x)
    if d == dtypes.float32:  # C's double -> float rounding, as numpy's; struct refuses what rounds past the range
        try:
            return _F32.unpack(_F32.pack(x))[0]
        except OverflowError:
            pass  # numpy's inf, below
    if d in (dtypes.float32, dtypes.float16):
        with np.errstate(over="ignore"):
            return float(to_numpy_dtype(d).type(x))
    if d == dtypes.bfloat16:
        bits = struct.unpack("I", struct.pack("f", x))[0]
        if not math.isnan(x):
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even
        return struct.unpack("f", struct.pack("I", bits & 0xFFFF0000))[0]
    return x
