"""Tensor-graph folding before rangeify: constants never become buffers.

`Tensor.ones(10)*15 + Tensor.ones(10)*30` folds to one constant broadcast to (10,), so it schedules no kernel.
"""

from __future__ import annotations

from zeptograd.buffers import _device_uops
from zeptograd.dtype import DType, dtypes, truncate
from zeptograd.helpers import prod
from zeptograd.schedule.copy import tensor_device
from zeptograd.uop.ops import GroupOp, Ops, UOp, exec_alu
from zeptograd.uop.upat import PatternMatcher, UPat

# (globals for const_broadcast: on 3.11 an Ops.X read goes through the enum metaclass's getattr hook, uop/ops.py)
_CONST, _DEVICE, _RESHAPE, _EXPAND = Ops.CONST, Ops.DEVICE, Ops.RESHAPE, Ops.EXPAND
_UNIFORM_MOVES = {Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.SHRINK, Ops.FLIP}  # PAD is not: it adds zeros


def const_broadcast(value, dtype: DType, device: str, shape: tuple[int, ...]) -> UOp:
    """A constant broadcast to `shape`: CONST -> RESHAPE to all ones -> EXPAND. It owns no buffer."""
    arg = value if isinstance(value, UOp) else truncate(dtype, value)  # a UOp: a symbolic int (a Variable)
    if (src := _device_uops.get(device)) is None:  # (the DEVICE node, held per device as buffers.py's BUFFERs' is)
        src = _device_uops[device] = (UOp(_DEVICE, arg=device),)
    c = UOp(_CONST, dtype, src, arg)
    if not shape:
        return c
    c = UOp(_RESHAPE, dtype, (c,), (1,) * len(shape))
    return c if shape.count(1) == len(shape) else UOp(_EXPAND, dtype, (c,), tuple(shape))


def uniform_const(u: UOp) -> UOp | None:
    """The CONST under a chain of movement ops that keep every element equal to it, else None."""
    while u.op in _UNIFORM_MOVES:
        u = u.src[0]
    return u if u.op is Ops.CONST else None


def _fold_alu(x: UOp) -> UOp | None:
    """# alu(const, const, ...) -> const, at the node's shape"""
    consts = [c for s in x.src if (c := uniform_const(s)) is not None and not isinstance(c.arg, UOp)]
    if len(consts) != len(x.src):
        return None  # a source that is not a constant, or a symbolic one (its value is known only when the kernel runs)
    device = consts[0].src[0].arg
    return const_broadcast(exec_alu(x.op, x.dtype, [c.arg for c in consts]), x.dtype, device, x.tensor_shape)


def _fold_reduce(x: UOp) -> UOp | None:
    """# sum(const) -> const*N ; max(const) -> const ; a reduce over an axis of size 0 -> its identity (no kernel,
    no loop of 0 iterations whose index arithmetic would divide by the 0)"""
    op, axes = x.arg
    if any(x.src[0].tensor_shape[a] == 0 for a in axes if isinstance(x.src[0].tensor_shape[a], int)):
        device = tensor_device(x)
        identity = {Ops.ADD: 0, Ops.MUL: 1, Ops.MAX: dtypes.min(x.dtype)}[op]
        return const_broadcast(identity, x.dtype, device, x.tensor_shape)
    c = uniform_const(x.src[0])
    if c is None or isinstance(c.arg, UOp):
        return None
    n = prod(x.src[0].tensor_shape[a] for a in axes)
    if isinstance(n, UOp):
        return None  # a reduce over a symbolic axis: its length is known only when the kernel runs
    if op is Ops.ADD:
        value = exec_alu(Ops.MUL, x.dtype, [c.arg, n])
    elif op is Ops.MAX:
        value = c.arg if n else dtypes.min(x.dtype)
    else:
        return None
    return const_broadcast(value, x.dtype, c.src[0].arg, x.tensor_shape)


def _fold_copy(x: UOp) -> UOp | None:
    """# copy(const, device) -> const on that device: a constant has no memory to move"""
    c = uniform_const(x.src[0])
    return None if c is None else const_broadcast(c.arg, c.dtype, x.src[1].arg, x.tensor_shape)


def _canonical_const(x: UOp) -> UOp | None:
    """# movement(const) -> the canonical broadcast of that const, so equal constants are one UOp"""
    c = uniform_const(x)
    if c is None:
        return None
    return const_broadcast(c.arg, c.dtype, c.src[0].arg, x.tensor_shape)


tensor_fold = PatternMatcher(
    [
        (UPat(GroupOp.ALU | {Ops.CAST}, name="x"), _fold_alu),
        (UPat(Ops.REDUCE_AXIS, name="x"), _fold_reduce),
        (UPat(_UNIFORM_MOVES, name="x"), _canonical_const),
        (UPat(Ops.COPY, name="x"), _fold_copy),
        # detach(x) -> x: it only matters to gradients
        (UPat(Ops.DETACH, src=(UPat.var("x"),)), lambda x: x),
        # contiguous(contiguous(x)) -> contiguous(x)
        (UPat(Ops.CONTIGUOUS, src=(UPat(Ops.CONTIGUOUS, name="c"),)), lambda c: c),
    ]
)
