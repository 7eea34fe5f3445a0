"""Tensor: the user's API. Every op builds a tensor-graph UOp; nothing runs until a result is needed."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from zeptograd.device import Device
from zeptograd.dtype import (
    DType,
    DTypeLike,
    dtypes,
    from_numpy_dtype,
    least_upper_dtype,
    least_upper_float,
    sum_acc_dtype,
    to_dtype,
    to_numpy_dtype,
)
from zeptograd.engine.buffers import buffers, new_buffer_uop, reshape_uop
from zeptograd.helpers import prod
from zeptograd.schedule.fold import const_broadcast
from zeptograd.uop.ops import Ops, UOp

ConstType = float | int | bool


def _normalize_axis(axis: int, ndim: int, what: str = "axis") -> int:
    lo, hi = (-ndim, ndim - 1) if ndim > 0 else (-1, 0)
    if not isinstance(axis, int) or not lo <= axis <= hi:
        raise IndexError(f"{what} {axis} is out of range for a tensor of {ndim} dimension(s) (expected {lo}..{hi})")
    return axis + ndim if axis < 0 else axis


def _broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    nd = max(len(s) for s in shapes)
    padded = [(1,) * (nd - len(s)) + tuple(s) for s in shapes]
    out = []
    for dims in zip(*padded):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise ValueError(f"shapes {' and '.join(str(tuple(s)) for s in shapes)} do not broadcast "
                             f"(sizes {sorted(sizes)} meet in one dimension)")
        out.append(sizes.pop() if sizes else (0 if 0 in dims else 1))
    return tuple(out)


_rng_state = {"seed": 0, "counter": 0}


class Tensor:
    """A lazy n-dimensional array. Ops build a graph; `realize()`, `numpy()`, `item()`, `tolist()` run it."""

    __slots__ = ("uop", "device", "requires_grad", "grad", "__weakref__")

    def __init__(self, data: Any, device: str | None = None, dtype: DTypeLike | None = None,
                 requires_grad: bool | None = None):
        device = Device.canonicalize(device)
        dtype = to_dtype(dtype) if dtype is not None else None
        self.requires_grad, self.grad = requires_grad, None
        if isinstance(data, UOp):
            self.uop, self.device = data, device
            return
        if isinstance(data, Tensor):
            data = data.numpy()
        if isinstance(data, (bool, int, float, np.bool_, np.integer, np.floating)) and not isinstance(data, np.ndarray):
            dt = dtype or (from_numpy_dtype(np.asarray(data).dtype) if isinstance(data, np.generic)
                           else dtypes.from_py(data))
            self.uop, self.device = const_broadcast(data, dt, device, ()), device
            return
        if isinstance(data, (list, tuple)):
            dt = dtype or dtypes.from_py(data) if len(data) else (dtype or dtypes.default_float)
            try:
                arr = np.array(data, dtype=to_numpy_dtype(dt))
            except ValueError as e:
                raise ValueError(f"can't make a tensor from a ragged or mixed nested list: {e}") from None
        elif isinstance(data, np.ndarray):
            if data.dtype == object or data.dtype.kind in "cUSVOMm":
                raise TypeError(f"numpy dtype {data.dtype} is not supported by zeptograd "
                                f"(supported: bool, int8..int64, uint8..uint64, float16, float32, float64)")
            dt = dtype or from_numpy_dtype(data.dtype)
            arr = data.astype(to_numpy_dtype(dt)) if dt != dtypes.bfloat16 else data.astype(np.float32)
        else:
            raise TypeError(f"can't make a Tensor from {type(data).__name__}")
        if dt == dtypes.bfloat16:
            arr = (np.asarray(arr, np.float32).view(np.uint32) >> 16).astype(np.uint16)
        self.uop, self.device = _buffer_uop(arr, dt, device), device

    # ***** properties *****
    @property
    def shape(self) -> tuple[int, ...]:
        return self.uop.shape

    @property
    def dtype(self) -> DType:
        return self.uop.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return prod(self.shape)

    def element_size(self) -> int:
        return self.dtype.itemsize

    def nbytes(self) -> int:
        return self.numel() * self.element_size()

    def is_floating_point(self) -> bool:
        return dtypes.is_float(self.dtype)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[_normalize_axis(dim, self.ndim, "dim")]

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self):
        return f"<Tensor {self.shape} {self.dtype} on {self.device}>"

    def __hash__(self):
        return id(self)

    def __bool__(self):
        if self.numel() != 1:
            raise ValueError(f"the truth value of a tensor with shape {self.shape} is ambiguous; use .any() or .all()")
        return bool(self.item())

    # ***** running *****
    def schedule(self, *lst: Tensor) -> list:
        from zeptograd.engine.realize import schedule_tensors

        return schedule_tensors([self, *lst])

    def realize(self, *lst: Tensor) -> Tensor:
        from zeptograd.engine.realize import realize_tensors

        realize_tensors([self, *lst])
        return self

    def numpy(self) -> np.ndarray:
        from zeptograd.engine.realize import tensor_to_numpy

        return tensor_to_numpy(self)

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def item(self) -> ConstType:
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor with exactly one element, this one has shape {self.shape} "
                             f"({self.numel()} elements)")
        return self.numpy().reshape(()).item()

    def data(self) -> memoryview:
        return memoryview(self.numpy())

    def detach(self) -> Tensor:
        return self._new(UOp(Ops.DETACH, self.dtype, (self.uop,)))

    def contiguous(self) -> Tensor:
        return self._new(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))

    def clone(self) -> Tensor:
        return self.contiguous()

    def to(self, device: str | None) -> Tensor:
        device = Device.canonicalize(device)
        if device == self.device:
            return self
        return Tensor(self.numpy(), device=device)

    def _new(self, uop: UOp) -> Tensor:
        return Tensor(uop, device=self.device)

    # ***** creation *****
    @staticmethod
    def _shape_arg(shape: tuple) -> tuple[int, ...]:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        for s in shape:
            if not isinstance(s, (int, np.integer)) or s < 0:
                raise ValueError(f"a shape is made of non-negative ints, got {shape}")
        return tuple(int(s) for s in shape)

    @staticmethod
    def full(shape: tuple[int, ...] | int, fill_value: ConstType, dtype: DTypeLike | None = None,
             device: str | None = None) -> Tensor:
        shape = Tensor._shape_arg(shape if isinstance(shape, tuple) else (shape,))
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py(fill_value)
        device = Device.canonicalize(device)
        return Tensor(const_broadcast(fill_value, dt, device, shape), device=device)

    @staticmethod
    def zeros(*shape, dtype: DTypeLike | None = None, device: str | None = None) -> Tensor:
        return Tensor.full(Tensor._shape_arg(shape), 0, dtype=dtype or dtypes.default_float, device=device)

    @staticmethod
    def ones(*shape, dtype: DTypeLike | None = None, device: str | None = None) -> Tensor:
        return Tensor.full(Tensor._shape_arg(shape), 1, dtype=dtype or dtypes.default_float, device=device)

    @staticmethod
    def empty(*shape, dtype: DTypeLike | None = None, device: str | None = None) -> Tensor:
        shape = Tensor._shape_arg(shape)
        dt, device = to_dtype(dtype or dtypes.default_float), Device.canonicalize(device)
        return Tensor(reshape_uop(new_buffer_uop(device, prod(shape), dt), shape), device=device)

    def full_like(self, fill_value: ConstType, dtype: DTypeLike | None = None, device: str | None = None) -> Tensor:
        return Tensor.full(self.shape, fill_value, dtype=dtype or self.dtype, device=device or self.device)

    def zeros_like(self, **kwargs) -> Tensor:
        return self.full_like(0, **kwargs)

    def ones_like(self, **kwargs) -> Tensor:
        return self.full_like(1, **kwargs)

    def empty_like(self, dtype: DTypeLike | None = None, device: str | None = None) -> Tensor:
        return Tensor.empty(self.shape, dtype=dtype or self.dtype, device=device or self.device)

    @staticmethod
    def arange(start: ConstType, stop: ConstType | None = None, step: ConstType = 1,
               dtype: DTypeLike | None = None, device: str | None = None) -> Tensor:
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ValueError("arange: step must not be 0")
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py([start, stop, step])
        n = max(0, math.ceil((stop - start) / step))
        device = Device.canonicalize(device)
        iota = Tensor(UOp(Ops.IOTA, dtypes.int32, (UOp(Ops.DEVICE, arg=device),), n), device=device)
        return (iota.cast(dt) * step + start).cast(dt)

    @staticmethod
    def manual_seed(seed: int = 0) -> None:
        _rng_state["seed"], _rng_state["counter"] = int(seed), 0

    @staticmethod
    def _random_bits(shape: tuple[int, ...], device: str | None) -> Tensor:
        """uint32 bits from a counter-based hash: (seed, counter + i) -> bits, so no state lives on the device."""
        n = prod(shape)
        counter = _rng_state["counter"]
        _rng_state["counter"] += n
        device = Device.canonicalize(device)
        idx = Tensor(UOp(Ops.IOTA, dtypes.int32, (UOp(Ops.DEVICE, arg=device),), n), device=device).cast(dtypes.uint32)
        x = (idx + ((counter + 0x6A09E667) & 0xFFFFFFFF)) ^ ((_rng_state["seed"] * 0x9E3779B9) & 0xFFFFFFFF)
        for mul in (0x7FEB352D, 0x846CA68B):  # a 32-bit integer hash with good avalanche (lowbias32)
            x = (x ^ (x >> 16)) * mul
        x = x ^ (x >> 15) ^ ((_rng_state["seed"] >> 32) & 0xFFFFFFFF)
        return x.reshape(shape)

    @staticmethod
    def rand(*shape, dtype: DTypeLike | None = None, device: str | None = None, **kwargs) -> Tensor:
        shape = Tensor._shape_arg(shape)
        bits = Tensor._random_bits(shape, device)
        out = (bits >> 8).cast(dtypes.float32) * (1.0 / (1 << 24))  # 24 random bits -> [0, 1)
        return out.cast(to_dtype(dtype or dtypes.default_float)).contiguous()

    @staticmethod
    def randn(*shape, dtype: DTypeLike | None = None, device: str | None = None, **kwargs) -> Tensor:
        shape = Tensor._shape_arg(shape)
        u = Tensor.rand(2, *shape, device=device)
        u1, u2 = u[0], u[1]
        out = (1.0 - u1).log().mul(-2.0).sqrt() * (u2 * (2 * math.pi)).cos()  # Box-Muller
        return out.cast(to_dtype(dtype or dtypes.default_float)).contiguous()

    @staticmethod
    def uniform(*shape, low: float = 0.0, high: float = 1.0, dtype: DTypeLike | None = None, **kwargs) -> Tensor:
        return (Tensor.rand(*shape, **kwargs) * (high - low) + low).cast(to_dtype(dtype or dtypes.default_float))

    @staticmethod
    def normal(*shape, mean: float = 0.0, std: float = 1.0, **kwargs) -> Tensor:
        return Tensor.randn(*shape, **kwargs) * std + mean

    # ***** movement *****
    def reshape(self, shape, *args) -> Tensor:
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape, *args)
        if shape.count(-1) > 1:
            raise ValueError(f"reshape to {shape}: only one dimension can be -1")
        if -1 in shape:
            known = prod(s for s in shape if s != -1)
            if known == 0 or self.numel() % known:
                raise ValueError(f"can't reshape a tensor of shape {self.shape} to {shape}")
            shape = tuple(self.numel() // known if s == -1 else s for s in shape)
        if any(not isinstance(s, (int, np.integer)) or s < 0 for s in shape):
            raise ValueError(f"can't reshape to {shape}: sizes must be non-negative ints")
        shape = tuple(int(s) for s in shape)
        if prod(shape) != self.numel():
            raise ValueError(f"can't reshape a tensor of shape {self.shape} ({self.numel()} elements) to {shape} "
                             f"({prod(shape)} elements)")
        return self if shape == self.shape else self._new(UOp(Ops.RESHAPE, self.dtype, (self.uop,), shape))

    def view(self, shape, *args) -> Tensor:
        return self.reshape(shape, *args)

    def permute(self, order, *args) -> Tensor:
        order = tuple(order) if isinstance(order, (tuple, list)) else (order, *args)
        if len(order) != self.ndim:
            raise ValueError(f"permute order {order} must name each of the {self.ndim} dimensions of {self.shape}")
        norm = tuple(_normalize_axis(o, self.ndim, "permute dimension") for o in order)
        if sorted(norm) != list(range(self.ndim)):
            raise ValueError(f"permute order {order} is not a permutation of the dimensions of {self.shape}")
        if norm == tuple(range(self.ndim)):
            return self
        return self._new(UOp(Ops.PERMUTE, self.dtype, (self.uop,), norm))

    def expand(self, shape, *args) -> Tensor:
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape, *args)
        if len(shape) < self.ndim:
            raise ValueError(f"can't expand shape {self.shape} to {shape}: fewer dimensions")
        src = (1,) * (len(shape) - self.ndim) + self.shape
        new = tuple(s if n == -1 else n for s, n in zip(src, shape))
        if any(s != n and s != 1 for s, n in zip(src, new)):
            raise ValueError(f"can't expand shape {self.shape} to {shape}: only size-1 dimensions can grow")
        x = self.reshape(src)
        return x if new == x.shape else x._new(UOp(Ops.EXPAND, self.dtype, (x.uop,), new))

    def pad(self, padding, mode: str = "constant", value: ConstType = 0.0) -> Tensor:
        """`padding` is ((before, after), ...) per dimension (None for none), or a flat torch-style tuple
        (left, right, top, bottom, ...) starting at the last dimension."""
        if mode != "constant":
            raise NotImplementedError(f"pad mode {mode!r} is not implemented yet; only 'constant'")
        if all(isinstance(p, (int, np.integer)) for p in padding):
            if len(padding) % 2 or len(padding) // 2 > self.ndim:
                raise ValueError(f"flat padding {tuple(padding)} must have an even length <= 2*{self.ndim}")
            pairs = [(0, 0)] * (self.ndim - len(padding) // 2) + \
                [(padding[i], padding[i + 1]) for i in range(len(padding) - 2, -1, -2)]
        else:
            if len(padding) != self.ndim:
                raise ValueError(f"padding {tuple(padding)} must have one entry per dimension of {self.shape}")
            pairs = [(0, 0) if p is None else tuple(p) for p in padding]
        if any(b < 0 or a < 0 for b, a in pairs):  # negative padding crops
            x = self.shrink(tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(pairs, self.shape)))
            return x.pad(tuple((max(b, 0), max(a, 0)) for b, a in pairs), value=value)
        arg = tuple((int(b), int(a)) for b, a in pairs)
        if all(p == (0, 0) for p in arg):
            return self
        x = self._new(UOp(Ops.PAD, self.dtype, (self.uop,), arg))
        if value == 0:
            return x
        mask = Tensor.ones(*self.shape, dtype=dtypes.bool, device=self.device).pad(arg)
        return mask.where(x, value)

    def shrink(self, arg) -> Tensor:
        if len(arg) != self.ndim:
            raise ValueError(f"shrink {tuple(arg)} must have one (start, end) or None per dimension of {self.shape}")
        norm = tuple((0, s) if a is None else (int(a[0]), int(a[1])) for a, s in zip(arg, self.shape))
        for (b, e), s in zip(norm, self.shape):
            if not 0 <= b <= e <= s:
                raise ValueError(f"shrink {tuple(arg)} is out of bounds for shape {self.shape}")
        if all(b == 0 and e == s for (b, e), s in zip(norm, self.shape)):
            return self
        return self._new(UOp(Ops.SHRINK, self.dtype, (self.uop,), norm))

    def flip(self, axis, *args) -> Tensor:
        axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis, *args)
        axes = {_normalize_axis(a, self.ndim) for a in axes}
        if not axes:
            return self
        return self._new(UOp(Ops.FLIP, self.dtype, (self.uop,), tuple(i in axes for i in range(self.ndim))))

    def squeeze(self, dim: int | None = None) -> Tensor:
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        d = _normalize_axis(dim, self.ndim, "dim")
        return self if self.shape[d] != 1 else self.reshape(self.shape[:d] + self.shape[d + 1 :])

    def unsqueeze(self, dim: int) -> Tensor:
        d = _normalize_axis(dim, self.ndim + 1, "dim")
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        s, e = _normalize_axis(start_dim, self.ndim, "dim"), _normalize_axis(end_dim, self.ndim, "dim")
        return self.reshape(self.shape[:s] + (prod(self.shape[s : e + 1]),) + self.shape[e + 1 :])

    def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
        order = list(range(self.ndim))
        a, b = _normalize_axis(dim0, self.ndim, "dim"), _normalize_axis(dim1, self.ndim, "dim")
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self) -> Tensor:
        return self.permute(tuple(range(self.ndim))[::-1])

    def __getitem__(self, indices) -> Tensor:
        if not isinstance(indices, tuple):
            indices = (indices,)
        if any(isinstance(i, Tensor) for i in indices):
            raise NotImplementedError("indexing with a Tensor is not implemented yet")
        n_real = sum(1 for i in indices if i is not None and i is not Ellipsis)
        if n_real > self.ndim:
            raise IndexError(f"too many indices ({n_real}) for a tensor of shape {self.shape}")
        if sum(1 for i in indices if i is Ellipsis) > 1:
            raise IndexError("an index can only have a single ellipsis")
        if Ellipsis in indices:
            e = indices.index(Ellipsis)
            indices = indices[:e] + (slice(None),) * (self.ndim - n_real) + indices[e + 1 :]
        indices = indices + (slice(None),) * (self.ndim - n_real)
        shrink, flips, final_shape, dim = [], [], [], 0
        for idx in indices:
            if idx is None:
                final_shape.append(1)
                continue
            size = self.shape[dim]
            if isinstance(idx, (int, np.integer)) and not isinstance(idx, bool):
                i = int(idx)
                if not -size <= i < size:
                    raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {size}")
                i = i + size if i < 0 else i
                shrink.append((i, i + 1))
            elif isinstance(idx, slice):
                start, stop, step = idx.indices(size)
                if step < 0:
                    raise NotImplementedError("slices with a negative step are not implemented yet")
                n = max(0, ceil_div(stop - start, step))
                if step == 1:
                    shrink.append((start, start + n))
                else:
                    shrink.append((start, start + (n - 1) * step + 1) if n else (start, start))
                    flips.append((dim, step, n))
                final_shape.append(n)
            else:
                raise TypeError(f"can't index a tensor with {type(idx).__name__} {idx!r}")
            dim += 1
        x = self.shrink(tuple(shrink))
        for d, step, n in flips:  # strided slice: pad to a multiple of step, reshape, take column 0
            if n == 0:
                continue
            shape = x.shape
            x = x.pad(tuple((0, n * step - shape[d]) if i == d else None for i in range(x.ndim)))
            x = x.reshape(x.shape[:d] + (n, step) + x.shape[d + 1 :])
            x = x.shrink(tuple((0, 1) if i == d + 1 else None for i in range(x.ndim)))
            x = x.reshape(x.shape[: d + 1] + x.shape[d + 2 :])
        return x.reshape(tuple(final_shape))

    # ***** elementwise *****
    def _const_like(self, x: ConstType, dtype: DType | None = None) -> Tensor:
        return Tensor.full(self.shape, x, dtype=dtype or self.dtype, device=self.device)

    def _operands(self, x: Tensor | ConstType, reverse: bool = False) -> tuple[Tensor, Tensor]:
        """Both operands of a binary op, in one dtype (promoted as torch does) and broadcast to one shape."""
        if isinstance(x, Tensor):
            if x.device != self.device:
                raise ValueError(f"tensors on different devices: {self.device} and {x.device}")
            dt = least_upper_dtype(self.dtype, x.dtype)
            other = x
        elif isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating)):
            x = x.item() if isinstance(x, np.generic) else x
            if isinstance(x, float) and not dtypes.is_float(self.dtype):
                dt = dtypes.default_float
            elif isinstance(x, int) and not isinstance(x, bool) and self.dtype == dtypes.bool:
                dt = dtypes.default_int
            else:
                dt = self.dtype
            other = Tensor(const_broadcast(x, dt, self.device, ()), device=self.device)
        else:
            raise TypeError(f"unsupported operand type {type(x).__name__} for a Tensor op")
        a, b = (other, self) if reverse else (self, other)
        shape = _broadcast_shape(a.shape, b.shape)
        return a.cast(dt)._broadcast_to(shape), b.cast(dt)._broadcast_to(shape)

    def _broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
        if self.shape == shape:
            return self
        x = self.reshape((1,) * (len(shape) - self.ndim) + self.shape)
        return x.expand(shape)

    def _alu(self, op: Ops, *srcs: Tensor, dtype: DType | None = None) -> Tensor:
        return self._new(UOp(op, dtype or self.dtype, (self.uop, *(s.uop for s in srcs))))

    def _binary(self, op: Ops, x: Tensor | ConstType, reverse: bool = False) -> Tensor:
        a, b = self._operands(x, reverse)
        out_dtype = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else a.dtype
        return a._alu(op, b, dtype=out_dtype)

    def add(self, x, reverse: bool = False) -> Tensor:
        return self._binary(Ops.ADD, x, reverse)

    def sub(self, x, reverse: bool = False) -> Tensor:
        a, b = self._operands(x, reverse)
        if a.dtype == dtypes.bool:
            raise TypeError("subtracting bool tensors is not supported; use logical_xor or cast first")
        return a._alu(Ops.SUB, b)

    def mul(self, x, reverse: bool = False) -> Tensor:
        return self._binary(Ops.MUL, x, reverse)

    def div(self, x, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
        a, b = self._operands(x, reverse)
        if rounding_mode == "trunc":
            return a._alu(Ops.IDIV, b) if dtypes.is_int(a.dtype) else (a._float() / b._float()).trunc().cast(a.dtype)
        if rounding_mode == "floor":
            return a._floordiv(b)
        if rounding_mode is not None:
            raise ValueError(f"rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
        a, b = a._float(), b._float()
        return a._alu(Ops.FDIV, b)

    def _float(self) -> Tensor:
        return self.cast(least_upper_float(self.dtype))

    def _floordiv(self, b: Tensor) -> Tensor:
        if not dtypes.is_int(self.dtype):
            return (self / b).floor()
        q = self._alu(Ops.IDIV, b)
        inexact = self._alu(Ops.MOD, b)._alu(Ops.CMPNE, b._const_like(0), dtype=dtypes.bool)
        signs_differ = (self < 0)._alu(Ops.CMPNE, b < 0, dtype=dtypes.bool)
        return (inexact & signs_differ).where(q - 1, q)

    def mod(self, x, reverse: bool = False) -> Tensor:
        a, b = self._operands(x, reverse)
        if not dtypes.is_int(a.dtype):
            return a - b * (a / b).floor()
        r = a._alu(Ops.MOD, b)
        return ((r != 0) & ((r < 0) != (b < 0))).where(r + b, r)

    def neg(self) -> Tensor:
        return self.logical_not() if self.dtype == dtypes.bool else self._alu(Ops.NEG)

    def maximum(self, x) -> Tensor:
        return self._binary(Ops.MAX, x)

    def minimum(self, x) -> Tensor:
        a, b = self._operands(x)
        return (a < b).where(a, b)

    def where(self, x: Tensor | ConstType, y: Tensor | ConstType) -> Tensor:
        if isinstance(x, Tensor) and isinstance(y, Tensor):
            a, b = x._operands(y)
        elif isinstance(x, Tensor):
            a, b = x._operands(y)
        elif isinstance(y, Tensor):
            b, a = y._operands(x)
        else:
            dt = dtypes.from_py([x, y])
            a, b = Tensor(const_broadcast(x, dt, self.device, ()), device=self.device), \
                Tensor(const_broadcast(y, dt, self.device, ()), device=self.device)
        shape = _broadcast_shape(self.shape, a.shape, b.shape)
        cond = self.cast(dtypes.bool)._broadcast_to(shape)
        return cond._new(UOp(Ops.WHERE, a.dtype, (cond.uop, a._broadcast_to(shape).uop, b._broadcast_to(shape).uop)))

    def cast(self, dtype: DTypeLike) -> Tensor:
        dt = to_dtype(dtype)
        return self if dt == self.dtype else self._new(UOp(Ops.CAST, dt, (self.uop,)))

    def float(self) -> Tensor:
        return self.cast(dtypes.float32)

    def half(self) -> Tensor:
        return self.cast(dtypes.float16)

    def bfloat16(self) -> Tensor:
        return self.cast(dtypes.bfloat16)

    def double(self) -> Tensor:
        return self.cast(dtypes.float64)

    def int(self) -> Tensor:
        return self.cast(dtypes.int32)

    def long(self) -> Tensor:
        return self.cast(dtypes.int64)

    def short(self) -> Tensor:
        return self.cast(dtypes.int16)

    def bool(self) -> Tensor:
        return self.cast(dtypes.bool)

    def _unary_float(self, op: Ops) -> Tensor:
        return self._float()._alu(op)

    def exp2(self) -> Tensor:
        return self._unary_float(Ops.EXP2)

    def log2(self) -> Tensor:
        return self._unary_float(Ops.LOG2)

    def sin(self) -> Tensor:
        return self._unary_float(Ops.SIN)

    def cos(self) -> Tensor:
        return ((math.pi / 2) - self._float()).sin()

    def sqrt(self) -> Tensor:
        return self._unary_float(Ops.SQRT)

    def rsqrt(self) -> Tensor:
        return self.sqrt().reciprocal()

    def reciprocal(self) -> Tensor:
        return self._unary_float(Ops.RECIPROCAL)

    def exp(self) -> Tensor:
        return (self._float() * (1 / math.log(2))).exp2()

    def log(self) -> Tensor:
        return self.log2() * math.log(2)

    def trunc(self) -> Tensor:
        return self if not dtypes.is_float(self.dtype) else self._alu(Ops.TRUNC)

    def floor(self) -> Tensor:
        t = self.trunc()
        return (t > self).where(t - 1, t) if dtypes.is_float(self.dtype) else self

    def ceil(self) -> Tensor:
        t = self.trunc()
        return (t < self).where(t + 1, t) if dtypes.is_float(self.dtype) else self

    def relu(self) -> Tensor:
        return (self > 0).where(self, 0)

    def abs(self) -> Tensor:
        return self if self.dtype == dtypes.bool or dtypes.is_unsigned(self.dtype) else (self < 0).where(-self, self)

    def square(self) -> Tensor:
        return self * self

    def sigmoid(self) -> Tensor:
        return (1 + (-self).exp()).reciprocal()

    def logical_not(self) -> Tensor:
        return self.cast(dtypes.bool)._alu(Ops.CMPNE, self._const_like(True, dtypes.bool), dtype=dtypes.bool)

    # comparisons
    def __lt__(self, x):
        return self._binary(Ops.CMPLT, x)

    def __gt__(self, x):
        return self._binary(Ops.CMPLT, x, reverse=True)

    def __le__(self, x):
        a, b = self._operands(x)
        return (a < b) | a.eq(b)

    def __ge__(self, x):
        a, b = self._operands(x)
        return (b < a) | a.eq(b)

    def eq(self, x) -> Tensor:
        return self._binary(Ops.CMPEQ, x)

    def ne(self, x) -> Tensor:
        return self._binary(Ops.CMPNE, x)

    def __eq__(self, x):  # type: ignore[override]
        return self.eq(x)

    def __ne__(self, x):  # type: ignore[override]
        return self.ne(x)

    # bitwise (bools and ints)
    def _bitwise(self, op: Ops, x, reverse: bool = False) -> Tensor:
        a, b = self._operands(x, reverse)
        if dtypes.is_float(a.dtype):
            raise TypeError(f"bitwise {op.name} needs integer or bool tensors, got {a.dtype}")
        return a._alu(op, b)

    def bitwise_and(self, x, reverse: bool = False) -> Tensor:
        return self._bitwise(Ops.AND, x, reverse)

    def bitwise_or(self, x, reverse: bool = False) -> Tensor:
        return self._bitwise(Ops.OR, x, reverse)

    def bitwise_xor(self, x, reverse: bool = False) -> Tensor:
        return self._bitwise(Ops.XOR, x, reverse)

    def lshift(self, x, reverse: bool = False) -> Tensor:
        return self._bitwise(Ops.SHL, x, reverse)

    def rshift(self, x, reverse: bool = False) -> Tensor:
        return self._bitwise(Ops.SHR, x, reverse)

    def __add__(self, x):
        return self.add(x)

    def __radd__(self, x):
        return self.add(x, True)

    def __sub__(self, x):
        return self.sub(x)

    def __rsub__(self, x):
        return self.sub(x, True)

    def __mul__(self, x):
        return self.mul(x)

    def __rmul__(self, x):
        return self.mul(x, True)

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

    def __neg__(self):
        return self.neg()

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

    def __rshift__(self, x):
        return self.rshift(x)

    def __invert__(self):
        return self.logical_not() if self.dtype == dtypes.bool else self ^ -1

    # ***** reduce *****
    def _axes(self, axis) -> tuple[int, ...]:
        if axis is None:
            return tuple(range(self.ndim))
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        return tuple(sorted({_normalize_axis(a, self.ndim) for a in axes}))

    def _reduce(self, op: Ops, axis=None, keepdim: bool = False) -> Tensor:
        """One REDUCE_AXIS over the reduced axes (kept as size 1), then a reshape if not keepdim (seed 004)."""
        axes = self._axes(axis)
        if self.ndim == 0 or not axes:
            return self
        ret = self._new(UOp(Ops.REDUCE_AXIS, self.dtype, (self.uop,), (op, axes)))
        return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def sum(self, axis=None, keepdim: bool = False, dtype: DTypeLike | None = None) -> Tensor:
        acc = to_dtype(dtype) if dtype is not None else sum_acc_dtype(self.dtype)
        out = self.cast(acc)._reduce(Ops.ADD, axis, keepdim)
        half = self.dtype in (dtypes.float16, dtypes.bfloat16) and dtype is None
        return out.cast(self.dtype) if half else out

    def max(self, axis=None, keepdim: bool = False) -> Tensor:
        return self._reduce(Ops.MAX, axis, keepdim)

    def _inverse(self) -> Tensor:
        if dtypes.is_float(self.dtype):
            return -self
        return self.logical_not() if self.dtype == dtypes.bool else ~self

    def min(self, axis=None, keepdim: bool = False) -> Tensor:
        return self._inverse().max(axis, keepdim)._inverse()

    def mean(self, axis=None, keepdim: bool = False) -> Tensor:
        x = self._float() if not dtypes.is_float(self.dtype) else self
        n = prod(self.shape[a] for a in self._axes(axis)) if self.ndim else 1
        out = x.sum(axis, keepdim)
        return (out / n if n else out * math.nan).cast(x.dtype)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ***** graph leaves *****


def _buffer_uop(arr: np.ndarray, dtype: DType, device: str) -> UOp:
    buf = new_buffer_uop(device, arr.size, dtype)
    buffers[buf].copyin(arr)
    return reshape_uop(buf, arr.shape)
