"""Creation: Tensors made from a shape and a value (full, zeros, ones, empty, the *_like forms), ranges (arange,
linspace) and eye. Each is a constant broadcast, a new buffer or an iota, so nothing is computed until realized."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from zeptograd.buffers import new_buffer_uop, reshape_uop
from zeptograd.device import Device
from zeptograd.dtype import DType, DTypeLike, dtypes, to_dtype
from zeptograd.helpers import ArgumentError, ArgumentTypeError
from zeptograd.schedule.fold import const_broadcast
from zeptograd.tensor import multi
from zeptograd.tensor.helpers import ConstType, iota_uop, prod
from zeptograd.tensor.symbolic_shapes import _symbolic_shape
from zeptograd.uop.ops import UOp

if TYPE_CHECKING:
    from zeptograd.tensor import Tensor


class CreationMixin:
    __slots__ = ()

    @classmethod
    def _shape_arg(cls: type[Tensor], shape: tuple, symbolic: bool = False) -> tuple:
        """A creation shape; with symbolic=True its sizes may be bound Variables (uop/variable.py)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        if any(isinstance(s, UOp) for s in shape):
            if not symbolic:
                raise ArgumentError(
                    f"this creation function needs int sizes, got the symbolic shape {shape}: make it at "
                    f"the largest size and shrink it to the Variable"
                )
            return _symbolic_shape(shape, "shape")
        for s in shape:
            if not isinstance(s, (int, np.integer)) or s < 0:
                raise ArgumentError(f"a shape is made of non-negative ints, got {shape}")
        return tuple(int(s) for s in shape)

    @classmethod
    def full(
        cls: type[Tensor],
        shape: tuple[int, ...] | int,
        fill_value: ConstType,
        dtype: DTypeLike | None = None,
        device: str | None = None,
        requires_grad: bool | None = None,
        **kwargs,
    ) -> Tensor:
        shape = cls._shape_arg(shape if isinstance(shape, (tuple, list)) else (shape,), symbolic=True)
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py(fill_value)
        device = Device.canonicalize(device)
        ret = cls(const_broadcast(fill_value, dt, device, shape), device=device)
        return ret.requires_grad_(True) if requires_grad else ret

    @classmethod
    def zeros(cls: type[Tensor], *shape, dtype: DTypeLike | None = None, **kwargs) -> Tensor:
        return cls.full(cls._shape_arg(shape, True), 0, dtype=dtype or dtypes.default_float, **kwargs)

    @classmethod
    def ones(cls: type[Tensor], *shape, dtype: DTypeLike | None = None, **kwargs) -> Tensor:
        return cls.full(cls._shape_arg(shape, True), 1, dtype=dtype or dtypes.default_float, **kwargs)

    @classmethod
    def empty(
        cls: type[Tensor],
        *shape,
        dtype: DTypeLike | None = None,
        device: str | None = None,
        requires_grad: bool | None = None,
    ) -> Tensor:
        shape = cls._shape_arg(shape, symbolic=True)  # a symbolic shape: a buffer of its largest size
        dt = to_dtype(dtype or dtypes.default_float)
        if isinstance(device, (tuple, list)):  # a buffer on each device
            devices = multi.canonical_devices(device)
            parts = [cls.empty(*shape, dtype=dt, device=d).uop for d in devices]
            ret = cls(multi.multi(parts, None), device=devices)
            return ret.requires_grad_(True) if requires_grad else ret
        device = Device.canonicalize(device)
        n = prod(shape)
        ret = cls(reshape_uop(new_buffer_uop(device, n.vmax if isinstance(n, UOp) else n, dt), shape), device=device)
        return ret.requires_grad_(True) if requires_grad else ret

    def full_like(
        self: Tensor, fill_value: ConstType, dtype: DTypeLike | None = None, device: str | None = None, **kwargs
    ) -> Tensor:
        return self.full(self.shape, fill_value, dtype=dtype or self.dtype, device=device or self.device, **kwargs)

    def zeros_like(self: Tensor, **kwargs) -> Tensor:
        return self.full_like(0, **kwargs)

    def ones_like(self: Tensor, **kwargs) -> Tensor:
        return self.full_like(1, **kwargs)

    def empty_like(self: Tensor, dtype: DTypeLike | None = None, device: str | None = None, **kwargs) -> Tensor:
        return self.empty(self.shape, dtype=dtype or self.dtype, device=device or self.device, **kwargs)

    def const_like(self: Tensor, b: ConstType, dtype: DType | None = None) -> Tensor:
        return self.full(self.shape, b, dtype=dtype or self.dtype, device=self.device)

    @classmethod
    def _iota(cls: type[Tensor], n: int, device: str | tuple[str, ...] | None) -> Tensor:
        device = multi.canonical_devices(device) if isinstance(device, (tuple, list)) else Device.canonicalize(device)
        return cls(iota_uop(n, device), device=device)

    @classmethod
    def arange(
        cls: type[Tensor],
        start: ConstType,
        stop: ConstType | None = None,
        step: ConstType = 1,
        dtype: DTypeLike | None = None,
        device: str | None = None,
        **kwargs,
    ) -> Tensor:
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ArgumentError("arange: step must not be 0")
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py([start, stop, step])
        n = max(0, math.ceil((stop - start) / step))
        ret = (cls._iota(n, device).cast(dt) * step + start).cast(dt)
        return ret.requires_grad_(True) if kwargs.get("requires_grad") else ret

    @classmethod
    def linspace(
        cls: type[Tensor],
        start: ConstType,
        stop: ConstType,
        steps: int,
        dtype: DTypeLike | None = None,
        device: str | None = None,
        **kwargs,
    ) -> Tensor:
        if not isinstance(steps, (int, np.integer)) or isinstance(steps, bool):
            raise ArgumentTypeError(f"linspace: steps must be an int, got {type(steps).__name__} {steps!r}")
        if steps < 0:
            raise ArgumentError(f"linspace: steps must be non-negative, got {steps}")
        dt = to_dtype(dtype or dtypes.default_float)
        if dt == dtypes.bool:
            raise ArgumentError("linspace is not implemented for dtype bool (as torch): use an int or float dtype")
        if steps == 1:
            return cls.full((1,), start, dtype=dt, device=device, **kwargs)
        step = (stop - start) / max(steps - 1, 1)
        i = cls._iota(steps, device).cast(dtypes.float32 if dt != dtypes.float64 else dt)
        half = steps // 2  # as torch: the first half counts up from start, the second half down from stop
        ret = (i < half).where(i * step + start, stop - (steps - 1 - i) * step).cast(dt)
        return ret.requires_grad_(True) if kwargs.get("requires_grad") else ret

    @classmethod
    def eye(
        cls: type[Tensor],
        n: int,
        m: int | None = None,
        dtype: DTypeLike | None = None,
        device: str | None = None,
        **kwargs,
    ) -> Tensor:
        m = n if m is None else m
        if n < 0 or m < 0:
            raise ArgumentError(f"eye needs non-negative sizes, got {n}, {m}")
        ret = cls._iota(n, device).reshape(n, 1) == cls._iota(m, device).reshape(1, m)
        ret = ret.cast(to_dtype(dtype or dtypes.default_float))
        return ret.requires_grad_(True) if kwargs.get("requires_grad") else ret
