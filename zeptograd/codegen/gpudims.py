"""GPU dims: a kernel's loops become thread ids, and GROUP reduces go through shared memory.

Run after the expander, for renderers with `has_local`:

- output loops (LOOP/GLOBAL ranges) -> SPECIAL `gidx0..2` (group ids; gidx0 is the innermost loop), LOCAL and
  GROUP ranges -> SPECIAL `lidx0..2` (ids inside a work-group). More than 3 ranges of a kind are merged into one
  id (recovered with // and %); a merged size over the device's limit stays a loop.
- a REDUCE over GROUP ranges (OptOps.GROUP): each thread reduces its slice into a register (the REDUCE over the
  other ranges), stores the partial into DEFINE_LOCAL at its local id, BARRIER, then reduces the partials of its
  group from shared memory (every thread reads all of them); only local id 0 of each GROUP range stores outputs.

    REDUCE(x, r, g)  ->  acc = reduce(x over r); temp[lid] = acc; barrier; REDUCE(temp.after(barrier)[lid|g->q], q)

- a row kernel (a reduce hoisted out of an output loop: softmax's max and sum, computed once per row before the
  loop along the row that reads them; schedule/policy.py, hoistable) -> one work-group per row (`split_rows`): the
  row's loops, the reduces' and the output's, are shared by the group's threads, each taking every L-th element,
  the reduces combined through shared memory as GROUP reduces are. A row buffer filled in such a reduce
  (schedule/kernel.py: a DEFINE_REG of the row's length) becomes a DEFINE_LOCAL: each thread stores the elements
  it computes, and the reads after the reduce (after its BARRIER) load any of them.

    for i: { m = max_r x[i, r]; for j: out[i, j] = f(x[i, j], m) }
      -> i = gidx0, lane = lidx0: { m = max over lanes q of (max_k x[i, k*L + lane]); for k: out[i, k*L + lane] = ... }
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field

from zeptograd.codegen.accumulator import AccContext, range_scopes, reduce_to_acc
from zeptograd.codegen.opt import OptError, pm_fix_range_lists
from zeptograd.codegen.opt.access import stride
from zeptograd.dtype import PtrDType, dtypes
from zeptograd.helpers import prod
from zeptograd.renderer import Renderer
from zeptograd.uop.ops import AxisType, Ops, UOp, const_trip_count, max_trip_count
from zeptograd.uop.symbolic import symbolic
from zeptograd.uop.upat import PatternMatcher, UPat, graph_rewrite, graph_substitute
from zeptograd.viz.hook import named_pass  # VIZ=1: this pass is a named step of the trace

REG_BASE = 1 << 20  # register ids of the partial accumulators made here (the accumulator pass counts from 0)
ROW_THREADS = 256  # the most threads of the work-group that shares a row kernel's row (split_rows)


def assign_dims(ranges: list[UOp], max_sizes: tuple[int, ...], prefix: str) -> tuple[dict[UOp, UOp], list[int]]:
    """ranges (outermost first) -> {range: expression in SPECIAL ids} and the size of each id, innermost first.

    Ranges that can't get an id within max_sizes are left out of the mapping (they stay loops)."""
    size = {r: n for r in ranges if (n := const_trip_count(r)) is not None}  # every range here has a constant size
    dims: list[list[UOp]] = [[r] for r in reversed(ranges)]  # dim 0 is the innermost loop: the fastest id
    while len(dims) > len(max_sizes):  # merge the outermost two
        dims[-2:] = [dims[-1] + dims[-2]]
    for i in range(len(dims) - 1, 0, -1):  # an id over its limit joins id 0 where that fits (CUDA: y, z < 65536)
        size_i, size_0 = prod(size[r] for r in dims[i]), prod(size[r] for r in dims[0])
        if size_i > max_sizes[i] and size_i * size_0 <= max_sizes[0]:
            dims[0] = dims.pop(i) + dims[0]
    mapping: dict[UOp, UOp] = {}
    sizes: list[int] = []
    for rs in dims:
        total = prod(size[r] for r in rs)
        if total > max_sizes[len(sizes)]:
            continue  # too big for this id: those loops stay loops
        special = UOp(Ops.SPECIAL, dtypes.index, (UOp.const(dtypes.index, total),), f"{prefix}{len(sizes)}")
        sizes.append(total)
        inner = 1
        for k, r in enumerate(reversed(rs)):  # innermost first: r = special // inner % size
            n = size[r]
            if total == 0:  # an empty kernel (never launched): no division by a zero size
                mapping[r] = special
                continue
            e = special if inner == 1 else special // UOp.const(dtypes.index, inner)
            mapping[r] = e if k == len(rs) - 1 else e % UOp.const(dtypes.index, n)
            inner *= n
    return mapping, sizes


