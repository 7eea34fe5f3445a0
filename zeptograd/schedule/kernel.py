"""Kernel lowering: each materialized node becomes a kernel `SINK(END(STORE(INDEX(DEFINE_GLOBAL 0, idx), value),
*ranges))`. Reads of other materialized nodes and of input buffers become `LOAD(INDEX(...))` (gated by a pad's
validity), PAD becomes WHERE, REDUCE_AXIS becomes `REDUCE(value, *ranges)`; `renumber_ranges` makes equal kernels
equal graphs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zeptograd.device import Buffer
from zeptograd.dtype import dtypes
from zeptograd.schedule.fold import uniform_const
from zeptograd.schedule.indexing import Rangeify, Request, flat_index, pad_validity
from zeptograd.uop.ops import GroupOp, Ops, UOp
from zeptograd.uop.symbolic import and_terms
from zeptograd.uop.upat import graph_substitute


@dataclass
class ScheduleItem:
    ast: UOp  # SINK(END(STORE(INDEX(DEFINE_GLOBAL 0, idx), value), *ranges)) over DEFINE_GLOBALs; COPY: a copy item
    bufs: list[Buffer]  # DEFINE_GLOBAL i reads/writes bufs[i]; bufs[0] is the output
    device: str
    outputs: list[int] = field(default_factory=lambda: [0])


def lower_kernel(rf: Rangeify, roots: list[UOp], bufs: dict[UOp, Buffer]) -> tuple[UOp, list[Buffer]]:
    """One kernel storing every root (several roots share their loops: a multi-output kernel)."""
    slots: dict[Buffer, UOp] = {}

    def define_global(b: Buffer) -> UOp:
        if b not in slots:
            slots[b] = UOp(Ops.DEFINE_GLOBAL, b.dtype.ptr(b.size), (), len(slots))
        return slots[b]

    out_dgs = [define_global(bufs[root]) for root in roots]
    rngs = rf.kernel_ranges[roots[0]]
    memo: dict[tuple[UOp, Request], UOp] = {}
    stack: list[tuple[UOp, Request, bool]] = [(root, (rngs, None), False) for root in roots]
    while stack:
        x, req, srcs_done = stack.pop()
        if (x, req) in memo:
            continue
        leaf = lower_leaf(rf, x, req, roots, bufs, define_global)
        if leaf is not None:
            memo[(x, req)] = leaf
            continue
        subs = rf.src_requests(x, req)
        if not srcs_done:
            stack.append((x, req, True))
            stack.extend((s, sreq, False) for s, sreq, _ in subs if (s, sreq) not in memo)
            continue
        memo[(x, req)] = lower_node(rf, x, req, [memo[(s, sreq)] for s, sreq, _ in subs])
    stores = []
    for root, out_dg in zip(roots, out_dgs):
        idx, shape = rngs, root.tensor_shape
        if root.op is Ops.ASSIGN:  # store through the target's view ops into its buffer
            idx, _, shape = target_index(rf, root, (rngs, None))
        stores.append(out_dg.index(flat_index(idx, shape)).store(memo[(root, (rngs, None))]))
    body = stores[0] if len(stores) == 1 else UOp(Ops.GROUP, dtypes.void, tuple(stores))
    ast = body.end(*[r for r in rngs if r.op is Ops.RANGE]).sink()
    return renumber_ranges(ast), list(slots)


def target_index(rf: Rangeify, assign: UOp, req: Request) -> tuple[tuple[UOp, ...], UOp | None, tuple]:
    """Where an ASSIGN read (or written) at req lands in its target's buffer: (index, validity, buffer shape)."""
    tgt, treq = assign.src[0], req
    while tgt.op is not Ops.BUFFER:
        tgt, treq, _ = rf.src_requests(tgt, treq)[0]
    return treq[0], treq[1], tgt.tensor_shape


def lower_leaf(
    rf: Rangeify, x: UOp, req: Request, roots: list[UOp], bufs: dict[UOp, Buffer], define_global
) -> UOp | None:
    idx, valid = req
    if (c := uniform_const(x)) is not None:  # a symbolic constant (a Variable's value) is its cast expression
        return c.arg.cast(x.dtype) if isinstance(c.arg, UOp) else UOp.const(x.dtype, c.arg)
    if x.op is Ops.BUFFER or (x in rf.realize and x not in roots):
        dg, shape = define_global(bufs[x]), x.tensor_shape
        if x.op is Ops.ASSIGN:  # its value lives in the target's buffer, read through the target's view ops
            idx, valid, shape = target_index(rf, x, req)
        return dg.index(flat_index(idx, shape), valid).load()
    if x.op is Ops.IOTA:
        return idx[0].cast(x.dtype)
    return None


def lower_node(rf: Rangeify, x: UOp, req: Request, srcs: list[UOp]) -> UOp:
    if x.op in GroupOp.Movement:
        if x.op is Ops.PAD and (valid := pad_validity(x, req[0])) is not None and not gated_by(srcs[0], valid):
            return valid.where(srcs[0], UOp.const(x.dtype, 0))
        return srcs[0]
    if x.op is Ops.REDUCE_AXIS:
        ranges = tuple(r for r in rf.red_ranges[(x, req)] if r.op is Ops.RANGE)
        return UOp(Ops.REDUCE, x.dtype, (srcs[0], *ranges), x.arg[0]) if ranges else srcs[0]
    if x.op in (Ops.CONTIGUOUS, Ops.DETACH, Ops.ASSIGN):
        return srcs[0]
    if x.op in GroupOp.Elementwise:
        return UOp(x.op, x.dtype, tuple(srcs))
    raise NotImplementedError(f"rangeify can't lower {x.op} yet")


def renumber_ranges(ast: UOp) -> UOp:
    """Axis ids 0, 1, ... in nesting order, so equal kernels are equal graphs (and hit the compile cache)."""
    ranges = sorted((u for u in ast.toposort() if u.op is Ops.RANGE), key=lambda r: r.arg[0])
    mapping = {r: UOp.range(r.src[0], i, r.arg[1]) for i, r in enumerate(ranges)}
    return graph_substitute(ast, {k: v for k, v in mapping.items() if k is not v})


def gated_by(x: UOp, valid: UOp) -> bool:
    """x is a load whose gate already implies valid (a PAD of a buffer: the load reads 0 outside, no WHERE needed)."""
    if x.op is not Ops.LOAD or len(x.src[0].src) < 3:
        return False
    return set(and_terms(valid)) <= set(and_terms(x.src[0].src[2]))
