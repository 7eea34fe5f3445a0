"""Small helpers shared by the Tensor modules: argument normalization, shape arithmetic, error messages."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from zeptograd.dtype import dtypes
from zeptograd.helpers import (  # noqa: F401  (re-exported for the Tensor modules)
    ArgumentError,
    ArgumentTypeError,
    argsort,
    ceildiv,
    flatten,
    prod,
)
from zeptograd.uop.ops import Ops, UOp

ConstType = float | int | bool
PY_CONST = (bool, int, float, np.bool_, np.integer, np.floating)


def iota_uop(n: int, device: str | tuple[str, ...]) -> UOp:
    """0..n-1 on a (canonical) device, in int32 unless n needs int64: its values must not wrap."""
    dt = dtypes.int32 if n <= dtypes.max(dtypes.int32) + 1 else dtypes.int64
    return UOp(Ops.IOTA, dt, (UOp(Ops.DEVICE, arg=device),), n)


def normalize_axis(axis: int, ndim: int, what: str = "axis") -> int:
    lo, hi = (-ndim, ndim - 1) if ndim > 0 else (-1, 0)
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise ArgumentTypeError(f"{what} must be an int, got {type(axis).__name__} {axis!r}")
    if not lo <= axis <= hi:
        raise IndexError(f"{what} {axis} is out of range for a tensor of {ndim} dimension(s) (expected {lo}..{hi})")
    return int(axis) + ndim if axis < 0 else int(axis)


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    if len(shapes) == 3 and shapes[0] == shapes[1] == shapes[2]:  # (where's common case)
        return tuple(shapes[0])
    if len(shapes) == 2:  # (the common case, a binary op's, without the sets and generators below)
        a, b = shapes
        if a == b:
            return tuple(a)
        if len(a) != len(b):
            a, b = (1,) * (len(b) - len(a)) + tuple(a), (1,) * (len(a) - len(b)) + tuple(b)
        out2 = []
        for x, y in zip(a, b):
            if x == y or y == 1:
                out2.append(x)
            elif x == 1:
                out2.append(y)
            else:  # they do not broadcast: the error below
                break
        else:
            return tuple(out2)
    nd = max((len(s) for s in shapes), default=0)
    padded = [(1,) * (nd - len(s)) + tuple(s) for s in shapes]
    out = []
    for dims in zip(*padded):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            hint = (
                "; a symbolic size (a bound Variable) only matches the same expression: reshape the other tensor "
                "to it first"
                if any(not isinstance(d, int) for d in sizes)
                else ""
            )
            raise ArgumentError(
                f"shapes {' and '.join(str(tuple(s)) for s in shapes)} do not broadcast "
                f"(sizes {sorted(sizes, key=str)} meet in one dimension){hint}"
            )
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def argfix(x: Any, *args: Any) -> tuple:
    """f(1, 2), f((1, 2)) and f([1, 2]) all mean (1, 2)."""
    if isinstance(x, (tuple, list)):
        if args:
            raise ArgumentError(
                f"pass the values either as one sequence or as separate arguments, not both: {x}, {args}"
            )
        return tuple(x)
    return (x, *args)


def make_tuple(x: int | Sequence[int], n: int) -> tuple[int, ...]:
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return (int(x),) * n
    if not isinstance(x, (tuple, list)) or not all(isinstance(v, (int, np.integer)) for v in x):
        raise ArgumentTypeError(f"expected an int or a sequence of ints, got {type(x).__name__} {x!r}")
    return tuple(int(v) for v in x)


def resolve_pool_pads(padding: int | Sequence[int], dims: int) -> list[int]:
    """Pool/conv padding as a flat torch-style list (left, right, top, bottom, ...), last dimension first."""
    if isinstance(padding, int):
        return [padding] * (2 * dims)
    if len(padding) == 2 * dims:
        return list(padding)
    if len(padding) == dims:
        return [p for p in reversed(padding) for _ in range(2)]
    raise ArgumentError(f"padding must be an int or a sequence of {dims} or {2 * dims} ints, got {padding}")


def flat_to_grouped(padding: Sequence[int]) -> list[tuple[int, int]]:
    """(left, right, top, bottom) -> [(top, bottom), (left, right)]: per dimension, first dimension first."""
    return list(zip(padding[-2::-2], padding[::-2]))