def _strip_ranges(x: UOp) -> UOp | None:
    """# END(x, ..., gidx-expression, ...) -> END(x, ...): only RANGEs stay in END/REDUCE lists"""
    keep = tuple(s for s in x.src[1:] if s.op is Ops.RANGE)
    if keep == x.src[1:]:
        return None
    return x.src[0] if x.op is Ops.END and not keep else UOp(x.op, x.dtype, (x.src[0], *keep), x.arg)


def _gate_store(ctx: UOp, st: UOp) -> UOp | None:
    """# STORE(INDEX(global, i[, v]), x) -> STORE(INDEX(global, i, v & lid == 0), x): one thread of a group stores"""
    idx = st.src[0]
    if idx.op is not Ops.INDEX or idx.src[0].op is not Ops.DEFINE_GLOBAL or ctx in idx.src[2:]:
        return None
    if ctx.src[0] in idx.src[1].toposort():  # each thread stores its own elements (a row kernel's output loop)
        return None
    if len(idx.src) > 2 and idx.src[2].op is Ops.AND and ctx in idx.src[2].src:
        return None
    valid = ctx if len(idx.src) < 3 else UOp(Ops.AND, dtypes.bool, (idx.src[2], ctx))
    return UOp(Ops.STORE, st.dtype, (UOp(Ops.INDEX, idx.dtype, (idx.src[0], idx.src[1], valid)), *st.src[1:]))


@dataclass
class _GroupCtx:
    groups: list[UOp]
    n_threads: int
    lid_flat: UOp  # this thread's position in its work-group: sum of local ranges * strides
    scopes: dict[tuple[UOp, ...], tuple[UOp, ...]]
    range_ids: itertools.count
    ids: set[UOp]  # the ranges that become thread ids
    names: itertools.count = field(default_factory=itertools.count)
    regs: itertools.count = field(default_factory=lambda: itertools.count(REG_BASE))


def _group_reduce(ctx: _GroupCtx, red: UOp) -> UOp | None:
    """# REDUCE(x, r, g) -> REDUCE(temp.after(BARRIER(temp[lid].store(acc of x over r)))[lid with g->q], q)"""
    gs = [r for r in red.src[1:] if r in ctx.groups]
    if not gs:
        return None
    if any(r not in ctx.ids for r in ctx.scopes.get(red.src[1:], ())):
        # shared memory written again in a later iteration while slower threads still read it: not supported
        raise OptError("GROUP: a reduce inside a loop (not a thread id) can't share memory across iterations")
    rest = tuple(r for r in red.src[1:] if r not in gs)
    partial = red.src[0]
    if rest:  # this thread's slice, reduced in a register inside the loops the reduce sits in
        # initialised after the reduces its value reads outside its loop (a row kernel's max in the sum): their
        # combine loops run first, as lower_reduces orders the reduces it lowers
        reads = red.src[0].toposort(gate=lambda u: u.op is not Ops.REDUCE)  # not the reduces inside those
        hoisted = [u for u in reads if u.op is Ops.REDUCE and not set(rest) & set(u.toposort())]
        acc_ctx = AccContext({rest: (*ctx.scopes.get(red.src[1:], ()), *hoisted)}, ctx.regs)
        partial = reduce_to_acc(acc_ctx, UOp(Ops.REDUCE, red.dtype, (red.src[0], *rest), red.arg))
    temp = UOp(Ops.DEFINE_LOCAL, red.dtype.ptr(ctx.n_threads, local=True), (), f"temp{next(ctx.names)}")
    barrier = UOp(Ops.BARRIER, dtypes.void, (temp.index(ctx.lid_flat).store(partial),))
    qs = {g: UOp.range(g.src[0], next(ctx.range_ids), AxisType.REDUCE) for g in gs}
    load = temp.after(barrier).index(ctx.lid_flat.substitute(qs)).load()
    return UOp(Ops.REDUCE, red.dtype, (load, *qs.values()), red.arg)


