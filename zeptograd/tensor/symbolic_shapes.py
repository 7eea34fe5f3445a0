"""Symbolic shapes' checks for tensor/tensor.py: sizes that are expressions of bound Variables (uop/variable.py),
and bounds that must hold for every value of them while TinyJit captures."""

from __future__ import annotations

from zeptograd.helpers import ArgumentError
from zeptograd.uop import variable
from zeptograd.uop.ops import UOp


def _capturing() -> bool:
    from zeptograd.engine.realize import is_capturing

    return is_capturing()


def _symbolic_shape(shape: tuple, what: str) -> tuple:
    """Each size an int or an expression of bound Variables, >= 0 (while TinyJit captures: for every value)."""
    out = tuple(variable.sint_arg(s, what) for s in shape)
    for s in out:
        low = s if isinstance(s, int) else variable.sint_value(s)
        if low < 0 or (_capturing() and isinstance(s, UOp) and s.vmin < 0):
            raise ArgumentError(f"{what}: sizes must be non-negative, got {s!r} in {out}")
    return out


def _check_symbolic_bounds(pairs: tuple, shape: tuple, what: str):
    """0 <= begin <= end <= size at the Variables' values; while TinyJit captures, for every value of them."""
    for (b, e), s in zip(pairs, shape):
        vb, ve, vs = variable.sint_value(b), variable.sint_value(e), variable.sint_value(s)
        if not 0 <= vb <= ve <= vs:
            raise ArgumentError(
                f"{what} is out of bounds for shape {shape}: ({b!r}, {e!r}) is ({vb}, {ve}) in a dimension of size {vs}"
            )
        if _capturing():
            for lo, hi in ((0, b), (b, e), (e, s)):
                d = variable.sint_simplify(hi - lo)
                if isinstance(d, UOp) and d.vmin < 0:
                    raise ArgumentError(
                        f"{what} while TinyJit captures: ({b!r}, {e!r}) in a dimension of size {s!r} "
                        f"is out of bounds for some values of the Variables, and a replay runs with "
                        f"other values (narrow the Variables' ranges)"
                    )
