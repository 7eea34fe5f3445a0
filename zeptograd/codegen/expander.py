"""Expander: UPCAST/UNROLL ranges become vector lanes and unrolled copies.

One expanded range (the one most loads and stores walk contiguously, at most a SIMD register wide) becomes the
lanes of vector values: `RANGE(16, UPCAST)` -> `[0, 1, ..., 15]`, a load whose index steps by 1 along it becomes
one vector load, ALU ops become vector ops. Every other expanded range is unrolled: each value that depends on
it exists once per position of it (a register tile for matmul: rows as copies, columns as vectors).

A REDUCE over expanded ranges keeps one accumulator per input copy (several independent accumulators hide the
add latency) unless the output already has several copies (a register tile), in which case the
copies are added before the accumulator. Vector lanes of a reduced axis are folded once, after the loop
(one horizontal reduce after the loop).

How each op expands is a `(UPat, fn)` rule of `pm_expand`; the `Expander` is their ctx: it chooses the vector range,
walks the kernel in toposort order and keeps each node's copies (`Expanded`), which the rules build from their
sources'. That walk stays procedural: a node's copies are not a node, so `graph_rewrite` can't carry them.
"""

from __future__ import annotations

import itertools
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from zeptograd.dtype import PtrDType, dtypes
from zeptograd.helpers import prod
from zeptograd.uop.ops import AxisType, Ops, UOp, trip_count
from zeptograd.uop.symbolic import and_terms, build_sum, simplify, split_sum
from zeptograd.uop.upat import PatternMatcher, UPat
from zeptograd.viz.hook import named_pass  # VIZ=1: this pass is a named step of the trace

_EXPANDED = (AxisType.UPCAST, AxisType.UNROLL)
CHAIN_COPIES = 4  # with this many output copies, reduce copies are summed before the accumulator
# a shuffle within 16 bytes of a vector (an x86 vector's 128-bit lane) takes a cycle, one across them three or more
SHUFFLE_BLOCK_BYTES = 16


@dataclass
class Expanded:
    axes: tuple[UOp, ...]  # the unrolled ranges this value has copies along, by axis id
    vals: dict[tuple[int, ...], UOp]  # one UOp per position of those ranges
    v: UOp | None = None  # the vector range whose lanes the values are vectors over (None: scalars)
    # or the unrolled ranges whose positions are the lanes (a tile's dot products packed into one vector after the
    # reduce folded their lanes: `expand_reduce`), in key order; never both
    packed: tuple[UOp, ...] = ()

    @property
    def vec(self) -> bool:
        return self.v is not None


def is_contiguous(idx: UOp, r: UOp) -> bool:
    """idx == (something without r) + r: consecutive lanes of r read consecutive elements."""
    return steps_by(idx, r, 1)


def steps_by(idx: UOp, r: UOp, step: int) -> bool:
    """idx == (something without r) + step*r"""
    terms, _ = split_sum(idx)
    return (r, step) in terms and all(r not in t.toposort() for t, _ in terms if t is not r)


def affine_lanes(idx: UOp, r: UOp, lanes: int) -> list[UOp] | None:
    """# idx(r) == rest + s*r + c, r in no term of rest -> [rest + (c + s*k) for each lane k], each sum in simplify's
    canonical form (its terms in order, the constant last, none where it is 0): a scatter's lane offsets built
    directly instead of substituting and simplifying the whole expression once per lane. None where idx is not so."""
    terms, const = split_sum(idx)
    step = dict(terms).get(r)
    if step is None or any(r in t.toposort() for t, _ in terms if t is not r):
        return None
    rest = [(t, c) for t, c in terms if t is not r]
    return [build_sum(rest, const + step * k, idx) for k in range(lanes)]


def access_counts(ast: UOp) -> dict[UOp, int]:
    """How often each buffer access runs: the iterations of every loop around it (its loop nest's ranges, and a
    REDUCE's when it is under one and moves with it), whichever of them its index uses. Per nest, so a tail never
    outvotes its main part."""
    counts: dict[UOp, int] = {}
    for nest in ast.src:
        outer = set(nest.src[1:]) if nest.op is Ops.END else set()
        under_reduce = {
            u: set(red.src[1:]) for red in nest.toposort() if red.op is Ops.REDUCE for u in red.src[0].toposort()
        }
        for u in nest.toposort():
            if u.op is Ops.INDEX and (u.src[0].op is Ops.DEFINE_GLOBAL or row_buffer_of(u) is not None):
                own = set(u.src[1].ranges)
                inner = under_reduce.get(u, set())  # an index using none of them is hoisted out of the reduce
                scope = outer | own | (inner if own & inner else set())
                counts[u] = prod(trip_count(r) for r in scope if r.op is Ops.RANGE and r.src[0].op is Ops.CONST)
    return counts


def row_buffer_of(ix: UOp) -> UOp | None:
    """The row buffer (a DEFINE_REG array: schedule/kernel.py) an INDEX reads or writes, directly or after its fill."""
    base = ix.src[0].src[0] if ix.src[0].op is Ops.AFTER and ix.src[0].src else ix.src[0]
    return base if base.op is Ops.DEFINE_REG else None