pm_group_reduce = PatternMatcher([(UPat(Ops.REDUCE, name="red"), _group_reduce)])
pm_strip_ranges = PatternMatcher([(UPat((Ops.END, Ops.REDUCE), name="x"), _strip_ranges)])
pm_gate_store = PatternMatcher([(UPat(Ops.STORE, name="st"), _gate_store)])


def row_reduces(sink: UOp) -> tuple[dict[tuple[UOp, ...], tuple[UOp, ...]], list[UOp]]:
    """The reduces that sit in output loops only (their ranges -> those loops), and the output loops some of them
    do not sit in: loops that run after a reduce hoisted out of them (a row kernel's loop along the row)."""
    scopes = range_scopes(sink).items()
    top = {rs: scope for rs, scope in scopes if rs and all(s.arg[1] is AxisType.LOOP for s in scope)}
    loops = [u for u in sink.toposort() if u.op is Ops.RANGE and u.arg[1] is AxisType.LOOP]
    return top, [r for r in loops if any(r not in scope for scope in top.values())]


def is_row_kernel(sink: UOp) -> bool:
    """Whether a reduce in output loops only is hoisted out of a loop: an output loop (softmax's division along the
    row) or another such reduce's loop (logsumexp's max, read in the sum's loop): `split_rows` shares the row."""
    return _hoists_a_reduce(sink, *row_reduces(sink))


def _hoists_a_reduce(sink: UOp, top: dict[tuple[UOp, ...], tuple[UOp, ...]], inner: list[UOp]) -> bool:
    """is_row_kernel, given row_reduces(sink)"""
    if inner:
        return True
    reduces = [u for u in sink.toposort() if u.op is Ops.REDUCE and u.src[1:] in top]
    return any(a is not b and a in b.src[0].toposort() for a in reduces for b in reduces)


