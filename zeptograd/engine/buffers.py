"""The link between BUFFER UOps in graphs and the Buffer objects that hold their memory."""

from __future__ import annotations

import itertools
import weakref

from zeptograd.device import Buffer
from zeptograd.dtype import DType
from zeptograd.uop.ops import Ops, UOp

# a BUFFER UOp -> its Buffer; the Buffer lives exactly as long as some graph holds the UOp
buffers: weakref.WeakKeyDictionary[UOp, Buffer] = weakref.WeakKeyDictionary()
_buffer_ids = itertools.count()


def new_buffer_uop(device: str, size: int, dtype: DType, buf: Buffer | None = None) -> UOp:
    u = UOp(Ops.BUFFER, dtype, (UOp(Ops.DEVICE, arg=device),), (next(_buffer_ids), size))
    buffers[u] = buf if buf is not None else Buffer(device, size, dtype)
    return u


def reshape_uop(u: UOp, shape: tuple[int, ...]) -> UOp:
    return u if tuple(shape) == u.shape else UOp(Ops.RESHAPE, u.dtype, (u,), tuple(shape))
