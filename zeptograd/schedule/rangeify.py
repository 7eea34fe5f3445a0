"""Rangeify: from a tensor graph to kernels (see ../shared/RANGEIFY.md for the algorithm's sketch).

Every tensor node is given the index expressions at which its consumers read it; movement ops become index
arithmetic over RANGEs. A node is materialized (a kernel output) when it is an output or CONTIGUOUS, when its
consumers need it at different indices and it holds a reduce, or when it is a reduce whose value does not vary
along a loop its consumer runs (it would be recomputed on each iteration). Everything else is inlined.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from zeptograd.device import Buffer
from zeptograd.dtype import dtypes
from zeptograd.engine.buffers import buffers, new_buffer_uop, reshape_uop
from zeptograd.helpers import prod, strides_for_shape
from zeptograd.schedule.fold import tensor_fold, uniform_const
from zeptograd.schedule.split_reduce import split_reduces
from zeptograd.uop.ops import AxisType, GroupOp, Ops, UOp
from zeptograd.uop.symbolic import symbolic
from zeptograd.uop.upat import graph_rewrite, graph_substitute

MAX_REQUESTS = 8  # distinct index sets for one inlined node before it is materialized instead
MAX_KERNEL_OPS = 2000  # a fused chain longer than this is cut: C compilers choke on 10^5-statement functions
IDENTITY = {Ops.ADD: 0, Ops.MAX: None, Ops.MUL: 1}

Request = tuple[tuple[UOp, ...], UOp | None]  # (index per dimension, validity or None)


@dataclass
class ScheduleItem:
    ast: UOp  # SINK(END(STORE(INDEX(DEFINE_GLOBAL 0, idx), value), *ranges)) over DEFINE_GLOBALs
    bufs: list[Buffer]  # DEFINE_GLOBAL i reads/writes bufs[i]; bufs[0] is the output
    device: str
    outputs: list[int] = field(default_factory=lambda: [0])


def simplify(u: UOp) -> UOp:
    return graph_rewrite(u, symbolic)


def flat_index(idx: tuple[UOp, ...], shape: tuple[int, ...]) -> UOp:
    ret = UOp.const(dtypes.index, 0)
    for i, st in zip(idx, strides_for_shape(shape)):
        ret = ret + i * st
    return simplify(ret)


def and_valid(a: UOp | None, b: UOp | None) -> UOp | None:
    if a is None or b is None:
        return a if b is None else b
    return simplify(a & b)


class Rangeify:
    def __init__(self, sink: UOp):
        self.sink = sink
        self.nodes = list(sink.toposort())
        self.axis = itertools.count()
        self.realize: set[UOp] = set()
        self.reqs: dict[UOp, dict[Request, set[UOp]]] = {}
        self.red_ranges: dict[tuple[UOp, Request], tuple[UOp, ...]] = {}
        self.kernel_ranges: dict[UOp, tuple[UOp, ...]] = {}
        self.has_reduce: dict[UOp, bool] = {}
        self.device: dict[UOp, str] = {}
        for u in self.nodes:  # which device each node is computed on
            srcs_dev = (self.device[s] for s in u.src if self.device[s])
            self.device[u] = u.arg if u.op is Ops.DEVICE else next(srcs_dev, "")

    def fresh_ranges(self, shape: tuple[int, ...], kind: AxisType) -> tuple[UOp, ...]:
        return tuple(UOp.range(s, next(self.axis), kind) if s != 1 else UOp.const(dtypes.index, 0) for s in shape)

    # --- how a node reads its sources, given the index it is read at ---
    def src_requests(self, x: UOp, req: Request) -> list[tuple[UOp, Request, tuple[UOp, ...]]]:
        """[(source, its request, new reduce ranges)] for node x read at `req`."""
        idx, valid = req
        op, arg = x.op, x.arg
        if op in (Ops.BUFFER, Ops.CONST, Ops.IOTA, Ops.DEVICE):
            return []
        src = x.src[0]
        if op is Ops.RESHAPE:
            lin = flat_index(idx, x.shape)
            new = tuple(simplify((lin // st) % s) if s != 1 else UOp.const(dtypes.index, 0)
                        for st, s in zip(strides_for_shape(src.shape), src.shape))
            return [(src, (new, valid), ())]
        if op is Ops.PERMUTE:
            new_list: list[UOp] = [UOp.const(dtypes.index, 0)] * len(arg)
            for out_dim, in_dim in enumerate(arg):
                new_list[in_dim] = idx[out_dim]
            return [(src, (tuple(new_list), valid), ())]
        if op is Ops.EXPAND:
            new = tuple(UOp.const(dtypes.index, 0) if s == 1 else i for i, s in zip(idx, src.shape))
            return [(src, (new, valid), ())]
        if op is Ops.SHRINK:
            return [(src, (tuple(simplify(i + b) if b else i for i, (b, _) in zip(idx, arg)), valid), ())]
        if op is Ops.FLIP:
            new = tuple(simplify((s - 1) - i) if f else i for i, s, f in zip(idx, src.shape, arg))
            return [(src, (new, valid), ())]
        if op is Ops.PAD:
            new = tuple(simplify(i - b) if s != 1 else UOp.const(dtypes.index, 0)
                        for i, s, (b, _) in zip(idx, src.shape, arg))
            return [(src, (new, and_valid(valid, pad_validity(x, idx))), ())]
        if op is Ops.REDUCE_AXIS:
            key = (x, req)
            if key not in self.red_ranges:
                self.red_ranges[key] = self.fresh_ranges(tuple(src.shape[a] for a in arg[1]), AxisType.REDUCE)
            rr = iter(self.red_ranges[key])
            new = tuple(next(rr) if d in arg[1] else i for d, i in enumerate(idx))
            return [(src, (new, valid), tuple(r for r in self.red_ranges[key] if r.op is Ops.RANGE))]
        return [(s, req, ()) for s in x.src if s.op is not Ops.DEVICE]

    def must_realize(self, x: UOp, reqs: dict[Request, set[UOp]]) -> bool:
        if len(reqs) > 1 and (self.has_reduce[x] or len(reqs) > MAX_REQUESTS):
            return True  # different consumers need it at different places: compute it once
        if x.op is Ops.REDUCE_AXIS:
            for (idx, valid), scope in reqs.items():
                used = {r for i in idx for r in i.ranges}
                if scope - used:
                    return True  # it does not vary along a loop its consumer runs: don't recompute it there
        return False

    def broadcast_reduces(self) -> set[UOp]:
        """Reduces whose result is expanded later (softmax's max): computed once, never per element of the expand."""
        found: set[UOp] = set()
        seen: set[UOp] = set()
        stack = [u.src[0] for u in self.nodes if u.op is Ops.EXPAND]
        while stack:
            u = stack.pop()
            if u in seen or u.op is Ops.BUFFER or u in self.realize:
                continue
            seen.add(u)
            if u.op is Ops.REDUCE_AXIS:
                found.add(u)
            elif u.op in GroupOp.Movement or u.op in GroupOp.Elementwise:
                stack.extend(u.src)
        return found

    def long_chains(self) -> set[UOp]:
        """Nodes at which a fused chain of elementwise ops reaches MAX_KERNEL_OPS: materialized to cut it."""
        cut: set[UOp] = set()
        ops: dict[UOp, int] = {}
        for u in self.nodes:
            n = (u.op in GroupOp.ALU) + sum(ops[s] for s in u.src if s not in cut)
            if n > MAX_KERNEL_OPS and u.op in GroupOp.ALU:
                cut.add(u)
            ops[u] = min(n, MAX_KERNEL_OPS + 1)
        return cut

    # --- pass 2: walk from the outputs to the inputs, giving every node its requests ---
    def assign_ranges(self, outputs: set[UOp]):
        self.realize |= outputs | {u for u in self.nodes if u.op is Ops.CONTIGUOUS}
        self.realize |= self.broadcast_reduces()
        self.realize |= self.long_chains()
        for u in self.nodes:  # holds a reduce that is inlined, so recomputing it is costly
            self.has_reduce[u] = (u.op is Ops.REDUCE_AXIS or any(self.has_reduce[s] for s in u.src)) and \
                not (u in self.realize and u.op is Ops.REDUCE_AXIS)
        for x in reversed(self.nodes):
            if x.op in (Ops.SINK, Ops.DEVICE, Ops.BUFFER) or uniform_const(x) is not None:
                continue
            reqs = self.reqs.get(x, {})
            if x not in self.realize and self.must_realize(x, reqs):
                self.realize.add(x)
            if x in self.realize:
                rngs = self.fresh_ranges(x.shape, AxisType.LOOP)
                self.kernel_ranges[x] = rngs
                reqs = {(rngs, None): {r for r in rngs if r.op is Ops.RANGE}}
            for req, scope in reqs.items():
                for s, sreq, new_ranges in self.src_requests(x, req):
                    self.reqs.setdefault(s, {}).setdefault(sreq, set()).update(scope, new_ranges)

    # --- pass 3: build each kernel's graph ---
    def lower_kernel(self, root: UOp, bufs: dict[UOp, Buffer]) -> tuple[UOp, list[Buffer]]:
        slots: dict[Buffer, UOp] = {}

        def define_global(b: Buffer) -> UOp:
            if b not in slots:
                slots[b] = UOp(Ops.DEFINE_GLOBAL, b.dtype.ptr(b.size), (), len(slots))
            return slots[b]

        out_dg = define_global(bufs[root])
        rngs = self.kernel_ranges[root]
        memo: dict[tuple[UOp, Request], UOp] = {}
        stack: list[tuple[UOp, Request, bool]] = [(root, (rngs, None), False)]
        while stack:
            x, req, srcs_done = stack.pop()
            if (x, req) in memo:
                continue
            leaf = self.lower_leaf(x, req, root, bufs, define_global)
            if leaf is not None:
                memo[(x, req)] = leaf
                continue
            subs = self.src_requests(x, req)
            if not srcs_done:
                stack.append((x, req, True))
                stack.extend((s, sreq, False) for s, sreq, _ in subs if (s, sreq) not in memo)
                continue
            memo[(x, req)] = self.lower_node(x, req, [memo[(s, sreq)] for s, sreq, _ in subs])
        value = memo[(root, (rngs, None))]
        store = out_dg.index(flat_index(rngs, root.shape)).store(value)
        ast = store.end(*[r for r in rngs if r.op is Ops.RANGE]).sink()
        return renumber_ranges(ast), list(slots)

    def lower_leaf(self, x: UOp, req: Request, root: UOp, bufs: dict[UOp, Buffer], define_global) -> UOp | None:
        idx, valid = req
        if (c := uniform_const(x)) is not None:
            return UOp.const(x.dtype, c.arg)
        if x.op is Ops.BUFFER or (x in self.realize and x is not root):
            dg = define_global(bufs[x])
            return dg.index(flat_index(idx, x.shape), valid).load()
        if x.op is Ops.IOTA:
            return idx[0].cast(x.dtype)
        return None

    def lower_node(self, x: UOp, req: Request, srcs: list[UOp]) -> UOp:
        if x.op in GroupOp.Movement:
            if x.op is Ops.PAD and (valid := pad_validity(x, req[0])) is not None:
                return valid.where(srcs[0], UOp.const(x.dtype, 0))
            return srcs[0]
        if x.op is Ops.REDUCE_AXIS:
            ranges = tuple(r for r in self.red_ranges[(x, req)] if r.op is Ops.RANGE)
            return UOp(Ops.REDUCE, x.dtype, (srcs[0], *ranges), x.arg[0]) if ranges else srcs[0]
        if x.op in (Ops.CONTIGUOUS, Ops.DETACH):
            return srcs[0]
        if x.op in GroupOp.Elementwise:
            return UOp(x.op, x.dtype, tuple(srcs))
        raise NotImplementedError(f"rangeify can't lower {x.op} yet")


def renumber_ranges(ast: UOp) -> UOp:
    """Axis ids 0, 1, ... in nesting order, so equal kernels are equal graphs (and hit the compile cache)."""
    ranges = sorted((u for u in ast.toposort() if u.op is Ops.RANGE), key=lambda r: r.arg[0])
    mapping = {r: UOp.range(r.src[0], i, r.arg[1]) for i, r in enumerate(ranges)}
    return graph_substitute(ast, {k: v for k, v in mapping.items() if k is not v})


def pad_validity(x: UOp, idx: tuple[UOp, ...]) -> UOp | None:
    """Where a PAD read at `idx` lands inside its source: the AND over padded dims of 0 <= i-before < size."""
    valid = None
    for i, s, (b, _) in zip(idx, x.src[0].shape, x.arg):
        j = simplify(i - b)
        if j.vmin < 0 or j.vmax >= s:
            valid = and_valid(valid, simplify((j >= 0) & (j < s)))
    return valid


def create_schedule(outs: list[UOp]) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    """Kernels, in an order that respects their dependencies, and the buffer view that replaces each realized node."""
    sink = graph_rewrite(UOp(Ops.SINK, dtypes.void, tuple(outs)), tensor_fold)
    sink = split_reduces(sink)  # a big reduce to a small output: two kernels, the first parallel
    folded = dict(zip(outs, sink.src))
    outputs = {u for u in sink.src if needs_kernel(u)}
    rf = Rangeify(sink)
    rf.assign_ranges(outputs)
    bufs: dict[UOp, Buffer] = {}
    becomes: dict[UOp, UOp] = {}
    for x in rf.nodes:  # every realized node gets a buffer; buffer views of inputs stay as they are
        if x in rf.realize:
            buf_uop = new_buffer_uop(rf.device[x], prod(x.shape), x.dtype)
            bufs[x] = buffers[buf_uop]
            becomes[x] = reshape_uop(buf_uop, x.shape)
        elif x.op is Ops.BUFFER:
            bufs[x] = buffers[x]
    items = []
    for x in rf.nodes:
        if x not in rf.realize or prod(x.shape) == 0:
            continue
        ast, kbufs = rf.lower_kernel(x, bufs)
        items.append(ScheduleItem(ast, kbufs, rf.device[x]))
    result = {old: becomes.get(new, new) for old, new in folded.items()}
    for x, v in becomes.items():
        result.setdefault(x, v)
    return items, result


def needs_kernel(u: UOp) -> bool:
    """An output needs a kernel unless it is a constant or already a whole buffer."""
    if uniform_const(u) is not None:
        return False
    base = u.src[0] if u.op is Ops.RESHAPE else u
    return not (base.op is Ops.BUFFER and prod(u.shape) == base.arg[1])


def substitute_realized(outs: list[UOp], realized) -> list[UOp]:
    """Replace every node that was realized before by the buffer view holding its value."""
    sink = UOp(Ops.SINK, dtypes.void, tuple(outs))
    mapping = {u: realized[u] for u in sink.toposort(gate=lambda u: u not in realized) if u in realized}
    return list(graph_substitute(sink, mapping).src) if mapping else outs
