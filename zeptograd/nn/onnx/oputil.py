"""The op registry and the helpers every op module uses."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from zeptograd.dtype import DType, dtypes
from zeptograd.tensor import Tensor

from . import Node

OPS: dict[tuple[str, str], Callable] = {}


def op(*names: str, domain: str = "ai.onnx"):
    """Register fn as the implementation of these op types: `op("Relu")(fn)`."""

    def deco(fn):
        for n in names:
            OPS[(domain, n)] = fn
        return fn

    return deco


def ints(t: Any) -> list[int]:
    """A shape-like value (Tensor, numpy, list) as Python ints, read back to the host."""
    if t is None:
        return []
    if isinstance(t, Tensor):
        t = t.numpy()
    return [int(v) for v in np.asarray(t).reshape(-1)]


def floats(t: Any) -> list[float]:
    if isinstance(t, Tensor):
        t = t.numpy()
    return [float(v) for v in np.asarray(t).reshape(-1)]


def scalar(t: Any):
    if isinstance(t, Tensor):
        return t.numpy().reshape(-1)[0].item()
    return np.asarray(t).reshape(-1)[0].item()


def axis_of(a: int, ndim: int, node: Node) -> int:
    if not -max(ndim, 1) <= a < max(ndim, 1):
        raise node.fail(f"axis {a} is out of range for rank {ndim}")
    return a + ndim if a < 0 else a


def const(v, dt: DType, like: Tensor | None = None) -> Tensor:
    return Tensor(np.asarray(v, dtype=_np(dt)), device=like.device if like is not None else None)


def _np(dt: DType):
    return {
        dtypes.float32: np.float32, dtypes.float16: np.float16, dtypes.float64: np.float64, dtypes.int8: np.int8,
        dtypes.int16: np.int16, dtypes.int32: np.int32, dtypes.int64: np.int64, dtypes.uint8: np.uint8,
        dtypes.uint16: np.uint16, dtypes.uint32: np.uint32, dtypes.uint64: np.uint64, dtypes.bool: np.bool_,
    }[dt]  # fmt: skip


def broadcast_shape(*shapes) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))


def bexpand(x: Tensor, shape) -> Tensor:
    shape = tuple(shape)
    if x.shape == shape:
        return x
    return x.reshape((1,) * (len(shape) - x.ndim) + x.shape).expand(shape)


def is_float(t: Tensor) -> bool:
    return dtypes.is_float(t.dtype)
