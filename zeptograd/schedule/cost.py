"""The scheduler's cost model: whether inlining a node into its consumers' kernels costs more than a buffer.

Inlined, a node is evaluated once per iteration of the loops in scope where it is read (its consumer kernel's
output loops and any reduce loops around the read), so a value that does not vary along one of those loops is
recomputed there: a prologue expanded into a matmul (`(x*g + b) @ w` recomputes `x*g + b` once per output
column), a reduce read through a cat's PAD (each part's matmul evaluated at every output of the cat), a value read
at two index sets (`y + y.T`: the transposed read walks every input of `y` with a stride). Materialized, it is
evaluated once per element, stored, and loaded back at each read, plus a kernel's fixed cost; a buffer that does not
fit the cache stores and loads at DRAM's cost (softmax's exp is stored at (256, 256), recomputed at (4096, 4096)).

A contraction (a sum of products whose operands are each broadcast along an axis of the other: matmul, conv) runs in
a register tile where its outputs are a kernel's loops: each loaded value feeds up to TILE_REUSE multiply-adds, so its
work per reduced element is a multiply-add and a fraction of each load (`tiled`). Read inside another reduce's loop
over its outputs (a conv + relu + global average pool fused as a nested reduce), its outputs are that reduce's loops,
no tile forms, and each multiply-add loads both operands: inlined there it costs its untiled work (`work`), stored its
tiled work plus a store and a load per output.

The same comparison splits an epilogue off a reduce (`split_epilogue_is_cheaper`): fused after a reduce that codegen
vectorizes along its reduce axis (x @ w.T), the epilogue runs on one scalar per output (gelu's exp2 16 times over);
in its own kernel it runs 16 lanes wide, for a kernel, a store and a load per output.

Costs are rough units of 1/16 cycle per element on one core (a vector add), summed along the inlined graph and
calibrated by kernel timings on the 2-core AVX-512 machine (the constants say which); only the comparison matters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zeptograd.buffers import view_base
from zeptograd.helpers import prod
from zeptograd.uop.ops import AxisType, GroupOp, Ops, UOp, const_trip_count

ALU = 1  # one arithmetic op (vectorized: a fraction of a cycle per element)
# exp2/log2/sin: a polynomial of ~20 vector ops (measured: exp2 ~0.4 ns per element, an add ~0.02 ns); sqrt and
# reciprocal: one long-latency instruction
TRANSCENDENTAL = {Ops.EXP2: 20, Ops.LOG2: 20, Ops.SIN: 20, Ops.COS: 20, Ops.TAN: 20, Ops.SQRT: 4, Ops.RECIPROCAL: 4}
LOAD = 4  # an element streamed from memory
STRIDED_LOAD = 64  # an element read across rows: a cache line for one element
STORE = 8  # an element written (the line is read for ownership first)
CACHE_BYTES = 16 << 20  # a stored buffer up to half the 32 MiB L3 is read back from the cache ...
DRAM = 8  # ... a larger one's stores and loads cost this many times more (x + 1 over 2^24 floats: 1.8 ns per
# element; over 2^20, in cache, 0.24 ns)
KERNEL = 65536  # a kernel's fixed cost: a launch, a pass's startup, a thread handoff
# an op on one value at a time instead of 16 lanes: the epilogue of a reduce vectorized along its reduce axis (x @ w.T)
# runs on the tile's scalar results. Measured per output there: exp2 ~5 ns (16 lanes' worth of its polynomial),
# sqrt ~0.7 ns, a causal mask's 10 ALU ops ~1.7 ns, a relu's 4 nothing measurable (LLVM's SLP vectorizer packs some):
# an ALU op or a load 2, between those
SCALAR_OP = {Ops.EXP2: 256, Ops.LOG2: 256, Ops.SIN: 256, Ops.COS: 256, Ops.TAN: 256, Ops.SQRT: 32, Ops.RECIPROCAL: 32}
SCALAR_ALU = 2
SIMD_WIDTH = 16  # float32 lanes of an AVX-512 vector
# a register tile (codegen/opt/tiles.py: tile_shape) loads each operand once per row or column of the tile: 3 rows x
# 4 vectors with AVX2, 8 x 2 with AVX-512. Measured on an AVX2 host, 2 cores: (1000x512) @ (512x169) as a kernel of its
# own ~130 GFLOPS, fused into a reduce over its 169 outputs (SqueezeNet's conv + relu + global pool) 5.5 GFLOPS
TILE_REUSE = 8
# a contraction's output that outgrows its operands (`CostModel.expands`: attention's N x N scores of N x d q and k,
# N / 2d times their size) and whose buffer exceeds this is the memory cliff a row buffer removes: storing it is not
# weighed. Below it, with the keys gathered (k read along d: codegen's score tile of 8 query rows x a vector of 8 keys
# built of scalar loads, codegen/opt/tiles.py: score_tile), the one kernel is about as fast as the stored scores'
# tiled matmul ((1, 1, 2048, 64) on 2 AVX2 cores, median kernel CPU time: 1.02-1.06x; a query row at a time it was
# 1.5x), and attention written by hand 1.2-1.3x: there the normal comparison decides (it stores them)
EXPANDED_BUFFER_BYTES = 256 << 20
# ... and where the contraction reads its operand along the row with stride 1 (attention's keys stored in panels,
# tensor/attention.py: _keys_in_panels), codegen computes the row buffer's scores as a register tile of query rows x
# vectors of keys loaded whole, faster than the stored scores at every size measured: (1, 1, 2048, 64) 0.73x (torch
# 0.62-0.75x), causal 0.73x, (1, 4, 1024, 32) 0.70x, (1, 12, 128, 32) 0.91x, (1, 1, 128, 32) 0.92x (median kernel
# CPU time, one process, 2 AVX2 cores under load)
ROW_TILED_BUFFER_BYTES = 0
MAX_COST = 1 << 62  # sums along a graph with shared subexpressions count them once per use: cap them
MAX_LAYOUT_WALK = 64  # nodes walked to find how an inlined node's loads move


COMPARISONS = (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ)


@dataclass
class InlineEstimate:
    """The cost model's two sums for one node (`CostModel.inline_estimate`), or why it gives none."""

    costlier: bool = False  # inlined costs more than a buffer
    inline: int = 0
    keep: int = 0
    reads: int = 0  # the requests summed (the comparison stops once inlining costs more)
    evaluations: int = 0  # the inlined evaluations of those reads
    why_none: str = ""  # where the model gives no estimate: why (then costlier is False)


