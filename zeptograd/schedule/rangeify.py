"""Rangeify: from a tensor graph to kernels.

Every tensor node is given the index expressions at which its consumers read it; movement ops become index
arithmetic over RANGEs. A node is materialized (a kernel output) when it is an output or CONTIGUOUS, when its
consumers need it at different indices and it holds a reduce, or when it is a reduce whose value does not vary
along a loop its consumer runs (it would be recomputed on each iteration). Everything else is inlined.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from zeptograd.buffers import buffer_under, buffers, new_buffer_uop, reshape_uop, view_base
from zeptograd.device import Buffer
from zeptograd.dtype import dtypes
from zeptograd.helpers import prod, strides_for_shape
from zeptograd.schedule.copy import copy_item, copy_realizes
from zeptograd.schedule.fold import tensor_fold, uniform_const
from zeptograd.schedule.memory import plan_memory
from zeptograd.schedule.split_reduce import split_reduces
from zeptograd.uop.ops import AxisType, GroupOp, Ops, UOp
from zeptograd.uop.spec import check_tensor_graph
from zeptograd.uop.symbolic import symbolic
from zeptograd.uop.upat import graph_rewrite, graph_substitute

MAX_REQUESTS = 8  # distinct index sets for one inlined node before it is materialized instead
MAX_KERNEL_BUFS = 30  # input buffers one kernel may read (OpenCL guarantees few arguments)
MAX_KERNEL_OPS = 2000  # a fused chain longer than this is cut: C compilers choke on 10^5-statement functions
MIN_EPILOGUE_SPLIT_OUTPUTS = 1 << 16  # a reduce with this many outputs ...
MIN_EPILOGUE_SPLIT_REDUCE = 64  # ... each over this many inputs keeps a transcendental epilogue out of its kernel

Request = tuple[tuple[UOp, ...], UOp | None]  # (index per dimension, validity or None)


@dataclass
class ScheduleItem:
    ast: UOp  # SINK(END(STORE(INDEX(DEFINE_GLOBAL 0, idx), value), *ranges)) over DEFINE_GLOBALs; COPY: a copy item
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
        self.group_ranges: dict[UOp, tuple[UOp, ...]] = {}  # outputs computed in one kernel share their loops
        for u in self.nodes:  # which device each node is computed on
            srcs_dev = (self.device[s] for s in u.src if self.device[s])
            self.device[u] = u.arg if u.op is Ops.DEVICE else u.src[1].arg if u.op is Ops.COPY else next(srcs_dev, "")

    def fresh_ranges(self, shape: tuple[int, ...], kind: AxisType) -> tuple[UOp, ...]:
        return tuple(UOp.range(s, next(self.axis), kind) if s != 1 else UOp.const(dtypes.index, 0) for s in shape)

    # --- how a node reads its sources, given the index it is read at ---
    def src_requests(self, x: UOp, req: Request) -> list[tuple[UOp, Request, tuple[UOp, ...]]]:
        """[(source, its request, new reduce ranges)] for node x read at `req`."""
        idx, valid = req
        op, arg = x.op, x.arg
        if op in (Ops.BUFFER, Ops.CONST, Ops.IOTA, Ops.DEVICE, Ops.COPY):  # a COPY's source: not read by a kernel
            return []
        if op is Ops.ASSIGN:  # the value is read where the target is written; the target itself is not read
            return [(x.src[1], req, ())]
        src = x.src[0]
        if op is Ops.RESHAPE:
            # the outermost dimension needs no `% size`: where the read is valid, lin is in range
            lin = flat_index(idx, x.shape)
            new = tuple(
                UOp.const(dtypes.index, 0) if s == 1 else simplify(lin // st if i == 0 else (lin // st) % s)
                for i, (st, s) in enumerate(zip(strides_for_shape(src.shape), src.shape))
            )
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
            new = tuple(
                simplify(i - b) if s != 1 else UOp.const(dtypes.index, 0) for i, s, (b, _) in zip(idx, src.shape, arg)
            )
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
        if len(reqs) > 1 and (self.has_reduce[x] or len(reqs) > MAX_REQUESTS) and x.op not in GroupOp.Movement:
            return True  # different consumers need it at different places: compute it once (a view: its source)
        if x.op is Ops.REDUCE_AXIS:
            for (idx, valid), scope in reqs.items():
                used = {r for i in idx for r in i.ranges}
                if scope - used:
                    return True  # it does not vary along a loop its consumer runs: don't recompute it there
        if x.op is Ops.PAD and self.reads_buffer(x) and prod(x.shape) <= 4 * prod(x.src[0].shape):
            window = [req for req in reqs if any(_is_window(i) for i in req[0])]
            if window and not self.plain_read(x, window[0]):
                return True  # a window over computed values or read through divmods: a padded copy, computed once
        return False

    def plain_read(self, x: UOp, req: Request) -> bool:
        """Whether x read at req is a buffer read through view ops whose index and validity do not divide: one load.
        Not a prologue (bn + relu before a conv: recomputed for every window position and output channel) nor a
        reshape that does not fold away or a zero-inserting pad (conv_transpose's input: divmods on every read)."""
        while x.op in GroupOp.Movement:
            x, req, _ = self.src_requests(x, req)[0]
        exprs = [*req[0]] + ([req[1]] if req[1] is not None else [])
        return x.op is Ops.BUFFER and not any(u.op in (Ops.IDIV, Ops.MOD) for e in exprs for u in e.toposort())

    def costly_nodes(self) -> dict[UOp, bool]:
        """Whether the ops inlined into a node (up to buffers, reduces and nodes already realized) hold a
        transcendental and read a buffer; index-only expressions (arange masks) stay cheap to recompute."""
        trans: dict[UOp, bool] = {}
        reads: dict[UOp, bool] = {}
        for u in self.nodes:
            stop = u.op is Ops.REDUCE_AXIS or u in self.realize
            trans[u] = not stop and (u.op in GroupOp.Transcendental or any(trans[s] for s in u.src))
            reads[u] = u.op is Ops.BUFFER or stop or any(reads[s] for s in u.src)
        return {u: trans[u] and reads[u] for u in self.nodes}

    def contractions_with_costly_epilogue(self) -> set[UOp]:
        """Large reduces over many inputs (matmuls) whose elementwise consumers hold a transcendental (gelu, sigmoid):
        stored, and the epilogue is its own elementwise kernel. Fused, the epilogue would run once per output of a
        tile of dot products, on scalars (x @ w.T's tile reduces its vector lanes to one value per output); its own
        kernel runs it 16 lanes wide for one more pass over the output (about 3% of such a matmul)."""
        consumers: dict[UOp, list[UOp]] = {}
        for u in self.nodes:
            for s in u.src:
                consumers.setdefault(s, []).append(u)
        found: set[UOp] = set()
        for x in self.nodes:
            if (
                x.op is not Ops.REDUCE_AXIS
                or x in self.realize
                or prod(x.shape) < MIN_EPILOGUE_SPLIT_OUTPUTS
                or prod(x.src[0].shape) < MIN_EPILOGUE_SPLIT_REDUCE * prod(x.shape)
            ):
                continue
            stack, seen = list(consumers.get(x, [])), set()
            while stack:
                u = stack.pop()
                if u in seen or u in self.realize or u.op not in GroupOp.Elementwise | {Ops.RESHAPE, Ops.PERMUTE}:
                    continue
                seen.add(u)
                if u.op in GroupOp.Transcendental:
                    found.add(x)
                    break
                stack.extend(consumers.get(u, []))
        return found

    def costly_expanded_into_reduce(self) -> set[UOp]:
        """Costly elementwise nodes that reach a reduce through an EXPAND (a layernorm or gelu before a matmul):
        inlined, they would be recomputed for every element of the expanded axis, e.g. once per output column."""
        costly = self.costly_nodes()
        found: set[UOp] = set()
        seen: set[UOp] = set()
        stack = [(u.src[0], False) for u in self.nodes if u.op is Ops.REDUCE_AXIS]
        while stack:
            u, expanded = stack.pop()
            if (u, expanded) in seen or u.op is Ops.BUFFER or u.op is Ops.REDUCE_AXIS or u in self.realize:
                continue
            seen.add((u, expanded))
            if expanded and u.op in GroupOp.Elementwise and costly[u]:
                found.add(u)
            elif u.op in GroupOp.Movement or u.op in GroupOp.Elementwise:
                grows = u.op is Ops.EXPAND and prod(u.shape) > prod(u.src[0].shape)
                stack.extend((s, expanded or grows) for s in u.src)
        return found

    def reads_buffer(self, x: UOp) -> bool:
        return any(u.op is Ops.BUFFER for u in x.toposort(gate=lambda u: u.op is not Ops.BUFFER))

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
        """Where a fused chain of elementwise ops reaches MAX_KERNEL_OPS ops or MAX_KERNEL_BUFS input buffers:
        materialized there to cut it (C compilers choke on huge functions; GPUs limit kernel arguments)."""
        cut: set[UOp] = set()
        ops: dict[UOp, int] = {}
        bufs: dict[UOp, frozenset[UOp]] = {}
        for u in self.nodes:
            n = (u.op in GroupOp.ALU) + sum(ops[s] for s in u.src if s not in cut)
            if n > MAX_KERNEL_OPS:  # the sum counts shared subexpressions once per use (erf's polynomial): recount
                n = self.distinct_alu_ops(u, cut, MAX_KERNEL_OPS + 1)
            b = frozenset([u]) if u.op is Ops.BUFFER else frozenset().union(*[bufs[s] for s in u.src if s not in cut])
            if u.op in GroupOp.ALU and (n > MAX_KERNEL_OPS or len(b) > MAX_KERNEL_BUFS):
                cut.add(u)
                n, b = 0, frozenset()
            ops[u], bufs[u] = min(n, MAX_KERNEL_OPS + 1), b
        return cut

    @staticmethod
    def distinct_alu_ops(u: UOp, cut: set[UOp], limit: int) -> int:
        """ALU nodes in u's fused subgraph (stopping at cuts), counted once each, up to limit."""
        seen: set[UOp] = set()
        stack, n = [u], 0
        while stack and n < limit:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            n += x.op in GroupOp.ALU
            stack.extend(s for s in x.src if s not in cut)
        return n

    # --- pass 2: walk from the outputs to the inputs, giving every node its requests ---
    def assign_ranges(self, outputs: set[UOp]):
        self.realize |= outputs | {u for u in self.nodes if u.op in (Ops.CONTIGUOUS, Ops.ASSIGN)}
        self.realize |= copy_realizes(self.nodes)  # every COPY, and its source unless that is a whole buffer
        self.realize |= self.long_chains()
        self.realize |= self.costly_expanded_into_reduce()
        self.realize |= self.contractions_with_costly_epilogue()
        self.realize |= self.broadcast_reduces()
        for u in self.nodes:  # holds a reduce that is inlined, so recomputing it is costly
            self.has_reduce[u] = (
                u.op is Ops.REDUCE_AXIS or any(self.has_reduce[s] for s in u.src)
            ) and u not in self.realize
        for x in reversed(self.nodes):
            if x.op in (Ops.SINK, Ops.DEVICE, Ops.BUFFER) or uniform_const(x) is not None:
                continue
            reqs = self.reqs.get(x, {})
            if x not in self.realize and self.must_realize(x, reqs):
                self.realize.add(x)
            if x in self.realize:
                rngs = self.group_ranges.get(x) or self.fresh_ranges(x.shape, AxisType.LOOP)
                self.kernel_ranges[x] = rngs
                reqs = {(rngs, None): {r for r in rngs if r.op is Ops.RANGE}}
            for req, scope in reqs.items():
                for s, sreq, new_ranges in self.src_requests(x, req):
                    self.reqs.setdefault(s, {}).setdefault(sreq, set()).update(scope, new_ranges)

    # --- pass 3: build each kernel's graph ---
    def lower_kernel(self, roots: list[UOp], bufs: dict[UOp, Buffer]) -> tuple[UOp, list[Buffer]]:
        """One kernel storing every root (several roots share their loops: a multi-output kernel)."""
        slots: dict[Buffer, UOp] = {}

        def define_global(b: Buffer) -> UOp:
            if b not in slots:
                slots[b] = UOp(Ops.DEFINE_GLOBAL, b.dtype.ptr(b.size), (), len(slots))
            return slots[b]

        out_dgs = [define_global(bufs[root]) for root in roots]
        rngs = self.kernel_ranges[roots[0]]
        memo: dict[tuple[UOp, Request], UOp] = {}
        stack: list[tuple[UOp, Request, bool]] = [(root, (rngs, None), False) for root in roots]
        while stack:
            x, req, srcs_done = stack.pop()
            if (x, req) in memo:
                continue
            leaf = self.lower_leaf(x, req, roots, bufs, define_global)
            if leaf is not None:
                memo[(x, req)] = leaf
                continue
            subs = self.src_requests(x, req)
            if not srcs_done:
                stack.append((x, req, True))
                stack.extend((s, sreq, False) for s, sreq, _ in subs if (s, sreq) not in memo)
                continue
            memo[(x, req)] = self.lower_node(x, req, [memo[(s, sreq)] for s, sreq, _ in subs])
        stores = []
        for root, out_dg in zip(roots, out_dgs):
            idx, shape = rngs, root.shape
            if root.op is Ops.ASSIGN:  # store through the target's view ops into its buffer
                tgt, treq = root.src[0], (rngs, None)
                while tgt.op is not Ops.BUFFER:
                    tgt, treq, _ = self.src_requests(tgt, treq)[0]
                idx, shape = treq[0], tgt.shape
            stores.append(out_dg.index(flat_index(idx, shape)).store(memo[(root, (rngs, None))]))
        body = stores[0] if len(stores) == 1 else UOp(Ops.GROUP, dtypes.void, tuple(stores))
        ast = body.end(*[r for r in rngs if r.op is Ops.RANGE]).sink()
        return renumber_ranges(ast), list(slots)

    def lower_leaf(self, x: UOp, req: Request, roots: list[UOp], bufs: dict[UOp, Buffer], define_global) -> UOp | None:
        idx, valid = req
        if (c := uniform_const(x)) is not None:  # a symbolic constant (a Variable's value) is its cast expression
            return c.arg.cast(x.dtype) if isinstance(c.arg, UOp) else UOp.const(x.dtype, c.arg)
        if x.op is Ops.BUFFER or (x in self.realize and x not in roots):
            dg = define_global(bufs[x])
            return dg.index(flat_index(idx, x.shape), valid).load()
        if x.op is Ops.IOTA:
            return idx[0].cast(x.dtype)
        return None

    def lower_node(self, x: UOp, req: Request, srcs: list[UOp]) -> UOp:
        if x.op in GroupOp.Movement:
            if x.op is Ops.PAD and (valid := pad_validity(x, req[0])) is not None and not gated_by(srcs[0], valid):
                return valid.where(srcs[0], UOp.const(x.dtype, 0))
            return srcs[0]
        if x.op is Ops.REDUCE_AXIS:
            ranges = tuple(r for r in self.red_ranges[(x, req)] if r.op is Ops.RANGE)
            return UOp(Ops.REDUCE, x.dtype, (srcs[0], *ranges), x.arg[0]) if ranges else srcs[0]
        if x.op in (Ops.CONTIGUOUS, Ops.DETACH, Ops.ASSIGN):
            return srcs[0]
        if x.op in GroupOp.Elementwise:
            return UOp(x.op, x.dtype, tuple(srcs))
        raise NotImplementedError(f"rangeify can't lower {x.op} yet")


def _is_window(i: UOp) -> bool:
    """An index that moves with both an output loop and a reduce loop: a sliding window (conv, pooling)."""
    kinds = {r.arg[1] for r in i.ranges}
    return AxisType.LOOP in kinds and AxisType.REDUCE in kinds


def renumber_ranges(ast: UOp) -> UOp:
    """Axis ids 0, 1, ... in nesting order, so equal kernels are equal graphs (and hit the compile cache)."""
    ranges = sorted((u for u in ast.toposort() if u.op is Ops.RANGE), key=lambda r: r.arg[0])
    mapping = {r: UOp.range(r.src[0], i, r.arg[1]) for i, r in enumerate(ranges)}
    return graph_substitute(ast, {k: v for k, v in mapping.items() if k is not v})


def and_terms(u: UOp) -> set[UOp]:
    """The conjuncts of a bool expression: (a & b) & c -> {a, b, c}."""
    out, stack = set(), [u]
    while stack:
        x = stack.pop()
        if x.op is Ops.AND and x.dtype == dtypes.bool:
            stack.extend(x.src)
        else:
            out.add(x)
    return out


def gated_by(x: UOp, valid: UOp) -> bool:
    """x is a load whose gate already implies valid (a PAD of a buffer: the load reads 0 outside, no WHERE needed)."""
    if x.op is not Ops.LOAD or len(x.src[0].src) < 3:
        return False
    return and_terms(valid) <= and_terms(x.src[0].src[2])


def pad_validity(x: UOp, idx: tuple[UOp, ...]) -> UOp | None:
    """Where a PAD read at `idx` lands inside its source: the AND over padded dims of 0 <= i-before < size."""
    valid = None
    for i, s, (b, _) in zip(idx, x.src[0].shape, x.arg):
        j = simplify(i - b)
        if j.vmin < 0 or isinstance(s, UOp) or j.vmax >= s:  # a symbolic size: always checked
            valid = and_valid(valid, simplify((j >= 0) & (j < s)))
    return valid


def create_schedule(outs: list[UOp]) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    """Kernels, in an order that respects their dependencies, and the buffer view that replaces each realized node."""
    sink = graph_rewrite(UOp(Ops.SINK, dtypes.void, tuple(outs)), tensor_fold)
    sink = split_reduces(sink)  # a big reduce to a small output: two kernels, the first parallel
    check_tensor_graph(sink)
    folded = dict(zip(outs, sink.src))
    outputs = {u for u in sink.src if needs_kernel(u)}
    rf = Rangeify(sink)
    groups = group_outputs(rf, outputs)
    rf.assign_ranges(outputs)
    bufs: dict[UOp, Buffer] = {}
    becomes: dict[UOp, UOp] = {}
    for x in rf.nodes:  # every realized node gets a buffer; buffer views of inputs stay as they are
        if x.op is Ops.ASSIGN:  # writes into its target's existing buffer
            old = buffer_under(x.src[0])
            bufs[x] = buffers[old]
            # the target's new contents get a new BUFFER UOp over the same memory: graphs realized from the old
            # contents (the `realized` map is keyed by graph) never answer for the new ones
            new = new_buffer_uop(rf.device[x], old.arg[1], old.dtype, buffers[old])
            becomes[x] = x.src[0].substitute({old: new})
        elif x in rf.realize:
            buf_uop = new_buffer_uop(rf.device[x], max_size(x.shape), x.dtype)
            bufs[x] = buffers[buf_uop]
            becomes[x] = reshape_uop(buf_uop, x.shape)
        elif x.op is Ops.BUFFER:
            bufs[x] = buffers[x]
    items = []
    for x in order_assigns(rf.nodes, [x for x in rf.nodes if x in rf.realize]):
        if prod(x.shape) == 0 or (x in groups and x is not groups[x][-1]):
            continue  # a group of outputs is one kernel, placed where its last member is
        if x.op is Ops.COPY:  # a copy item, not a kernel (schedule/copy.py)
            items.append(ScheduleItem(*copy_item(x, bufs), rf.device[x]))
            continue
        members = groups.get(x, [x])
        ast, kbufs = rf.lower_kernel(members, bufs)
        items.append(ScheduleItem(ast, kbufs, rf.device[x], outputs=list(range(len(members)))))
    intermediates = {bufs[x] for x in rf.realize if x not in outputs and x.op is not Ops.ASSIGN}
    shared = plan_memory(items, intermediates)  # dead intermediates lend their memory to later ones
    reused = set(shared) | set(shared.values())
    becomes = {x: v for x, v in becomes.items() if x not in bufs or bufs[x] not in reused}
    result = {old: becomes.get(new, new) for old, new in folded.items()}
    for x, v in becomes.items():
        result.setdefault(x, v)
    return items, result


def group_outputs(rf: Rangeify, outputs: set[UOp]) -> dict[UOp, list[UOp]]:
    """Outputs of one shape on one device that nothing else reads: one kernel with a store for each."""
    read = {s for u in rf.nodes if u.op is not Ops.SINK for s in u.src}
    by_key: dict[tuple, list[UOp]] = {}
    for x in rf.nodes:
        if x in outputs and x not in read and x.op not in (Ops.ASSIGN, Ops.COPY) and prod(x.shape) > 0:
            by_key.setdefault((x.shape, rf.device[x]), []).append(x)
    groups: dict[UOp, list[UOp]] = {}
    for members in by_key.values():
        if len(members) > 1:
            shared = rf.fresh_ranges(members[0].shape, AxisType.LOOP)
            for m in members:
                groups[m], rf.group_ranges[m] = members, shared
    return groups


def order_assigns(nodes: list[UOp], kernels: list[UOp]) -> list[UOp]:
    """Kernels in an order that respects their data dependencies and, for each ASSIGN, reads before the write:
    a kernel that reads the assigned buffer's old contents (and does not depend on the ASSIGN) runs before it."""
    if not any(k.op is Ops.ASSIGN for k in kernels):
        return kernels
    kset = set(kernels)
    below: dict[UOp, frozenset[UOp]] = {}  # the kernels each node depends on, through any path
    for u in nodes:
        below[u] = frozenset().union(*(below[s] for s in u.src)) | ({u} if u in kset else frozenset())
    reads: dict[UOp, set[UOp]] = {}  # the buffers each kernel reads directly (not through another kernel)
    for k in kernels:
        srcs = k.src[1:] if k.op is Ops.ASSIGN else k.src
        reads[k] = {u for s in srcs for u in s.toposort(gate=lambda u: u not in kset) if u.op is Ops.BUFFER}
    after: dict[UOp, set[UOp]] = {k: {d for d in below[k] if d is not k} for k in kernels}
    for a in kernels:
        if a.op is Ops.ASSIGN:
            target = buffer_under(a.src[0])
            for k in kernels:
                if k is not a and target in reads[k] and a not in below[k]:
                    after[a].add(k)  # k reads the old contents: it runs first
    order, done, pending = [], set(), list(kernels)
    while pending:
        ready = next((k for k in pending if after[k] <= done), None)
        if ready is None:
            raise RuntimeError("assigns that read each other's targets can't be ordered: realize them separately")
        order.append(ready)
        done.add(ready)
        pending.remove(ready)
    return order


def needs_kernel(u: UOp) -> bool:
    """An output needs a kernel unless it is a constant or already a whole buffer."""
    return uniform_const(u) is None and view_base(u) is None


def max_size(shape: tuple) -> int:
    """The elements a buffer of `shape` needs: for a symbolic shape (uop/variable.py), at its largest."""
    n = prod(shape)
    return n.vmax if isinstance(n, UOp) else n


def substitute_realized(outs: list[UOp], realized) -> list[UOp]:
    """Replace every node that was realized before by the buffer view holding its value."""
    sink = UOp(Ops.SINK, dtypes.void, tuple(outs))
    mapping = {u: realized[u] for u in sink.toposort(gate=lambda u: u not in realized) if u in realized}
    return list(graph_substitute(sink, mapping).src) if mapping else outs