def live_ranges(nodes: list[UOp], ranges: AbstractSet[UOp]) -> dict[UOp, frozenset[UOp]]:
    """Which of `ranges` each node's value moves with: a REDUCE or END over a range closes it (a row's max is one
    value however many lanes computed it)."""
    live: dict[UOp, frozenset[UOp]] = {}
    for u in nodes:
        here = frozenset([u]) if u in ranges else frozenset()
        here = here.union(*[live[s] for s in u.src])
        live[u] = here - set(u.src[1:]) if u.op in (Ops.REDUCE, Ops.END) and here else here
    return live


def max_lanes(nodes: list[UOp], max_vec_bytes: int) -> int:
    """The most lanes of the kernel's widest element type a vector register holds."""
    globals_ = [u.dtype for u in nodes if u.op is Ops.DEFINE_GLOBAL and isinstance(u.dtype, PtrDType)]
    return max(1, max_vec_bytes // max((dt.base.itemsize for dt in globals_), default=4))


def vector_ranges(ast: UOp, max_vec_bytes: int) -> frozenset[UOp]:
    """The expanded ranges the expander will make vector lanes (the others become unrolled copies)."""
    nodes = list(ast.toposort())
    expanded = sorted((u for u in nodes if u.op is Ops.RANGE and u.arg[1] in _EXPANDED), key=lambda r: r.arg[0])
    return frozenset(choose_vector_ranges(ast, nodes, expanded, max_lanes(nodes, max_vec_bytes)))


def choose_vector_ranges(ast: UOp, nodes: list[UOp], expanded: list[UOp], max_width: int) -> list[UOp]:
    """The expanded range the most executed accesses walk contiguously (a power of two up to the SIMD width; their
    executions times its lanes: a register tile's 2 columns, contiguous in the store and one operand, lose to its 8
    lanes of rows that the other operand walks, as the heuristic weighs its vector axis), then
    every other such range no value moves with together with one already chosen, in the same order: a reduce
    computed before an output loop it does not vary along (softmax's row max, then its sum, then the output row) is
    a loop of its own, vectorized along its own range."""
    scores: dict[UOp, int] = {}
    for u, count in access_counts(ast).items():
        idx = u.src[1]
        for r in expanded:
            n = trip_count(r)
            if n <= max_width and n & (n - 1) == 0 and is_contiguous(idx, r):  # a gate on r: a masked access
                scores[r] = scores.get(r, 0) + count
    if not scores:
        return []
    ordered = sorted(scores, key=lambda r: (scores[r] * trip_count(r), scores[r], -r.arg[0]), reverse=True)
    if len(ordered) == 1:
        return ordered
    together = {live for live in live_ranges(nodes, set(ordered)).values() if len(live) > 1}
    chosen: list[UOp] = []
    for r in ordered:
        if not any(r in live and any(c in live for c in chosen) for live in together):
            chosen.append(r)
    return chosen


class Expander:
    def __init__(self, ast: UOp, max_vec_bytes: int):
        self.ast = ast
        nodes = list(ast.toposort())
        expanded = sorted((u for u in nodes if u.op is Ops.RANGE and u.arg[1] in _EXPANDED), key=lambda r: r.arg[0])
        self.vecs = choose_vector_ranges(ast, nodes, expanded, max_lanes(nodes, max_vec_bytes))
        self.unrolled = [r for r in expanded if r not in self.vecs]
        self.deps: dict[UOp, frozenset[UOp]] = {}
        for u in nodes:
            own = frozenset([u]) if u in expanded else frozenset()
            self.deps[u] = own.union(*[self.deps[s] for s in u.src])
        # the expanded ranges each value moves with: a value read after a REDUCE over one has one copy, not one
        # per position of that range; at most one is a vector range (chosen so)
        self.live = live_ranges(nodes, set(expanded))
        self.nodes = nodes
        self.exp: dict[UOp, Expanded] = {}
        # the unrolled ranges a store writes consecutive elements along (the order a tile's packed lanes take)
        self.stored_along = {
            r for u in nodes if u.op is Ops.STORE for r in self.unrolled if is_contiguous(u.src[0].src[1], r)
        }

    # --- helpers ---
    def vector_range(self, u: UOp) -> UOp | None:
        """The vector range u's value moves with, if any."""
        return next((r for r in self.live[u] if r in self.vecs), None)

    def axes_of(self, *us: UOp) -> tuple[UOp, ...]:
        deps = frozenset().union(*[self.live[u] for u in us])
        return tuple(r for r in self.unrolled if r in deps)

    def keys(self, axes: tuple[UOp, ...]):
        return itertools.product(*[range(range_lanes(r)) for r in axes])

    def copy(self, u: UOp, axes: tuple[UOp, ...], key: tuple[int, ...]) -> UOp:
        """u's copy at key (key gives a position to each of axes, which hold u's unrolled ranges): a packed value's
        lane at that position"""
        e = self.exp[u]
        val = e.vals[tuple(key[axes.index(a)] for a in e.axes)]
        if not e.packed:
            return val
        lane = 0
        for r in e.packed:
            lane = lane * range_lanes(r) + key[axes.index(r)]
        return UOp(Ops.GEP, val.dtype.scalar, (val,), (lane,))

    def get(self, u: UOp, axes: tuple[UOp, ...], key: tuple[int, ...], v: UOp | None) -> UOp:
        """u's copy at key, broadcast to v's lanes where it is a scalar and v is not None"""
        val = self.copy(u, axes, key)
        return self.broadcast(val, v) if v is not None and not self.exp[u].vec else val

    def get_packed(self, u: UOp, axes: tuple[UOp, ...], key: tuple[int, ...], packed: tuple[UOp, ...]) -> UOp:
        """u's copy at key (over axes, which exclude packed's ranges) as a vector over packed's lanes: itself where
        u is packed so, a broadcast where it moves with none of them, else its copies one per lane (a bias read per
        column of the tile)"""
        e = self.exp[u]
        if e.packed == packed:
            return e.vals[tuple(key[axes.index(a)] for a in e.axes)]
        if not any(r in e.axes or r in e.packed for r in packed):
            val = self.copy(u, axes, key)
            return UOp(Ops.VECTORIZE, val.dtype.vec(packed_lanes(packed)), (val,) * packed_lanes(packed))
        if u.op is Ops.LOAD and not e.vec and not e.packed and packed[-1] in e.axes:
            return self.load_packed(u, axes, key, packed)
        full = axes + packed
        lanes = tuple(self.copy(u, full, key + lane) for lane in self.keys(packed))
        return UOp(Ops.VECTORIZE, lanes[0].dtype.vec(len(lanes)), lanes)

    def load_packed(self, u: UOp, axes: tuple[UOp, ...], key: tuple[int, ...], packed: tuple[UOp, ...]) -> UOp:
        """# LOAD(INDEX(buf, i(r, c))) gathered into lanes packed over (r, c) -> per position of r, one vector LOAD
        along c where consecutive c read consecutive elements (and no gate reads c), else a LOAD per lane (a residual
        read after a tile of dot products: a load per row of the tile instead of per output)"""
        index, inner, rows = u.src[0], packed[-1], packed[:-1]
        n, lanes = range_lanes(inner), []
        for row in self.keys(rows):
            if (vidx := self.row_vector_index(index, axes + rows, key + row, inner)) is not None:
                ld = UOp(Ops.LOAD, u.dtype.vec(n), (vidx,))
                lanes += [UOp(Ops.GEP, u.dtype, (ld,), (c,)) for c in range(n)]
            else:
                lanes += [self.copy(u, axes + packed, key + row + (c,)) for c in range(n)]
        return UOp(Ops.VECTORIZE, u.dtype.vec(len(lanes)), tuple(lanes))

    def row_vector_index(self, index: UOp, axes: tuple[UOp, ...], key: tuple[int, ...], inner: UOp) -> UOp | None:
        """index at key (over axes, which exclude inner) as one INDEX of its elements along inner, where consecutive
        positions of inner are consecutive elements and no gate reads inner (a packed row's vector load or store);
        None where they are not"""
        idx = self.substitute(index.src[1], axes, key)
        valid = self.substitute(index.src[2], axes, key) if len(index.src) > 2 else None
        if range_lanes(inner) < 2 or not is_contiguous(idx, inner) or (valid is not None and inner in valid.toposort()):
            return None
        base = self.substitute(idx, (inner,), (0,))
        return UOp(Ops.INDEX, index.dtype, (self.pointer(index), base) + ((valid,) if valid is not None else ()))

    @staticmethod
    def broadcast(x: UOp, v: UOp) -> UOp:
        return UOp(Ops.VECTORIZE, x.dtype.vec(range_lanes(v)), (x,) * range_lanes(v))

    def substitute(
        self, x: UOp, axes: tuple[UOp, ...], key: tuple[int, ...], lane: int | None = None, v: UOp | None = None
    ) -> UOp:
        mapping = {r: UOp.const(dtypes.index, k) for r, k in zip(axes, key)}
        if lane is not None and v is not None:
            mapping[v] = UOp.const(dtypes.index, lane)
        return simplify(x.substitute(mapping)) if mapping else x

    # --- the walk: each node's copies from its sources', by the first rule of pm_expand that matches ---
    def expand(self) -> UOp:
        if not self.vecs and not self.unrolled:
            return self.ast
        for u in self.nodes:
            e = pm_expand.rewrite(u, ctx=self)
            assert isinstance(e, Expanded), f"no expander rule for {u.op}"
            self.exp[u] = e
        return self.exp[self.ast].vals[()]

    def flat_vals(self, srcs: tuple[UOp, ...]) -> list[UOp]:
        return [self.exp[s].vals[k] for s in srcs for k in sorted(self.exp[s].vals)]

    def scalar_index(self, index: UOp, axes, key, lane: int | None = None, v: UOp | None = None) -> UOp:
        return UOp(
            Ops.INDEX,
            index.dtype,
            (self.pointer(index), *[self.substitute(s, axes, key, lane, v) for s in index.src[1:]]),
        )

    def pointer(self, index: UOp) -> UOp:
        """What an INDEX reads: its buffer, or a row buffer ordered after its fill's loop (AFTER(buf, REDUCE): the
        REDUCE's expansion, so no unexpanded range is left behind)."""
        return self.exp[index.src[0]].vals[()]

    def lane_indices(self, index: UOp, axes, key, v: UOp) -> list[UOp]:
        # this copy's index simplified once, then each lane's: a lane substitutes one range into a simplified graph
        srcs = [self.substitute(s, axes, key) for s in index.src[1:]]
        ptr, n = self.pointer(index), range_lanes(v)
        offsets = affine_lanes(srcs[0], v, n)
        if offsets is not None:  # the gate (if any) per lane, the offsets made without a walk
            gates = [[self.substitute(s, (), (), lane, v) for s in srcs[1:]] for lane in range(n)]
            fast = [UOp(Ops.INDEX, index.dtype, (ptr, offsets[lane], *gates[lane])) for lane in range(n)]
            # checked: the first and the last lane are the nodes simplify makes (interned: the same objects)
            if all(fast[k].src[1] is self.substitute(srcs[0], (), (), k, v) for k in (0, n - 1)):
                return fast
        return [
            UOp(Ops.INDEX, index.dtype, (ptr, *[self.substitute(s, (), (), lane, v) for s in srcs]))
            for lane in range(n)
        ]

    def vector_index(self, index: UOp, axes, key, v: UOp) -> UOp | None:
        """INDEX(buf, base[, valid]) for a contiguous vector access of this copy, None if the lanes are not contiguous.
        A gate that differs across the lanes (a pad's border inside the vector) becomes a vector of bools: a masked
        access; one that holds for every lane of this copy (the value ranges decide) is dropped."""
        idx = self.substitute(index.src[1], axes, key)
        if not is_contiguous(idx, v):
            return None
        valid = self.substitute(index.src[2], axes, key) if len(index.src) > 2 else None
        if valid is not None and valid.op is Ops.CONST and valid.arg is True:
            valid = None
        elif valid is not None and v in valid.toposort():
            shared = [t for t in and_terms(valid) if v not in t.toposort()]
            valid = self.vectorize_expr(valid, v)
            base = self.substitute(idx, (), (), lane=0, v=v)
            return UOp(Ops.INDEX, index.dtype, (self.pointer(index), in_buffer_base(base, shared), valid))
        base = self.substitute(idx, (), (), lane=0, v=v)
        return UOp(Ops.INDEX, index.dtype, (self.pointer(index), base) + ((valid,) if valid is not None else ()))

    def stride2_load(self, index: UOp, axes, key, dtype, v: UOp) -> UOp | None:
        """# VECTORIZE(LOAD(b + 2k) for k < w) -> VECTORIZE(A[0], A[2], ..., A[w-2], B[1], B[3], ..., B[w-1]),
        A = LOAD<w>(b), B = LOAD<w>(b + w - 1): a gather whose lanes step by 2 (a stride-2 conv's or pool's input)
        as two contiguous loads and a shuffle instead of w scalar loads. The two span [b, b + 2w - 2], between the
        first and the last lane's elements; where lanes are gated, an element of A or B is read only where the lanes
        that enclose it are valid (so it is in the buffer), the others are masked."""
        if range_lanes(v) < 4 or not steps_by(self.substitute(index.src[1], axes, key), v, 2):
            return None
        w, buf = range_lanes(v), self.pointer(index)
        lanes = self.lane_indices(index, axes, key, v)
        base = lanes[0].src[1]
        valid = [i.src[2] if len(i.src) > 2 else UOp.const(dtypes.bool, True) for i in lanes]

        def enclosing(offset: int) -> UOp:  # the element b + offset is in the buffer where this holds
            lo, hi = valid[offset // 2], valid[(offset + 1) // 2]
            return lo if lo is hi else simplify(lo & hi)

        def load(offset: int) -> UOp:
            gates = [enclosing(offset + j) for j in range(w)]
            i = simplify(base + offset) if offset else base
            if all(g.op is Ops.CONST and g.arg is True for g in gates):
                src: tuple[UOp, ...] = (buf, i)
            elif all(g is gates[0] for g in gates):  # one gate for every lane: a gated vector load
                src = (buf, i, gates[0])
            else:
                held = [g for g in gates if not (g.op is Ops.CONST and g.arg is False)]
                shared = [t for t in and_terms(held[0]) if all(t in and_terms(g) for g in held[1:])] if held else []
                src = (buf, in_buffer_base(i, shared), UOp(Ops.VECTORIZE, dtypes.bool.vec(w), tuple(gates)))
            return UOp(Ops.LOAD, dtype.vec(w), (UOp(Ops.INDEX, index.dtype, src),))

        a, b = load(0), load(w - 1)
        picks = [(a, 2 * k) for k in range(w // 2)] + [(b, 2 * k - w + 1) for k in range(w // 2, w)]
        return UOp(Ops.VECTORIZE, dtype.vec(w), tuple(UOp(Ops.GEP, dtype, (v,), (j,)) for v, j in picks))

    def vectorize_expr(self, x: UOp, v: UOp) -> UOp:
        """x (free of unrolled ranges) over the lanes of the vector range v: its ops on vectors, the rest broadcast."""
        done: dict[UOp, UOp] = {}
        for u in x.toposort():
            if u is v:
                done[u] = self.exp[u].vals[()]
            elif not any(s in done and done[s].dtype.count > 1 for s in u.src):
                done[u] = u
            else:
                srcs = tuple(done[s] if done[s].dtype.count > 1 else self.broadcast(done[s], v) for s in u.src)
                done[u] = UOp(u.op, u.dtype.vec(range_lanes(v)), srcs, u.arg)
        return done[x]


def in_buffer_base(base: UOp, shared: list[UOp]) -> UOp:
    """# masked access at base, every lane's gate holding g (not varying across the lanes) -> at g ? base : 0
    Where g fails every lane is masked off, but the address is still used: a cat's part read at the other part's
    positions points outside its buffer, and a masked vector load whose masked-off lanes fall on an unmapped page
    costs a microcode assist (a cat of two (64, 55, 55) convs max-pooled in one kernel: 15x the stored cat's time).
    The buffer's first element is always mapped: its lanes, all masked off there, read nothing."""
    if not shared:
        return base
    gate = shared[0]
    for t in shared[1:]:
        gate = gate & t
    return gate.where(base, UOp.const(base.dtype, 0))


# ***** the expansion of each op: (UPat, fn) rules over the Expander (ctx), which holds the sources' copies *****
# A rule returns the node's Expanded: the expanded ranges it depends on, one UOp per position of them, and whether
# those are vectors. Rules are tried in order; the first that returns one wins.


def expand_range(ctx: Expander, r: UOp) -> Expanded | None:
    """# unrolled RANGE(n) -> copies 0, 1, ..., n-1; the vector RANGE(w) -> VECTORIZE(0, 1, ..., w-1)"""
    if r in ctx.unrolled:
        return Expanded((r,), {(i,): UOp.const(dtypes.index, i) for i in range(range_lanes(r))})
    if r in ctx.vecs:
        lanes = tuple(UOp.const(dtypes.index, i) for i in range(range_lanes(r)))
        return Expanded((), {(): UOp(Ops.VECTORIZE, dtypes.index.vec(len(lanes)), lanes)}, r)
    return None


def keep_unexpanded(ctx: Expander, u: UOp) -> Expanded | None:
    """# u reached by no expanded range -> u, once"""
    return Expanded((), {(): u}) if not ctx.deps[u] else None


def expand_load(ctx: Expander, u: UOp) -> Expanded:
    """# LOAD(INDEX(buf, i(r))) per copy -> one vector LOAD where lanes of r read consecutive elements (masked where
    the gate differs across them), else VECTORIZE(LOAD(INDEX(buf, i(0))), ..., LOAD(INDEX(buf, i(w-1)))): a gather"""
    index = u.src[0]
    axes, v = ctx.axes_of(index), ctx.vector_range(index)
    vals = {}
    for key in ctx.keys(axes):
        if v is None:
            vals[key] = UOp(Ops.LOAD, u.dtype, (ctx.scalar_index(index, axes, key),))
        elif (vidx := ctx.vector_index(index, axes, key, v)) is not None:
            vals[key] = UOp(Ops.LOAD, u.dtype.vec(range_lanes(v)), (vidx,))
        elif (pair := ctx.stride2_load(index, axes, key, u.dtype, v)) is not None:
            vals[key] = pair
        else:  # a gather: one scalar load per lane
            lanes = [UOp(Ops.LOAD, u.dtype, (i,)) for i in ctx.lane_indices(index, axes, key, v)]
            vals[key] = UOp(Ops.VECTORIZE, u.dtype.vec(range_lanes(v)), tuple(lanes))
    return Expanded(axes, vals, v)


def expand_store(ctx: Expander, u: UOp) -> Expanded:
    """# STORE(INDEX(buf, i(r)), x) -> GROUP of one STORE per copy: a vector STORE where lanes of r write consecutive
    elements, else one scalar STORE(INDEX(buf, i(k)), x[k]) per lane k: a scatter"""
    index, value = u.src
    axes = ctx.axes_of(index, value)
    v = ctx.vector_range(index)
    if ctx.exp[value].v not in (None, v):
        raise RuntimeError("internal error: a vector value stored to one address")
    if v is None and (packed := ctx.exp[value].packed):
        return Expanded((), {(): store_packed(ctx, index, value, axes, packed)})
    if v is not None and (transposed := store_transposed(ctx, index, value, axes, v)) is not None:
        return Expanded((), {(): transposed})
    stores = []
    for key in ctx.keys(axes):
        val = ctx.get(value, axes, key, v)
        if v is None:
            stores.append(ctx.scalar_index(index, axes, key).store(val))
        elif (vidx := ctx.vector_index(index, axes, key, v)) is not None:
            stores.append(vidx.store(val))
        else:  # a scatter: one scalar store per lane
            for lane, i in enumerate(ctx.lane_indices(index, axes, key, v)):
                stores.append(i.store(UOp(Ops.GEP, val.dtype.scalar, (val,), (lane,))))
    return Expanded((), {(): stores[0] if len(stores) == 1 else UOp(Ops.GROUP, dtypes.void, tuple(stores))})


def store_transposed(ctx: Expander, index: UOp, value: UOp, axes: tuple[UOp, ...], v: UOp) -> UOp | None:
    """# STORE(INDEX(buf, i(v, c)), x) with x's lanes along v scattered and c unrolled, consecutive c writing
    consecutive elements -> per lane k of v, vector STOREs of (x(c=0)[k], x(c=1)[k], ..., x(c=n-1)[k]) in
    power-of-two pieces (7 columns: 4 + 2 + 1): the register tile transposed by shuffles, not one store per element.
    A conv whose vector goes along its output channels (a channels-last weight: tensor/conv_layout.py) writes its
    NCHW output so, the tile's columns along c: on one AVX-512 core, ResNet-50's stem (1,3,224,224)x(64,3,7,7)
    stride 2, 4 x 16 channels x 4 columns, 1.23 -> 1.0 ms (every element its own store: 864 in the kernel). c: the
    innermost such range with at most the vector's lanes of copies; None (the scatter) where there is none, or the
    store is gated (a piece would need a mask)."""
    if len(index.src) > 2 or is_contiguous(index.src[1], v):
        return None
    lanes = range_lanes(v)
    col = next((r for r in reversed(axes) if 2 <= range_lanes(r) <= lanes and is_contiguous(index.src[1], r)), None)
    if col is None:
        return None
    outer, n, at = tuple(r for r in axes if r is not col), range_lanes(col), axes.index(col)
    pieces = [(n & -(2 << b), 1 << b) for b in reversed(range(n.bit_length())) if n >> b & 1]  # (start, size)
    stores = []
    for key in ctx.keys(outer):
        row = ctx.row_vector_index(index, outer, key, col)
        if row is None:
            return None
        copies = [ctx.get(value, axes, key[:at] + (j,) + key[at:], v) for j in range(n)]
        for start, size in pieces:
            if (bases := affine_lanes(simplify(row.src[1] + start) if start else row.src[1], v, lanes)) is None:
                return None
            for lane, base in enumerate(bases):
                part = [_lane(c, lane) for c in copies[start : start + size]]
                val = part[0] if size == 1 else UOp(Ops.VECTORIZE, value.dtype.scalar.vec(size), tuple(part))
                stores.append(UOp(Ops.INDEX, index.dtype, (row.src[0], base)).store(val))
    return stores[0] if len(stores) == 1 else UOp(Ops.GROUP, dtypes.void, tuple(stores))


def _lane(x: UOp, k: int) -> UOp:
    return UOp(Ops.GEP, x.dtype.scalar, (x,), (k,))


def store_packed(ctx: Expander, index: UOp, value: UOp, axes: tuple[UOp, ...], packed: tuple[UOp, ...]) -> UOp:
    """# STORE(INDEX(buf, i(r, c)), x packed over (r, c)) -> per position of r, one vector STORE of x's lanes along c
    where consecutive c write consecutive elements (and no gate reads c), else one scalar STORE per lane"""
    outer = tuple(r for r in axes if r not in packed)
    inner, rows = packed[-1], packed[:-1]
    n = range_lanes(inner)
    stores = []
    for key in ctx.keys(outer):
        val = ctx.get_packed(value, outer, key, packed)
        for row in ctx.keys(rows):
            start = 0
            for r, k in zip(rows, row):
                start = start * range_lanes(r) + k
            start *= n
            if (vidx := ctx.row_vector_index(index, outer + rows, key + row, inner)) is not None:
                part = (
                    val
                    if n == val.dtype.count
                    else UOp(Ops.GEP, val.dtype.scalar.vec(n), (val,), tuple(range(start, start + n)))
                )
                stores.append(vidx.store(part))
                continue
            for c in range(n):
                lane = UOp(Ops.GEP, val.dtype.scalar, (val,), (start + c,))
                stores.append(ctx.scalar_index(index, outer + packed, key + row + (c,)).store(lane))
    return stores[0] if len(stores) == 1 else UOp(Ops.GROUP, dtypes.void, tuple(stores))


def expand_reduce(ctx: Expander, u: UOp) -> Expanded:
    """# REDUCE(x, loops + unrolled r) -> REDUCE(x(0), loops) op ... op REDUCE(x(n-1), loops): one accumulator per
    copy, or REDUCE(x(0) op ... op x(n-1), loops) where the output has CHAIN_COPIES copies already; a reduced vector
    range's lanes are folded after the loop"""
    x, ranges, op = u.src[0], u.src[1:], u.arg
    loops = tuple(r for r in ranges if r not in ctx.unrolled and r not in ctx.vecs)
    red_axes = tuple(r for r in ctx.unrolled if r in ranges)
    reduced_v = next((r for r in ranges if r in ctx.vecs), None)  # its lanes are folded after the loop
    x_axes = tuple(r for r in ctx.unrolled if r in ctx.exp[x].axes or r in ctx.exp[x].packed or r in red_axes)
    out_axes = tuple(r for r in x_axes if r not in red_axes)
    x_v = ctx.exp[x].v or reduced_v
    n_out = 1
    for r in out_axes:
        n_out *= trip_count(r)
    chain = n_out >= CHAIN_COPIES
    vals = {}
    for out_key in ctx.keys(out_axes):
        copies = []
        for red_key in ctx.keys(red_axes):
            full = dict(zip(out_axes, out_key)) | dict(zip(red_axes, red_key))
            copies.append(ctx.get(x, x_axes, tuple(full[a] for a in x_axes), x_v))
        parts = [_fold(copies, op)] if chain else copies
        dtype = parts[0].dtype
        accs = [UOp(Ops.REDUCE, dtype, (p, *loops), op) if loops else p for p in parts]
        vals[out_key] = _fold(accs, op)
    if reduced_v is None:
        return Expanded(out_axes, vals, x_v)
    width = range_lanes(reduced_v)
    packed = packed_axes(out_axes, width, ctx.stored_along)
    if not packed:  # one horizontal reduce per copy, after the loop
        return Expanded(out_axes, {key: _fold_lanes(val, width, op) for key, val in vals.items()})
    # the copies' horizontal reduces folded together: one vector, a lane per copy, the epilogue runs on it
    outer = tuple(r for r in out_axes if r not in packed)
    packed_vals = {}
    for key in ctx.keys(outer):
        positions = [dict(zip(outer, key)) | dict(zip(packed, lane)) for lane in ctx.keys(packed)]
        tile = [vals[tuple(p[a] for a in out_axes)] for p in positions]  # the copies' accumulators, in lane order
        block = max(1, SHUFFLE_BLOCK_BYTES // tile[0].dtype.scalar.itemsize)
        packed_vals[key] = _fold_lanes_packed(tile, width, op, block)
    return Expanded(outer, packed_vals, packed=packed)


def packed_axes(out_axes: tuple[UOp, ...], width: int, stored_along: AbstractSet[UOp]) -> tuple[UOp, ...]:
    """The output copies of a reduce that folds its vector lanes whose results are packed into one vector: ranges
    whose product is a power of two up to the vector's width, the innermost ones, and a range some store writes
    contiguously along innermost of all (its lanes are then stored as vectors: `store_packed`)"""
    packed: tuple[UOp, ...] = ()
    n = 1
    for r in sorted(reversed(out_axes), key=lambda r: r not in stored_along):
        m = n * range_lanes(r)
        if m > width or m & (m - 1):
            break
        packed, n = (r, *packed), m
    return packed if n > 1 else ()


def expand_end(ctx: Expander, u: UOp) -> Expanded:
    """# END(stores, loops + expanded ranges) -> END(all copies of the stores, loops): expanded ranges are no loops"""
    keep = [r for r in u.src[1:] if r not in ctx.unrolled and r not in ctx.vecs]
    return Expanded((), {(): ctx.exp[u.src[0]].vals[()].end(*keep)})


def expand_elementwise(ctx: Expander, u: UOp) -> Expanded:
    """# op(a, b) -> op(a(k), b(k)) for each copy k of the ranges either depends on; a vector op if either is one
    (the other broadcast); an op on a packed value is packed the same way (the other's copies gathered into its
    lanes: the epilogue of a tile of dot products runs on the tile's vectors)"""
    axes = ctx.axes_of(*u.src)
    v = next((ctx.exp[s].v for s in u.src if ctx.exp[s].vec), None)  # one at most: the ranges are chosen so
    packed = next((ctx.exp[s].packed for s in u.src if ctx.exp[s].packed), ())
    if v is None and packed and all(ctx.exp[s].packed in ((), packed) for s in u.src):
        axes = tuple(r for r in axes if r not in packed)
        dtype = u.dtype.vec(packed_lanes(packed))
        vals = {
            key: UOp(u.op, dtype, tuple(ctx.get_packed(s, axes, key, packed) for s in u.src), u.arg)
            for key in ctx.keys(axes)
        }
        return Expanded(axes, vals, packed=packed)
    dtype = u.dtype.vec(range_lanes(v)) if v is not None else u.dtype
    vals = {key: UOp(u.op, dtype, tuple(ctx.get(s, axes, key, v) for s in u.src), u.arg) for key in ctx.keys(axes)}
    return Expanded(axes, vals, v)


def expand_after(ctx: Expander, u: UOp) -> Expanded:
    """# AFTER(x, *deps) -> AFTER(x(k), *every copy of deps) for each copy k of x: deps are statements (a row
    buffer's stores, schedule/kernel.py) or values it waits for, never broadcast into x's lanes"""
    x, deps = u.src[0], ctx.flat_vals(u.src[1:])
    e = ctx.exp[x]
    vals = {key: UOp(Ops.AFTER, val.dtype, (val, *deps)) for key, val in e.vals.items()}
    return Expanded(e.axes, vals, e.v, e.packed)


pm_expand = PatternMatcher(
    [
        (UPat(Ops.RANGE, name="r"), expand_range),
        (UPat(name="u"), keep_unexpanded),
        # INDEX -> INDEX: LOAD and STORE expand their INDEX themselves
        (UPat(Ops.INDEX, name="u"), lambda u: Expanded((), {(): u})),
        (UPat(Ops.LOAD, name="u"), expand_load),
        (UPat(Ops.STORE, name="u"), expand_store),
        (UPat(Ops.REDUCE, name="u"), expand_reduce),
        (UPat(Ops.END, name="u"), expand_end),
        (UPat(Ops.AFTER, name="u"), expand_after),
        # SINK(a, b) / GROUP(a, b) -> SINK(a(0), ..., a(n-1), b(0), ...): statements keep every copy of every source
        (
            UPat((Ops.SINK, Ops.GROUP), name="u"),
            lambda ctx, u: Expanded((), {(): UOp(u.op, dtypes.void, tuple(ctx.flat_vals(u.src)))}),
        ),
        (UPat(name="u"), expand_elementwise),
    ]
)


def packed_lanes(packed: tuple[UOp, ...]) -> int:
    return prod(range_lanes(r) for r in packed)


def range_lanes(r: UOp) -> int:
    """An UPCAST/UNROLL range's size: always a constant (the optimizer splits a symbolic one into a constant part
    and a tail loop)."""
    n = trip_count(r)
    assert isinstance(n, int), f"an expanded range has a constant size, got {n}"
    return n


def _fold_lanes(v: UOp, width: int, op: Ops) -> UOp:
    """# v[0] op v[1] op ... op v[w-1] -> (lo op hi) halved log2(w) times: lo, hi = v[:w/2], v[w/2:]
    (a tree of vector ops, instead of w-1 dependent scalar ones)"""
    while width > 1:
        half = width // 2
        lo = UOp(Ops.GEP, v.dtype.scalar.vec(half) if half > 1 else v.dtype.scalar, (v,), tuple(range(half)))
        hi = UOp(Ops.GEP, lo.dtype, (v,), tuple(range(half, width)))
        v, width = UOp(op, lo.dtype, (lo, hi)), half
    return v


def _fold_lanes_packed(xs: list[UOp], width: int, op: Ops, block: int) -> UOp:
    """# [x0[0] op ... op x0[w-1], x1[0] op ... op x1[w-1], ...] (n vectors of w lanes, n a power of two <= w) -> one
    vector of n lanes: a transposed horizontal reduce. Pairs (a, b) are folded together, each lane of the result
    holding one source's partial result: (a's first halves ++ b's) op (a's second halves ++ b's), first within each
    `block` of lanes (a 16-byte lane of AVX: one-cycle shuffles), then whole blocks (lane-crossing shuffles, fewer of
    them), until one vector is left, whose sources' partial lanes are then folded in halves. n*log2(w)-ish vector ops
    and a short dependency chain, instead of n horizontal reduces; the results in xs' order (AVX2, 8 accumulators: the
    hadd-and-permute transpose)"""
    scalar, block = xs[0].dtype.scalar, min(block, width)

    def gather(lanes: list[tuple[UOp, int]]) -> UOp:
        return UOp(Ops.VECTORIZE, scalar.vec(len(lanes)), tuple(UOp(Ops.GEP, scalar, (v,), (i,)) for v, i in lanes))

    vecs = [(x, [src] * width) for src, x in enumerate(xs)]  # each vector and the source of each of its lanes
    while len(vecs) > 1:
        nxt = []
        for (a, a_src), (b, b_src) in zip(vecs[0::2], vecs[1::2]):
            lo: list[tuple[UOp, int]] = []
            hi: list[tuple[UOp, int]] = []
            srcs: list[int] = []
            for pairs in _lane_pairs(a, a_src, b, b_src, width, block):
                lo += [p[0] for p in pairs]
                hi += [p[1] for p in pairs]
                srcs += [(a_src if v is a else b_src)[i] for v, i in (p[0] for p in pairs)]
            nxt.append((UOp(op, scalar.vec(width), (gather(lo), gather(hi))), srcs))
        vecs = nxt
    v, v_src = vecs[0]
    while len(v_src) > len(xs):  # one vector, with several lanes per source: each source's lanes halved
        own = [[i for i, s in enumerate(v_src) if s == src] for src in range(len(xs))]
        lo_i = tuple(i for lanes in own for i in lanes[: len(lanes) // 2])
        hi_i = tuple(i for lanes in own for i in lanes[len(lanes) // 2 :])
        dt = scalar.vec(len(lo_i))
        v, v_src = UOp(op, dt, (UOp(Ops.GEP, dt, (v,), lo_i), UOp(Ops.GEP, dt, (v,), hi_i))), [v_src[i] for i in lo_i]
    if v_src != list(range(len(xs))):
        v = UOp(Ops.GEP, v.dtype, (v,), tuple(v_src.index(src) for src in range(len(xs))))
    return v


def _lane_pairs(a: UOp, a_src: list[int], b: UOp, b_src: list[int], width: int, block: int):
    """The lanes of a and b folded together, as (lane, lane) pairs in the result's lane order: where a source has
    several lanes in each block, block by block a's then b's sources' lanes, first halves with second halves (the
    result stays in the block); else a's then b's blocks of each set of sources, the first half of them with the
    second half (whole blocks move)"""
    if a_src[:block].count(a_src[0]) > 1:
        for start in range(0, width, block):
            for v, v_src in ((a, a_src), (b, b_src)):
                for s in dict.fromkeys(v_src[start : start + block]):
                    own = [i for i in range(start, start + block) if v_src[i] == s]
                    half = len(own) // 2
                    yield [((v, i), (v, j)) for i, j in zip(own[:half], own[half:])]
        return
    for v, v_src in ((a, a_src), (b, b_src)):
        groups: dict[tuple[int, ...], list[int]] = {}
        for start in range(0, width, block):
            groups.setdefault(tuple(v_src[start : start + block]), []).append(start)
        for starts in groups.values():
            half = len(starts) // 2
            for lo, hi in zip(starts[:half], starts[half:]):
                yield [((v, lo + j), (v, hi + j)) for j in range(block)]


def _fold(xs: list[UOp], op: Ops) -> UOp:
    ret = xs[0]
    for x in xs[1:]:
        ret = UOp(op, ret.dtype, (ret, x))
    return ret


@named_pass("expand", "UPCAST/UNROLL ranges -> vector lanes and unrolled copies")
def expand(ast: UOp, max_vec_bytes: int = 64) -> UOp:
    """# SINK(nest, ...) -> SINK(*expanded nest, ...): each loop nest (a tail is one) takes its own vector range, so
    a tail's 4 remaining columns of a 28-wide axis run as a 4-lane vector, not as 4 scalar copies"""
    if ast.op is not Ops.SINK or len(ast.src) < 2:
        return Expander(ast, max_vec_bytes).expand()
    nests = [Expander(UOp(Ops.SINK, dtypes.void, (nest,), ast.arg), max_vec_bytes).expand() for nest in ast.src]
    return UOp(Ops.SINK, dtypes.void, tuple(s for n in nests for s in n.src), ast.arg)
