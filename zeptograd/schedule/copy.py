"""COPY: a value moved to another device, scheduled as a copy item between the kernels.

`Tensor.to(device)` builds `COPY(value, DEVICE target)` in the tensor graph (lazily: nothing runs at the call, and
gradients flow through it). The scheduler realizes every COPY as its own `ScheduleItem` whose ast is
`COPY(DEVICE source, DEVICE target)` with arg = the bytes it moves and whose bufs are `[target buffer, source
buffer]`: no kernel, a copy through the devices' allocators (a memmove between host memories, else the source's
copyout and the target's copyin). Its source is materialized first, on the source device, unless it is already a
whole buffer; consumers on the target device read the COPY's buffer like any realized node's.
"""

from __future__ import annotations

import ctypes

from zeptograd.buffers import buffers, view_base
from zeptograd.device import Buffer, Device
from zeptograd.dtype import dtypes
from zeptograd.uop.ops import Ops, UOp


def tensor_device(u: UOp) -> str:
    """The device a tensor-graph node is computed on: a COPY's target, else its first source's (leaves: their DEVICE);
    O(depth of the first-source chain), no recursion. A sharded tensor's MULTI: the tuple of its parts' devices."""
    if u.op is Ops.MULTI:
        return tuple(tensor_device(p) for p in u.src)  # type: ignore[return-value]  # several devices (tensor/multi.py)
    while u.op is not Ops.DEVICE:
        u = u.src[1] if u.op is Ops.COPY else u.src[0]
    return u.arg


def copy_realizes(nodes: list[UOp]) -> set[UOp]:
    """The nodes a graph's copies need materialized: every COPY, and each COPY's source that is not already a whole
    buffer (a view of one, x.T, or a computed value gets its own kernel on the source device first)."""
    out: set[UOp] = set()
    for u in nodes:
        if u.op is Ops.COPY:
            out.add(u)
            if view_base(u.src[0]) is None:
                out.add(u.src[0])
    return out


def copy_item(x: UOp, bufs: dict[UOp, Buffer]) -> tuple[UOp, list[Buffer]]:
    """A realized COPY's schedule item: (COPY(DEVICE source, DEVICE target) with arg = the bytes it moves, [target
    buffer, source buffer]). The source buffer is its source's kernel output, or the whole buffer it is a view of."""
    dst, src = bufs[x], bufs.get(x.src[0])
    if src is None:
        base = view_base(x.src[0])
        assert base is not None, f"a COPY's source {x.src[0].op} was neither realized nor a whole buffer"
        src = buffers[base]
    devices = (UOp(Ops.DEVICE, arg=src.device), UOp(Ops.DEVICE, arg=dst.device))
    return UOp(Ops.COPY, dtypes.void, devices, dst.nbytes), [dst, src]


def copy_name(ast: UOp) -> str:
    return f"copy {ast.arg}B {ast.src[0].arg}->{ast.src[1].arg}"


class CopyProgram:
    """Runs a copy item; called as a kernel is, with the handles `Buffer.ptr` gives (target first), so run_schedule
    and TinyJit's replay (which patches its inputs' handles) treat it as one more call."""

    def __init__(self, ast: UOp):
        self.src_alloc, self.dst_alloc = Device[ast.src[0].arg].allocator, Device[ast.src[1].arg].allocator
        self.nbytes = ast.arg

    def __call__(self, dst, src, vals: tuple[int, ...] = ()):
        src_alloc, dst_alloc = self.src_alloc, self.dst_alloc
        if src_alloc.host and dst_alloc.host:
            ctypes.memmove(dst, src, self.nbytes)
            return
        src_mem = src_alloc.from_handle(src, self.nbytes)
        data = src_mem if src_alloc.host else src_alloc.copyout(src_mem)  # through host memory
        dst_alloc.copyin(dst_alloc.from_handle(dst, self.nbytes), data)
