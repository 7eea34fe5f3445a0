"""TinyJit's arguments and outputs: which arguments are inputs and how the others are compared on replay, the
returned structure flattened and rebuilt, buffers copied and wrapped as Tensors (engine/jit.py)."""

from __future__ import annotations

import ctypes
import math
from typing import Any

from zeptograd.buffers import buffers, new_buffer_uop, reshape_uop, view_base
from zeptograd.device import Buffer
from zeptograd.engine import realize as _realize
from zeptograd.helpers import ArgumentTypeError
from zeptograd.tensor import multi
from zeptograd.uop.ops import Ops, UOp
from zeptograd.uop.variable import bound_vars, is_sint, strip_sint


class JitError(RuntimeError):
    pass


class JitArgumentTypeError(JitError, ArgumentTypeError):
    """An argument of a type a capture cannot follow (a numpy array: its values would be captured, not read)."""


ArgKey = tuple[str, Any]  # ("arg", position) or ("kw", name)


def _split_args(args: tuple, kwargs: dict) -> tuple[dict[ArgKey, Any], dict[ArgKey, Any]]:
    """(the Tensor arguments, the other arguments), each keyed by position or keyword name."""
    from zeptograd.tensor import Tensor

    tensors: dict[ArgKey, Any] = {}
    others: dict[ArgKey, Any] = {}
    items = [(("arg", i), a) for i, a in enumerate(args)] + [(("kw", k), kwargs[k]) for k in sorted(kwargs)]
    for key, a in items:
        if isinstance(a, Tensor) and a.uop.op is Ops.MULTI:  # sharded (tensor/multi.py): each device's part an input
            for j, part in enumerate(multi.parts(a)):
                tensors[(key[0], (key[1], j))] = part
        elif isinstance(a, Tensor):
            tensors[key] = a
        else:
            if (held := _holds(a)) is not None:
                if held is Tensor:
                    raise JitError(
                        f"TinyJit: argument {_name(key)} is a {type(a).__name__} holding tensors; pass each "
                        f"input tensor as its own argument"
                    )
                raise JitArgumentTypeError(
                    f"TinyJit: argument {_name(key)} is {'' if a is held else 'a ' + type(a).__name__ + ' holding '}"
                    f"a numpy array; pass a Tensor (a replay would not read the array's values)"
                )
            others[key] = a
    return tensors, others


def _holds(a: Any, depth: int = 0) -> Any:
    """Tensor if `a` is or holds a Tensor, the array if it is or holds a numpy array, else None."""
    from zeptograd.tensor import Tensor

    if isinstance(a, Tensor):
        return Tensor
    if type(a).__name__ == "ndarray" and type(a).__module__ == "numpy":  # without importing numpy here
        return a
    if depth > 4:
        return None
    if isinstance(a, (list, tuple, set, frozenset)):
        return next((h for x in a if (h := _holds(x, depth + 1)) is not None), None)
    if isinstance(a, dict):
        return next((h for x in a.values() if (h := _holds(x, depth + 1)) is not None), None)
    return None


def _name(key: ArgKey) -> str:
    return f"#{key[1]}" if key[0] == "arg" else repr(key[1])


def _snapshot(a: Any) -> Any:
    """What a capture keeps of a non-Tensor argument: lists, tuples and dicts copied (a list mutated in place
    between calls must not compare equal to itself), other values as they are."""
    if type(a) in (list, tuple):
        return type(a)(_snapshot(x) for x in a)
    if type(a) is dict:
        return {k: _snapshot(v) for k, v in a.items()}
    return a