def split_rows(sink: UOp, renderer: Renderer) -> tuple[UOp, set[UOp]]:
    """A row kernel's row shared by the threads of a work-group, and the loops each thread runs along the row (they
    stay loops, not group ids); sink unchanged where it is no row kernel or its form is not this one's (which stays
    correct: every thread then computes the whole reduce itself).

    # RANGE(n) -> RANGE((n - lane + L-1) // L)*L + lane, lane = RANGE(L, GROUP): thread lane takes lane, lane+L, ...
    for the last range of each reduce that sits in the row's loops only (the outermost loops, which every reduce in
    output loops only sits in), and for the innermost output loop such a reduce does not sit in (the loop that reads
    it). Those reduces then are GROUP reduces (`_group_reduce`), the loop's stores each thread's own; a row buffer
    filled along a split range becomes a DEFINE_LOCAL of its length. A reduce that sits in the split loop too
    (attention's product with v, per output column) is each thread's own, for its columns. Only where the row's
    loops all become group ids, and the row buffers and the reduces' partials fit the renderer's local memory."""
    if sink.op is Ops.SINK and len(sink.src) > 1:
        return sink, set()  # a tail's nest (codegen/opt/tail.py)
    nodes = list(sink.toposort())
    if any(u.op is Ops.RANGE and u.arg[1] in (AxisType.LOCAL, AxisType.GROUP) for u in nodes):
        return sink, set()  # threads chosen by explicit actions
    top, inner = row_reduces(sink)
    if not _hoists_a_reduce(sink, top, inner):
        return sink, set()
    rows = min(top.values(), key=len)
    if any(not set(rows) <= set(scope) for scope in top.values()) or any(const_trip_count(r) is None for r in rows):
        return sink, set()
    if len(assign_dims(list(rows), renderer.global_max, "")[0]) != len(rows):
        return sink, set()  # a row loop left a loop: the next row would write local memory while this one reads it
    grouped = [rs for rs, scope in top.items() if scope == rows]
    # the loop along the row: inside every reduce that is not the row's (each thread computes those for its part)
    along = [r for r in inner if all(r in scope for scope in top.values() if scope != rows)]
    if inner and not along:
        return sink, set()
    split = {rs[-1] for rs in grouped} | ({max(along, key=lambda r: r.arg[0])} if along else set())
    longest = max(max_trip_count(r) for r in split)  # a reduce gated along the row (causal attention): its largest
    # every thread reads the L partials of each reduce (the combine) and n/L elements per pass: L about sqrt(n)
    # balances the two (softmax (4096, 4096) on PoCL, one core: 256 threads 0.59 s, 64 0.20 s, 32 0.18 s)
    lanes = min(
        ROW_THREADS, renderer.local_threads_max, renderer.local_max[0], 1 << math.isqrt(longest - 1).bit_length()
    )
    # a row buffer stored along a split range: shared by the group (its reads may be any thread's elements)
    filled: dict[UOp, PtrDType] = {}
    for u in nodes:
        if u.op is Ops.STORE and u.src[0].op is Ops.INDEX and (b := u.src[0].src[0]).op is Ops.DEFINE_REG:
            if isinstance(b.dtype, PtrDType) and split & set(u.src[0].src[1].toposort()):
                filled[b] = b.dtype
    partials = sum(lanes * u.dtype.itemsize for u in nodes if u.op is Ops.REDUCE and u.src[1:] in grouped)
    if sum(p.size * p.base.itemsize for p in filled.values()) + partials > renderer.local_memory_bytes:
        return sink, set()
    lane = UOp.range(lanes, max(u.arg[0] for u in nodes if u.op is Ops.RANGE) + 1, AxisType.GROUP)
    step = UOp.const(dtypes.index, lanes)
    mapping = {b: UOp(Ops.DEFINE_LOCAL, p.base.ptr(p.size, local=True), (), f"row{b.arg}") for b, p in filled.items()}
    along_row: set[UOp] = set()
    for r in split:
        count = ((r.src[0] + (lanes - 1) - lane) // step).simplify()
        one = count.op is Ops.CONST and count.arg == 1  # a row of L or fewer: one element per thread
        if one:
            mapping[r] = lane
            continue
        along_row.add(part := UOp.range(count, r.arg[0], r.arg[1]))
        mapping[r] = part * step + lane
    return graph_rewrite(graph_substitute(sink, mapping), pm_fix_range_lists), along_row


@named_pass("add_gpudims", "loops -> GPU thread ids, GROUP reduces through shared memory, rows to work-groups")
def add_gpudims(sink: UOp, renderer: Renderer) -> UOp:
    sink, along_row = split_rows(sink, renderer)
    nodes = list(sink.toposort())
    # the loops of the kernel's first loop nest become ids; a tail's nest (codegen/opt/tail.py) stays loops and is
    # run by thread 0 only (step 4)
    main = set(sink.src[0].toposort()) if sink.op is Ops.SINK and len(sink.src) > 1 else set(nodes)
    ranges = sorted((u for u in nodes if u.op is Ops.RANGE and u in main), key=lambda r: r.arg[0])
    const_ranges = [r for r in ranges if const_trip_count(r) is not None]
    outputs = [r for r in const_ranges if r.arg[1] is AxisType.LOOP and r not in along_row]
    local = [r for r in const_ranges if r.arg[1] in (AxisType.LOCAL, AxisType.GROUP)]
    if len(local) != len([r for r in ranges if r.arg[1] in (AxisType.LOCAL, AxisType.GROUP)]):
        raise OptError("LOCAL/GROUP need an axis of constant size")
    # neighbouring threads on neighbouring addresses: local ids ordered by their stride in the stores, the
    # smallest innermost (lidx0); GROUP ranges, which no store uses, innermost of all
    stores = [
        u.src[0].src[1]
        for u in nodes
        if u.op is Ops.STORE and u.src[0].op is Ops.INDEX and u.src[0].src[0].op is Ops.DEFINE_GLOBAL
    ]
    local.sort(key=lambda r: max([s for i in stores if (s := stride(i, r))] or [0]), reverse=True)
    n_threads = prod(const_trip_count(r) for r in local)
    if n_threads > renderer.local_threads_max:
        raise OptError(f"{n_threads} threads per work-group; {renderer.device} allows {renderer.local_threads_max}")

    gmap, _ = assign_dims(outputs, renderer.global_max, "gidx")
    lmap, _ = assign_dims(local, renderer.local_max, "lidx")
    if len(lmap) != len(local):
        raise OptError(f"the local sizes {[const_trip_count(r) for r in local]} don't fit {renderer.local_max}")

    # 1. GROUP reduces: partial per thread, through shared memory, then the partials of the group
    groups = [r for r in local if r.arg[1] is AxisType.GROUP]
    if groups:
        strides = [prod(const_trip_count(r) for r in local[i + 1 :]) for i in range(len(local))]
        terms = [r * UOp.const(dtypes.index, s) if s != 1 else r for r, s in zip(local, strides)]
        ctx = _GroupCtx(
            groups,
            n_threads,
            terms[0] if len(terms) == 1 else sum(terms[1:], start=terms[0]),
            range_scopes(sink),
            itertools.count(max(r.arg[0] for r in ranges) + 1),
            set(gmap) | set(lmap),
        )
        sink = graph_rewrite(sink, pm_group_reduce, ctx=ctx)

    # 2. ranges -> thread ids
    sink = graph_substitute(sink, gmap | lmap)
    sink = graph_rewrite(sink, pm_strip_ranges)
    if any(len(rs) > 1 for rs in _merged(gmap, lmap)):
        sink = graph_rewrite(sink, symbolic)  # merged ids: (s//n)*n + s%n -> s

    # 3. with GROUP ranges, one thread of each group stores: the one whose GROUP local ids are 0
    for g in groups:
        sink = graph_rewrite(sink, pm_gate_store, ctx=lmap[g].eq(UOp.const(dtypes.index, 0)))

    # 4. the other loop nests (tails) store from the thread whose ids are all 0
    ids = sorted({u for e in (gmap | lmap).values() for u in e.toposort() if u.op is Ops.SPECIAL}, key=lambda u: u.arg)
    if len(sink.src) > 1 and ids:
        first = functools.reduce(lambda a, b: a & b, [u.eq(UOp.const(dtypes.index, 0)) for u in ids])
        rest = tuple(graph_rewrite(s, pm_gate_store, ctx=first) for s in sink.src[1:])
        sink = sink.replace(src=(sink.src[0], *rest))
    return sink


def _merged(gmap: dict[UOp, UOp], lmap: dict[UOp, UOp]) -> list[list[UOp]]:
    by_id: dict[UOp, list[UOp]] = {}
    for r, e in (gmap | lmap).items():
        special = next(u for u in e.toposort() if u.op is Ops.SPECIAL)
        by_id.setdefault(special, []).append(r)
    return list(by_id.values())
