"""The link between BUFFER UOps in graphs and the Buffer objects that hold their memory."""

from __future__ import annotations

import itertools
import weakref

from zeptograd.device import Buffer
from zeptograd.dtype import DType
from zeptograd.uop.ops import Ops, UOp, fresh_uop

# a BUFFER UOp -> its Buffer; the Buffer lives exactly as long as some graph holds the UOp
buffers: weakref.WeakKeyDictionary[UOp, Buffer] = weakref.WeakKeyDictionary()
_buffer_ids = itertools.count()


_buffers_data = buffers.data  # type: ignore[attr-defined]  # its own dict of weak references (a store without a frame)
# the callback its references carry: the dict's own pop, which drops a dead node's entry without WeakKeyDictionary's
# Python frame (buffers is only iterated over a copy of its dict, engine/jit.py, so its iteration guard is moot)
_buffers_remove = _buffers_data.pop
_BUFFER = Ops.BUFFER  # (a global read: Ops.X goes through the enum metaclass's getattr hook on 3.11)
_NAMING_VIEW_OPS = frozenset((Ops.RESHAPE, Ops.PERMUTE, Ops.SHRINK, Ops.FLIP))  # (buffer_under's)
_device_uops: dict[str, tuple[UOp]] = {}  # device -> (its DEVICE uop,): the source of each BUFFER made on it


def new_buffer_uop(device: str, size: int, dtype: DType, buf: Buffer | None = None) -> UOp:
    if (src := _device_uops.get(device)) is None:
        src = _device_uops[device] = (UOp(Ops.DEVICE, arg=device),)
    u = fresh_uop(_BUFFER, dtype, src, (next(_buffer_ids), size), (size,))  # (a new id: no node has its key)
    _buffers_data[weakref.ref(u, _buffers_remove)] = buf if buf is not None else Buffer(device, size, dtype)
    return u


def reshape_uop(u: UOp, shape: tuple) -> UOp:
    """The tensor of `shape` on a BUFFER uop: a reshape, or for a symbolic shape (uop/variable.py) a reshape of the
    buffer's first prod(shape) elements (the buffer is as large as the shape's largest size)."""
    shape = tuple(shape)
    if shape == u.shape:
        return u
    if any(isinstance(s, UOp) for s in shape):
        from zeptograd.uop.variable import sint_prod

        n = sint_prod(shape)
        u = u if isinstance(n, int) and n == u.tensor_shape[0] else UOp(Ops.SHRINK, u.dtype, (u,), ((0, n),))
        return u if len(shape) == 1 else UOp(Ops.RESHAPE, u.dtype, (u,), shape)
    return UOp(Ops.RESHAPE, u.dtype, (u,), shape)


def buffer_under(u: UOp) -> UOp | None:
    """The BUFFER under a chain of view ops that name each element once (an ASSIGN's target, a realized value),
    None if u is not such a view of a buffer."""
    while u.op in _NAMING_VIEW_OPS:
        u = u.src[0]
    return u if u.op is _BUFFER else None


def view_base(u: UOp) -> UOp | None:
    """The BUFFER under a tensor that is a whole buffer (reshape_uop's forms: BUFFER, RESHAPE(BUFFER) with as many
    elements, and for a symbolic shape RESHAPE(SHRINK(BUFFER, ((0, prod(shape)),)))), else None."""
    base = u.src[0] if u.op is Ops.RESHAPE else u
    if base.op is Ops.BUFFER:
        return base if base.arg[1] == _numel(u.tensor_shape) else None
    if (
        base.op is Ops.SHRINK
        and base.src[0].op is Ops.BUFFER
        and base.arg[0][0] == 0
        and isinstance(base.arg[0][1], UOp)
    ):
        from zeptograd.uop.variable import sint_prod

        return base.src[0] if _same(base.arg[0][1], sint_prod(u.tensor_shape)) else None
    return None


def _numel(shape: tuple) -> object:
    n = 1
    for s in shape:
        n = n * s
    return n


def _same(a, b) -> bool:
    if a is b or (isinstance(a, int) and isinstance(b, int) and a == b):
        return True
    if isinstance(a, UOp) or isinstance(b, UOp):
        from zeptograd.uop.variable import sint_simplify

        d = sint_simplify(a - b) if isinstance(a, UOp) else sint_simplify(-(b - a))
        return isinstance(d, int) and d == 0
    return False