def _same_value(a: Any, b: Any, top: bool = True) -> bool:
    """Whether argument `a` may replay a capture made with `b` (a _snapshot): equal values of the same types, lists
    and tuples element by element (1, 1.0 and True differ: they promote differently); at the top, a bound Variable
    equals any binding of the same Variable."""
    if type(a) is not type(b):
        return False
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(_same_value(x, y, False) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(_same_value(a[k], b[k], False) for k in a)
    if type(a) is float:  # nan equals nan, -0.0 is not 0.0
        return (a == b and math.copysign(1.0, a) == math.copysign(1.0, b)) or (a != a and b != b)
    if a is b:
        return True
    if top and isinstance(a, UOp) and is_sint(a) and is_sint(b):  # bound Variables: any value
        return strip_sint(a) is strip_sint(b)
    try:
        eq = a == b
        if isinstance(eq, bool):
            return eq
        import numpy as np

        return bool(np.array_equal(a, b))
    except Exception:
        return False


def _flat_outputs(outs: list) -> tuple[list, list[tuple[int, int | None] | None]]:
    """The outputs with each sharded one (tensor/multi.py) as its parts, and per output (its part count, its
    axis) where it was sharded, else None: what `_regroup` puts together again on a replay."""
    flat: list = []
    groups: list[tuple[int, int | None] | None] = []
    for t in outs:
        if t.uop.op is Ops.MULTI:
            parts = multi.parts(t)
            flat.extend(parts)
            groups.append((len(parts), t.uop.arg))
        else:
            flat.append(t)
            groups.append(None)
    return flat, groups


def _regroup(flat: list, groups: list[tuple[int, int | None] | None]) -> list:
    from zeptograd.tensor import Tensor

    outs, i = [], 0
    for g in groups:
        if g is None:
            outs.append(flat[i])
            i += 1
        else:
            parts = flat[i : i + g[0]]
            outs.append(Tensor(multi.multi([p.uop for p in parts], g[1]), device=tuple(p.device for p in parts)))
            i += g[0]
    return outs


def _outputs(ret: Any) -> list:
    from zeptograd.tensor import Tensor

    if ret is None:
        return []
    if isinstance(ret, Tensor):
        return [ret]
    if isinstance(ret, (tuple, list)) and all(isinstance(t, Tensor) for t in ret):
        return list(ret)
    raise JitError(f"TinyJit: the function must return a Tensor, a tuple/list of Tensors or None, not {_describe(ret)}")


def _describe(ret: Any) -> str:
    if isinstance(ret, (tuple, list)):
        return f"a {type(ret).__name__} of ({', '.join(type(x).__name__ for x in ret)})"
    return f"a {type(ret).__name__}"


def _wrap(ret: Any, outs: list) -> Any:
    """The outputs in the structure the function returned them."""
    if ret is None:
        return None
    if isinstance(ret, (tuple, list)):
        return type(ret)(outs)
    return outs[0]


def _value(u: UOp) -> UOp:
    """A tensor's value: its uop, or what the uop was realized to (a tensor that requires grad keeps its graph)."""
    return u if view_base(u) is not None else _realize._realized.get(u, u)


def _whole_buffer(u: UOp) -> Buffer | None:
    """The Buffer behind a realized tensor's uop (a BUFFER or a reshape of one; for a symbolic shape, a view of its
    first elements), else None."""
    base = view_base(u)
    if base is None and (value := _realize._realized.get(u)) is not None:  # view_base(_value(u)), one view_base less
        base = view_base(value)
    return buffers[base] if base is not None else None


def _var_vals(tensors: dict[ArgKey, Any], others: dict[ArgKey, Any]) -> dict[str, int]:
    """The values of the Variables in the inputs' shapes and in bound Variables passed as arguments, by name."""
    found: dict[UOp, int] = {}
    for t in tensors.values():
        for var, val in bound_vars(t.shape).items():
            found.setdefault(var, val)
    for a in others.values():
        if isinstance(a, UOp) and is_sint(a):
            for var, val in bound_vars(a).items():
                found.setdefault(var, val)
    return {var.arg[0]: val for var, val in found.items()}


def _copy_buffer(b: Buffer) -> Buffer:
    new = Buffer(b.device, b.size, b.dtype)
    ctypes.memmove(new.ptr, b.ptr, b.nbytes)
    return new


def _buffer_tensor(buf: Buffer, shape: tuple[int, ...], device: str):
    from zeptograd.tensor import Tensor

    return Tensor(reshape_uop(new_buffer_uop(buf.device, buf.size, buf.dtype, buf), shape), device=device)