class CostModel:
    """Per-node estimates over the tensor graph, stopping at nodes that are materialized up front."""

    def __init__(self, nodes: list[UOp], realized: set[UOp], src_requests: Callable):
        self.src_requests, self.realized = src_requests, realized  # how a node reads its sources (the index walk)
        self.work: dict[UOp, int] = {}  # cost of evaluating the node once, inlined
        self.loads: dict[UOp, int] = {}  # buffer elements read by one inlined evaluation
        self.constant: dict[UOp, bool] = {}  # built from constants alone (a broadcast scalar)
        self.index_only: dict[UOp, bool] = {}  # built from IOTA (an arange mask): codegen folds these, keep inline
        self.feeds_index: dict[UOp, bool] = {}  # read only by index-only nodes (a gather's index, `arange == idx`)
        self.selects: set[UOp] = set()  # the `where(mask, value, 0)` of a one-hot select-sum: folded into one load
        self.tiled: dict[UOp, int] = {}  # a contraction's work evaluated once in a register tile (see TILE_REUSE)
        self.consumers: dict[UOp, list[UOp]] = {}
        for u in nodes:
            for s in u.src:
                self.consumers.setdefault(s, []).append(u)
        for u in nodes:
            read = [(self.read_cost(s), self.read_loads(s)) for s in u.src]
            own = ALU if u.op in GroupOp.Elementwise or u.op is Ops.PAD else 0
            own = TRANSCENDENTAL.get(u.op, own)
            work, loads = own + sum(w for w, _ in read), sum(n for _, n in read)
            self.constant[u] = u.op in (Ops.CONST, Ops.DEVICE) or (
                u.op not in (Ops.BUFFER, Ops.IOTA) and all(self.constant[s] for s in u.src)
            )
            self.index_only[u] = self.index_only_node(u)
            if u.op is Ops.REDUCE_AXIS and self.selects_one(u):
                self.selects.add(u.src[0])
            elif u.op is Ops.REDUCE_AXIS:  # the body runs once per reduced element
                n = prod(u.src[0].tensor_shape) // max(prod(u.tensor_shape), 1) if self.static(u.src[0]) else 1
                if (tiled := self.tiled_body(u)) is not None:
                    self.tiled[u] = min((tiled + ALU) * n, MAX_COST)
                work, loads = (work + ALU) * n, loads * n
            self.work[u], self.loads[u] = min(work, MAX_COST), min(loads, MAX_COST)
        for u in reversed(nodes):  # consumers first
            users = self.consumers.get(u, [])
            self.feeds_index[u] = bool(users) and all(
                (c.op in COMPARISONS and self.index_only[c]) or (not self.index_only[c] and self.feeds_index[c])
                for c in users
            )  # compared with an arange (`arange == idx`), directly or through its own arithmetic

    def index_only_node(self, u: UOp) -> bool:
        """An arange, a comparison of one with anything (`arange == idx`, a causal mask), or arithmetic over those and
        constants (`mask.where(0, -inf)`). Not a value computed from data with one (`qk + mask.where(0, -inf)`): that
        is data, and recomputing it (with the softmax after it) at every read can cost more than a buffer."""
        if u.op is Ops.IOTA:
            return True
        masks = [self.index_only[s] and s not in self.realized for s in u.src if not self.constant[s]]
        return any(masks) if u.op in COMPARISONS else bool(masks) and all(masks)

    def selects_one(self, u: UOp) -> bool:
        """A sum of `where(mask, value, 0)` under an index-only mask (a gather's one-hot select): codegen folds it to
        one read of the value at the selected index, so it costs one evaluation, not one per reduced element, and
        the select itself is never stored (a one-hot product the size of the whole table)."""
        src = u.src[0]
        return u.arg[0] is Ops.ADD and src.op is Ops.WHERE and self.index_only[src.src[0]] and self.constant[src.src[2]]

    def tiled_body(self, u: UOp) -> int | None:
        """Where reduce u is a contraction — a sum of a product with an operand broadcast (an EXPAND below its view
        ops: x[i, k] along j, w[k, j] along i) —, the work of its body per reduced element in a
        register tile: the multiply and each operand's read shared by the tile's rows or columns it is broadcast
        along (up to TILE_REUSE; a matrix-vector product's matrix is read once per multiply-add). None otherwise."""
        body = u.src[0]
        if u.arg[0] is not Ops.ADD or body.op is not Ops.MUL or not self.static(body):
            return None
        work, broadcast = ALU, False
        for s in body.src:
            reuse, v = 1, s
            while v.op in GroupOp.Movement and v not in self.realized:
                if v.op is Ops.EXPAND and self.static(v.src[0]):
                    reuse *= prod(v.tensor_shape) // max(prod(v.src[0].tensor_shape), 1)
                v = v.src[0]
            broadcast |= reuse > 1
            work += -(-self.read_cost(s) // max(min(reuse, TILE_REUSE), 1))  # (an empty tensor: reuse 0)
        return work if broadcast else None  # else an elementwise product summed (a dot of two vectors, a norm)

    def contraction_work(self, x: UOp, idx: tuple[UOp, ...], valid: UOp | None = None) -> int:
        """x's work evaluated once at a read at idx: a contraction read at output loops runs in a register tile; one
        whose outputs are a reduce's loops there (idx uses a reduce range) does not (see TILE_REUSE), nor one read
        under a pad's gate (a padded copy of a conv's output: the tile's rows and columns are the gated border)."""
        if x not in self.tiled or valid is not None or any(r.arg[1] is AxisType.REDUCE for i in idx for r in i.ranges):
            return self.work[x]
        return self.tiled[x]

    # a reduce below counts as a load: one recomputed at several places is materialized by its own decision
    def read_cost(self, s: UOp) -> int:
        return LOAD if s.op in (Ops.BUFFER, Ops.REDUCE_AXIS) or s in self.realized else self.work[s]

    def read_loads(self, s: UOp) -> int:
        return 1 if s.op in (Ops.BUFFER, Ops.REDUCE_AXIS) or s in self.realized else self.loads[s]

    def loads_across_rows(self, x: UOp, req, scope: set[UOp]) -> int:
        """The buffer loads of x inlined at req that move across rows as the innermost loop in scope advances: each
        buffer reached through x's view ops, read at the index the request becomes there (the walk stops at
        reduces and materialized nodes, and after MAX_LAYOUT_WALK nodes, counting the rest as contiguous)."""
        inner = innermost_output_loop(scope)
        if inner is None:
            return 0
        stack, seen, strided = [(x, req)], set[tuple[UOp, Any]](), 0
        while stack and len(seen) < MAX_LAYOUT_WALK:
            u, ureq = stack.pop()
            if (u, ureq) in seen:
                continue
            seen.add((u, ureq))
            if view_base(u) is not None or (u is not x and u in self.realized):
                strided += moves_across_rows(ureq[0], inner)
            elif u.op is not Ops.REDUCE_AXIS:
                stack.extend((s, sreq) for s, sreq, _ in self.src_requests(u, ureq))
        return strided

    @staticmethod
    def static(x: UOp) -> bool:
        return all(isinstance(s, int) for s in x.tensor_shape)

    def inline_estimate(self, x: UOp, reqs: dict) -> InlineEstimate:
        """Evaluating x at every read (its requests, each with the ranges in scope there) against computing it once
        per element, storing it and loading it at every read. The sums stop at the first read after which inlining
        costs more."""
        if self.index_only[x] or self.feeds_index[x]:
            return InlineEstimate(why_none="index arithmetic (an arange mask, a gather's index): codegen folds it")
        if x in self.selects:
            return InlineEstimate(why_none="a gather's one-hot select: one evaluation, never stored")
        if not self.static(x):
            return InlineEstimate(why_none="a symbolic shape: no estimate")
        if self.work[x] <= LOAD:
            return InlineEstimate(why_none=f"its work ({self.work[x]}) is at most a load's ({LOAD})")
        mem = self.memory_scale(x)
        own = self.tiled.get(x, self.work[x])  # materialized, a contraction's outputs are its kernel's loops: a tile
        est = InlineEstimate(keep=(own + STORE * mem) * prod(x.tensor_shape) + KERNEL)
        for (idx, valid), scope in reqs.items():
            trips = [const_trip_count(r) for r in evaluated_in(idx, scope, valid)]
            if any(t is None for t in trips):
                return InlineEstimate(why_none="a symbolic loop: no estimate")
            strided = reads_across_rows(idx, scope)
            extra = (STRIDED_LOAD - LOAD) * self.loads_across_rows(x, (idx, valid), scope) if strided else 0
            n = prod(trips)
            est.inline += (self.contraction_work(x, idx, valid) + extra) * n
            est.keep += (STRIDED_LOAD if strided else LOAD * mem) * n
            est.reads, est.evaluations = est.reads + 1, est.evaluations + n
            if est.inline > est.keep:
                est.costlier = True
                break
        return est

    def row_buffer_is_cheaper(self, x: UOp, reqs: dict, fill, below: set[UOp], contiguous: bool = False) -> bool:
        """Whether x, read across one row at several places of a kernel (`MaterializationPolicy.row_buffer_request`),
        costs least computed once per element at its fill read and kept in a row buffer (a store there, a load at
        each other read, in L1) rather than recomputed at every read (inlined) or stored in memory. `below`: the
        reduces x's fill computes with it (attention's scores, a contraction over d), each element's at its untiled
        work (read at a reduce's loop, no register tile forms: see TILE_REUSE).

        Where those contractions' output is larger than their operands (`expands`: attention's N x N scores of N x d
        queries and keys) and its buffer exceeds the bound (ROW_TILED_BUFFER_BYTES where `contiguous`: they read their
        operand along the row with stride 1 or in panels, attention's keys in panels; else EXPANDED_BUFFER_BYTES),
        storing x is not weighed: its buffer is the memory cliff the row buffer removes (extra memory of a row, not
        N x N), so the row buffer is compared with recomputing the contraction at each read only. Below that bound
        the normal comparison decides (it stores the scores: see the bounds' measurements).
        """
        if self.index_only[x] or self.feeds_index[x] or x in self.selects:
            return False
        work = min(self.work[x] + sum(self.work[r] - LOAD for r in below), MAX_COST)
        if work <= LOAD:
            return False
        evals = {}
        for (idx, valid), scope in reqs.items():
            trips = [const_trip_count(r) for r in evaluated_in(idx, scope, valid)]
            if any(t is None for t in trips):
                return False
            evals[(idx, valid)] = prod(trips)
        reads = sum(evals.values())
        inline = work * reads
        # a row buffer's store and load cost what a cached buffer's do: measured (kernel times, one process), x - max
        # (work 9) read twice is as fast recomputed as row-buffered (log_softmax, layernorm), exp(x - max) (31) is
        # 1.2-1.5x faster row-buffered (softmax at (4096, 4096), (512, 1000), (64, 1000))
        row = (work + STORE) * evals[fill] + LOAD * (reads - evals[fill])
        bound = ROW_TILED_BUFFER_BYTES if contiguous else EXPANDED_BUFFER_BYTES
        if below and self.expands(x, below) and prod(x.tensor_shape) * x.dtype.itemsize > bound:
            return row < inline
        mem = self.memory_scale(x)
        stored = self.work[x] + sum(self.tiled.get(r, self.work[r]) - LOAD for r in below)  # stored: tiled
        keep = (stored + STORE * mem) * prod(x.tensor_shape) + KERNEL + LOAD * mem * reads
        return row < inline and row < keep

    def expands(self, x: UOp, contractions: set[UOp]) -> bool:
        """Whether x (the output of these contractions, through elementwise ops) has more elements than the
        contractions' operands together: a product of broadcast operands whose buffer would outgrow its inputs
        (attention's N x N scores of N x d queries and keys: N / 2d times their size)."""
        operands = 0
        for red in contractions:
            if not self.static(red.src[0]) or red.src[0].op is not Ops.MUL:
                return False
            for s in red.src[0].src:
                while s.op in GroupOp.Movement and s not in self.realized:
                    s = s.src[0]
                if not self.static(s):
                    return False
                operands += prod(s.tensor_shape)
        return self.static(x) and prod(x.tensor_shape) > operands

    def inline_is_costlier(self, x: UOp, reqs: dict) -> bool:
        return self.inline_estimate(x, reqs).costlier

    def split_epilogue_is_cheaper(self, x: UOp, reqs: dict) -> bool:
        """Whether reduce x, when codegen vectorizes it along its reduce axis (`reduces_its_lanes`: x @ w.T, whose
        operands are both contiguous along k), costs less stored with its epilogue in a kernel of its own: fused, the
        epilogue runs on the dot-product tile's scalar results (SCALAR_OP per op and output: gelu's exp2); split,
        it runs 16 lanes wide, for a kernel, a store and a load of each output more."""
        if not self.static(x) or not any(self.reduces_its_lanes(x, req, scope) for req, scope in reqs.items()):
            return False
        scalar = self.scalar_epilogue_cost(x)
        outputs = prod(x.tensor_shape)
        return scalar * outputs > KERNEL + (STORE + LOAD) * self.memory_scale(x) * outputs

    @staticmethod
    def memory_scale(x: UOp) -> int:
        """How much more x's stores and loads cost when its buffer does not stay in the cache (DRAM)."""
        return DRAM if prod(x.tensor_shape) * x.dtype.itemsize > CACHE_BYTES else 1

    def scalar_epilogue_cost(self, x: UOp) -> int:
        """The cost per output of the elementwise ops fused after x in its kernel, on scalars: x's consumers through
        elementwise and reshape/permute nodes, up to and including the nodes that are stored (a broadcast read, an
        EXPAND, is in another loop nest: not an epilogue), and what they read besides x (a bias, a causal mask)."""
        epilogue, stack = set[UOp](), list(self.consumers.get(x, []))
        while stack:
            u = stack.pop()
            if u in epilogue or u.op not in GroupOp.Elementwise | {Ops.RESHAPE, Ops.PERMUTE}:
                continue
            epilogue.add(u)
            if u not in self.realized:
                stack.extend(self.consumers.get(u, []))
        seen, cost = set[UOp](), 0
        stack = [*epilogue]
        while stack:
            u = stack.pop()
            if u in seen or u is x or self.constant[u]:
                continue
            seen.add(u)
            if u not in epilogue and (u.op in (Ops.BUFFER, Ops.REDUCE_AXIS) or u in self.realized):
                cost += SCALAR_ALU  # a load
                continue
            cost += SCALAR_OP.get(u.op, SCALAR_ALU if u.op in GroupOp.ALU else 0)
            stack.extend(s for s in u.src if u not in epilogue or s not in epilogue)
        return cost

    def reduces_its_lanes(self, x: UOp, req, scope: set[UOp]) -> bool:
        """Whether codegen's vector axis for reduce x read at req is a reduce axis: the buffer loads under x that walk
        one of its reduce ranges with stride 1 outweigh those (and the store) that walk the innermost output loop,
        each weighted by the vector lanes its loop fills (`lanes`: g @ w2.T's 10-long reduce fills none, as in
        codegen/opt/heuristic.py). The walk stops at reduces and materialized nodes, and after MAX_LAYOUT_WALK nodes."""
        inner = innermost_output_loop(scope)
        along_reduce, along_output = 0, lanes(inner) if inner is not None else 0  # the store
        for src, sreq, reduce_ranges in self.src_requests(x, req):
            stack, seen = [(src, sreq)], set[tuple[UOp, Any]]()
            while stack and len(seen) < MAX_LAYOUT_WALK:
                u, ureq = stack.pop()
                if (u, ureq) in seen:
                    continue
                seen.add((u, ureq))
                if view_base(u) is not None or u in self.realized or u.op is Ops.REDUCE_AXIS:
                    moving = [i for i in ureq[0] if i.op is not Ops.CONST]
                    last = moving[-1].ranges if moving else []
                    if walked := [r for r in reduce_ranges if r in last]:
                        along_reduce += lanes(walked[0])
                    elif inner is not None and inner in last:
                        along_output += lanes(inner)
                else:
                    stack.extend((s, sr) for s, sr, _ in self.src_requests(u, ureq))
        return along_reduce > along_output


def lanes(r: UOp) -> int:
    """The vector lanes loop r fills as codegen vectorizes it: the SIMD width (with a tail) when it is that long or
    symbolic, else the largest power of two dividing its trip count, if at least 4 (a 10-long loop: none)."""
    n = const_trip_count(r)
    if n is None or n >= SIMD_WIDTH:
        return SIMD_WIDTH
    d = next(w for w in (8, 4, 2, 1) if n % w == 0)
    return d if d >= 4 else 0


def read_ranges(idx: tuple[UOp, ...], valid: UOp | None) -> set[UOp]:
    """The loops a read at (idx, valid) varies along: its index's, and its pad gate's, which gates the value's loads
    (a cat of 8 row maxes computes every part's max at each of the 8 output columns, its loads gated off at 7)."""
    used = {r for i in idx for r in i.ranges}
    return used | set(valid.ranges) if valid is not None else used


def evaluated_in(idx: tuple[UOp, ...], scope: set[UOp], valid: UOp | None = None) -> list[UOp]:
    """The loops an inlined value is evaluated in: those its read varies along (`read_ranges`) and those around
    them. A loop nested inside all of them is not: the linearizer places work that does not vary along a loop before
    the loop opens."""
    used = read_ranges(idx, valid)
    inner = max((r.arg[0] for r in used), default=-1)
    return [r for r in scope if r in used or r.arg[0] < inner]


def moves_across_rows(idx: tuple[UOp, ...], inner: UOp) -> bool:
    """Whether the loop `inner` moves a read at idx across rows: it appears in an outer dimension's index and not in
    the last one's (a read that does not use it stays on one element: a broadcast)."""
    moving = [i for i in idx if i.op is not Ops.CONST]  # a size-1 or broadcast dimension is read at 0
    if len(moving) < 2 or any(r.arg[1] is AxisType.REDUCE for r in moving[-1].ranges):
        return False  # a reduce walks the last dimension (a row's sum): codegen vectorizes the reduce along it
    return inner not in moving[-1].ranges and any(inner in i.ranges for i in moving[:-1])


def innermost_output_loop(scope: set[UOp]) -> UOp | None:
    """The output loop the stores walk with stride 1. Reduce loops are left out: the optimizer orders and tiles a
    reduce's loops around its loads (a matmul's operands are read across rows at no such cost)."""
    return max((r for r in scope if r.arg[1] is AxisType.LOOP), key=lambda r: r.arg[0], default=None)


def reads_across_rows(idx: tuple[UOp, ...], scope: set[UOp]) -> bool:
    """Whether a read at idx moves across rows as the innermost output loop in scope advances (a transposed read)."""
    inner = innermost_output_loop(scope)
    return inner is not None and moves_across_rows(idx, inner)
