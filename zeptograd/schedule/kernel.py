"""Kernel lowering: the cut of the rangeified graph (`schedule/bufferize.py`) into kernels. Each remaining BUFFERIZE
(or group of outputs sharing their loops) becomes `SINK(END(STORE(INDEX(DEFINE_GLOBAL 0, idx), value), *ranges))`;
its reads of other BUFFERIZEs and of input buffers become `LOAD(INDEX(DEFINE_GLOBAL i, flat index[, valid]))`.
Ranges are renumbered in nesting order, so equal kernels are equal graphs. A row buffer (a BUFFERIZE marked `row`) is
lowered into the kernel that reads it (`lower_row_buffers`): a stack array written in its reduce's loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zeptograd.device import Buffer
from zeptograd.dtype import PtrDType, dtypes
from zeptograd.schedule.bufferize import index_parts, kernel_value_nodes, stored_shape
from zeptograd.schedule.indexing import Rangeify, Request, flat_index
from zeptograd.uop.ops import Ops, UOp
from zeptograd.uop.upat import graph_substitute


@dataclass
class ScheduleItem:
    ast: UOp  # SINK(END(STORE(INDEX(DEFINE_GLOBAL 0, idx), value), *ranges)) over DEFINE_GLOBALs; COPY: a copy item
    bufs: list[Buffer]  # DEFINE_GLOBAL i reads/writes bufs[i]; bufs[0] is the output
    device: str
    outputs: list[int] = field(default_factory=lambda: [0])


def split_kernel(rf: Rangeify, stored: list[UOp], bufs: dict[UOp, Buffer]) -> tuple[UOp, list[Buffer]]:
    """`SINK(END(STORE(INDEX(DEFINE_GLOBAL 0, idx), value), *ranges))` for BUFFERIZEs that share their ranges; the
    reads of other BUFFERIZEs and of buffers become `LOAD(INDEX(DEFINE_GLOBAL i, flat index[, valid]))`."""
    slots: dict[Buffer, UOp] = {}

    def define_global(b: Buffer) -> UOp:
        if b not in slots:
            slots[b] = UOp(Ops.DEFINE_GLOBAL, b.dtype.ptr(b.size), (), len(slots))
        return slots[b]

    out_dgs = [define_global(bufs[b.arg.node]) for b in stored]
    values = UOp(Ops.SINK, dtypes.void, tuple(b.src[0] for b in stored))
    nodes = kernel_value_nodes(values)  # this kernel's (and its row buffers'): not the kernels it reads
    # axis ids 0, 1, ... in nesting order, so equal kernels are equal graphs (and hit the compile cache)
    ranges = sorted({u for u in (*nodes, *stored[0].src[1:]) if u.op is Ops.RANGE}, key=lambda r: r.arg[0])
    renumbered = {r: UOp.range(r.src[0], i, r.arg[1]) for i, r in enumerate(ranges)}

    def at(exprs):
        return tuple(graph_substitute(e, renumbered) for e in exprs)

    mapping: dict[UOp, UOp] = {k: v for k, v in renumbered.items() if k is not v}
    for u in nodes:
        if u.op is not Ops.INDEX:
            continue
        target, idx, valid = index_parts(u)
        idx, valid = at(idx), at((valid,))[0] if valid is not None else None
        if target.op is Ops.BUFFERIZE and target.arg.row:  # lowered below, once its value is
            continue
        if target.op is not Ops.BUFFERIZE:  # an input buffer or a COPY's result, read at a flat index
            mapping[u] = define_global(bufs[target]).index(idx[0], valid).load()
        elif target.arg.node.op is Ops.ASSIGN:  # its value lives in the target's buffer, read through its views
            idx, valid, shape = target_index(rf, target.arg.node, (idx, valid))
            mapping[u] = define_global(bufs[target.arg.node]).index(flat_index(idx, shape), valid).load()
        else:
            mapping[u] = define_global(bufs[target.arg.node]).index(flat_index(idx, stored_shape(target)), valid).load()
    rngs = at(stored[0].src[1:])
    lowered = lower_row_buffers([u for u in nodes if u.op is Ops.BUFFERIZE and u.arg.row], values, mapping, at)
    stores = []
    for b, out_dg, value in zip(stored, out_dgs, lowered.src):
        idx, shape = rngs, stored_shape(b)
        if b.arg.node.op is Ops.ASSIGN:  # store through the target's view ops into its buffer
            idx, _, shape = target_index(rf, b.arg.node, (rngs, None))
        stores.append(out_dg.index(flat_index(idx, shape)).store(value))
    body = stores[0] if len(stores) == 1 else UOp(Ops.GROUP, dtypes.void, tuple(stores))
    return body.end(*[r for r in rngs if r.op is Ops.RANGE]).sink(), list(slots)


def lower_row_buffers(rows: list[UOp], values: UOp, mapping: dict[UOp, UOp], at) -> UOp:
    """values with each row buffer (BUFFERIZE(x, r), row) lowered to a stack array of the row's length:
    # INDEX(BUFFERIZE(x, r), r) -> AFTER(x, STORE(INDEX(buf, r), x))      the fill: x computed and stored in r's loop
    # INDEX(BUFFERIZE(x, r), j) -> LOAD(INDEX(AFTER(buf, REDUCE_r), j))  the other reads: after r's reduce is done
    buf = DEFINE_REG(ptr(n)): the renderers make it a C array or an alloca, and codegen vectorizes its accesses
    like a buffer's. mapping (the kernel's loads and renumbered ranges) is extended; the mapped values returned."""
    reads: dict[UOp, UOp] = {}
    computed: dict[UOp, UOp] = {}  # buf -> its value at the row's index r
    for k, b in enumerate(rows):
        n = stored_shape(b)[0]
        buf = UOp(Ops.DEFINE_REG, b.dtype.ptr(n), (), k)
        mapping[b] = buf  # every read at another index becomes INDEX(buf, j), made a LOAD below
        (r,) = at(b.src[1:])
        value = graph_substitute(b.src[0], mapping)
        mapping[UOp(Ops.INDEX, b.dtype, (b, b.src[1]))] = value.after(buf.index(r).store(value))
        reads[buf], computed[buf] = r, value
    lowered = graph_substitute(values, mapping)
    # a row buffer whose fill (its reduce over the row) went to another kernel (a reader of an older version) is
    # computed at each read here. Its value reads only earlier row buffers and may hold an earlier one's fill (the exp
    # row's value: the scores row's max), so the recomputations go last to first, all before any load is made: the
    # reads they bring in are then loaded below, and an earlier row buffer's fill is found where they brought it
    for buf, r in reversed(reads.items()):
        nodes = lowered.toposort()
        if not any(u.op is Ops.REDUCE and r in u.src[1:] for u in nodes):
            recomputed = {u: computed[buf].substitute({r: u.src[1]}) for u in nodes if _row_read(u, buf, r)}
            lowered = graph_substitute(lowered, recomputed)
    # one row buffer at a time, in the order they are filled: a later fill's reduce reads an earlier row buffer
    # (attention's exp reads the scores row), so its loads are made first and the later reads wait for that reduce
    for buf, r in reads.items():
        nodes = lowered.toposort()
        fill = next((u for u in nodes if u.op is Ops.REDUCE and r in u.src[1:]), None)
        if fill is not None:
            loads = {u: buf.after(fill).index(*u.src[1:]).load() for u in nodes if _row_read(u, buf, r)}
            lowered = graph_substitute(lowered, loads)
    return lowered


def _row_read(u: UOp, buf: UOp, r: UOp) -> bool:
    """u reads the row buffer buf at an index other than its fill's range r (the fill stores there). A pointer INDEX
    is a store's target, not a read: a recomputed row's value holds the fills of the rows filled in the same loop
    (batchnorm's mean and variance rows), whose stores the recomputation moved to the read's index."""
    return u.op is Ops.INDEX and u.src[0] is buf and u.src[1] is not r and not isinstance(u.dtype, PtrDType)


def target_index(rf: Rangeify, assign: UOp, req: Request) -> tuple[tuple[UOp, ...], UOp | None, tuple]:
    """Where an ASSIGN read (or written) at req lands in its target's buffer: (index, validity, buffer shape)."""
    tgt, treq = assign.src[0], req
    while tgt.op is not Ops.BUFFER:
        tgt, treq, _ = rf.src_requests(tgt, treq)[0]
    return treq[0], treq[1], tgt.tensor_shape
