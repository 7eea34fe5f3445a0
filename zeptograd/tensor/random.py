"""Random numbers from a counter-based hash (no state on the device) and the usual initializers."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from zeptograd.device import Device
from zeptograd.dtype import DTypeLike, dtypes, to_dtype
from zeptograd.helpers import ArgumentError
from zeptograd.tensor.helpers import prod

if TYPE_CHECKING:
    from zeptograd.tensor import Tensor

_rng_state = {"seed": 0, "counter": 0}


def _grad(t: Tensor, kwargs: dict) -> Tensor:
    return t.requires_grad_(True) if kwargs.get("requires_grad") else t


class RandomMixin:
    __slots__ = ()

    @staticmethod
    def manual_seed(seed: int = 0) -> None:
        _rng_state["seed"], _rng_state["counter"] = int(seed), 0

    @classmethod
    def _random_bits(cls: type[Tensor], shape: tuple[int, ...], device: str | None) -> Tensor:
        """uint32 bits from a 32-bit integer hash of (seed, counter + i): each call draws fresh counters."""
        n = prod(shape)
        counter = _rng_state["counter"]
        _rng_state["counter"] += n
        idx = cls._iota(n, Device.canonicalize(device)).cast(dtypes.uint32)
        x = (idx + ((counter + 0x6A09E667) & 0xFFFFFFFF)) ^ ((_rng_state["seed"] * 0x9E3779B9) & 0xFFFFFFFF)
        for mul in (0x7FEB352D, 0x846CA68B):  # lowbias32: good avalanche
            x = (x ^ (x >> 16)) * mul
        x = x ^ (x >> 15) ^ ((_rng_state["seed"] >> 32) & 0xFFFFFFFF)
        return x.reshape(shape)

    @classmethod
    def rand(
        cls: type[Tensor],
        *shape,
        dtype: DTypeLike | None = None,
        device: str | None = None,
        contiguous: bool = True,
        **kwargs,
    ) -> Tensor:
        """Uniform in [0, 1)."""
        dt = to_dtype(dtype or dtypes.default_float)
        if not dtypes.is_float(dt):
            raise ArgumentError(f"rand makes floats, got dtype {dt}")
        shape = cls._shape_arg(shape)
        out = (cls._random_bits(shape, device) >> 8).cast(dtypes.float32) * (1.0 / (1 << 24))  # 24 random bits
        out = out.cast(dt)
        return _grad(out.contiguous() if contiguous else out, kwargs)

    def rand_like(self: Tensor, **kwargs) -> Tensor:
        return type(self).rand(
            *self.shape, dtype=kwargs.pop("dtype", self.dtype), device=kwargs.pop("device", self.device), **kwargs
        )

    @classmethod
    def randn(cls: type[Tensor], *shape, dtype: DTypeLike | None = None, device: str | None = None, **kwargs) -> Tensor:
        """Standard normal (Box-Muller on two uniforms)."""
        shape = cls._shape_arg(shape)
        u = cls.rand(2, *shape, device=device, contiguous=False)
        out = (1.0 - u[0]).log().mul(-2.0).sqrt() * (u[1] * (2 * math.pi)).cos()
        return _grad(out.cast(to_dtype(dtype or dtypes.default_float)).contiguous(), kwargs)

    def randn_like(self: Tensor, dtype: DTypeLike | None = None, **kwargs) -> Tensor:
        return type(self).randn(
            *self.shape, dtype=dtype or self.dtype, device=kwargs.pop("device", self.device), **kwargs
        )

    @classmethod
    def randint(
        cls: type[Tensor], *shape, low: int = 0, high: int = 10, dtype: DTypeLike = dtypes.int32, **kwargs
    ) -> Tensor:
        if not isinstance(low, int) or not isinstance(high, int) or low >= high:
            raise ArgumentError(f"randint needs int bounds low < high, got {low}, {high}")
        dt = to_dtype(dtype)
        return (cls.rand(*shape, dtype=dtypes.float64, **kwargs) * (high - low) + low).floor().cast(dt)

    @classmethod
    def uniform(
        cls: type[Tensor], *shape, low: float = 0.0, high: float = 1.0, dtype: DTypeLike | None = None, **kwargs
    ) -> Tensor:
        rg = kwargs.pop("requires_grad", None)
        out = (cls.rand(*shape, **kwargs) * (high - low) + low).cast(to_dtype(dtype or dtypes.default_float))
        return _grad(out, {"requires_grad": rg})

    @classmethod
    def normal(cls: type[Tensor], *shape, mean: float = 0.0, std: float = 1.0, **kwargs) -> Tensor:
        rg = kwargs.pop("requires_grad", None)
        return _grad(cls.randn(*shape, **kwargs) * std + mean, {"requires_grad": rg})

    @classmethod
    def scaled_uniform(cls: type[Tensor], *shape, **kwargs) -> Tensor:
        shape = cls._shape_arg(shape)
        return cls.uniform(*shape, low=-(prod(shape) ** -0.5), high=prod(shape) ** -0.5, **kwargs)

    @classmethod
    def glorot_uniform(cls: type[Tensor], *shape, **kwargs) -> Tensor:
        shape = cls._shape_arg(shape)
        bound = (6 / (shape[0] + prod(shape[1:]))) ** 0.5
        return cls.uniform(*shape, low=-bound, high=bound, **kwargs)

    @classmethod
    def kaiming_uniform(cls: type[Tensor], *shape, a: float = 0.01, **kwargs) -> Tensor:
        shape = cls._shape_arg(shape)
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a**2)) / math.sqrt(prod(shape[1:]))
        return cls.uniform(*shape, low=-bound, high=bound, **kwargs)

    @classmethod
    def kaiming_normal(cls: type[Tensor], *shape, a: float = 0.01, **kwargs) -> Tensor:
        shape = cls._shape_arg(shape)
        std = math.sqrt(2.0 / (1 + a**2)) / math.sqrt(prod(shape[1:]))
        return cls.normal(*shape, mean=0.0, std=std, **kwargs)

    @classmethod
    def randperm(
        cls: type[Tensor], n: int, device: str | None = None, dtype: DTypeLike = dtypes.int32, **kwargs
    ) -> Tensor:
        return cls.rand(n, device=device).argsort().cast(to_dtype(dtype))

    def multinomial(self: Tensor, num_samples: int = 1, replacement: bool = False) -> Tensor:
        """Draw class indices (int64) with probabilities proportional to the weights on the last axis."""
        if not 1 <= self.ndim <= 2 or num_samples < 1:
            raise ArgumentError(
                f"multinomial needs 1-D or 2-D weights and num_samples >= 1, got {self.shape}, {num_samples}"
            )
        w = self.unsqueeze(0) if self.ndim == 1 else self
        if not replacement:  # Gumbel top-k: the k largest of log(w) + Gumbel noise are a sample without replacement
            if num_samples > w.shape[1]:
                raise ArgumentError(f"can't draw {num_samples} samples without replacement from {w.shape[1]} classes")
            keys = w.log() - (-type(self).rand(*w.shape, device=self.device).maximum(1e-12).log()).log()
            idx = keys.topk(num_samples, -1)[1]
        else:  # inverse CDF
            cdf = w.float().cumsum(1)
            cdf = cdf / cdf[:, -1:]
            u = type(self).rand(w.shape[0], num_samples, 1, device=self.device)
            idx = (u >= cdf.unsqueeze(1)).sum(-1).minimum(w.shape[1] - 1)
        return (idx.squeeze(0) if self.ndim == 1 else idx).cast(dtypes.int64)
