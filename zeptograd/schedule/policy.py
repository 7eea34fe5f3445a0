"""Materialization policy: which tensor nodes get a buffer (a kernel boundary) and which are inlined into their
consumers' kernels.

Up front (`MaterializationPolicy.realized_up_front`): outputs, CONTIGUOUS, ASSIGN, and cuts that keep a kernel within
the compilers' and devices' limits. During the index walk (`must_realize`, once all of a node's consumers and the
loops in scope at each read are known): a reduce that does not vary along a loop its consumer runs, a node whose
recomputation at every read costs more than a buffer and a reduce whose epilogue would run on scalars (both the cost
model, `schedule/cost.py`), a padded window over computed values.
"""

from __future__ import annotations

from zeptograd.device import Device
from zeptograd.helpers import prod
from zeptograd.schedule.bufferize import kernel_value_nodes
from zeptograd.schedule.copy import copy_realizes
from zeptograd.schedule.cost import CostModel, read_ranges
from zeptograd.schedule.indexing import Rangeify, Request, Requests, flat_index, is_window
from zeptograd.schedule.nofuse import nofuse_realize
from zeptograd.uop.ops import AxisType, GroupOp, Ops, UOp, const_trip_count
from zeptograd.uop.symbolic import split_sum
from zeptograd.viz.hook import decided, decided_after_walk, decided_all  # VIZ=1 records each decision

MAX_REQUESTS = 8  # distinct index sets for one inlined node before it is materialized instead
MAX_KERNEL_BUFS = 30  # input buffers one kernel may read (OpenCL guarantees few arguments)
MAX_KERNEL_OPS = 2000  # a fused chain longer than this is cut: C compilers choke on 10^5-statement functions
MAX_INDEX_NODES = 48  # an index expression grown past this many UOps (a chain of views that do not fold) is cut
MAX_HOISTED_ROW = 1 << 15  # inputs per output of a reduce kept in a kernel that reads it across a row (128 KiB)
MAX_INLINED_VALUE_NODES = 64  # a value inlined again after the walk is copied at each read: keep those copies small
# a row buffer (a stack array in the kernel) at most this long: every float32 row MAX_HOISTED_ROW keeps in a kernel
# (measured: a (64, 32768) softmax takes 1.84x x.exp()'s kernel time row-buffered, 3.6x exp stored, 2.6x recomputed)
ROW_BUFFER_BYTES = 128 << 10
# on a GPU a row buffer is a work-group's local memory (codegen/gpudims.py: split_rows); this much of it is left for
# the row's reduces' partials (256 threads' partials of four float32 reduces)
GPU_ROW_BUFFER_RESERVE = 4 << 10


class MaterializationPolicy:
    def __init__(self, rf: Rangeify):
        self.rf = rf
        self.many_reads: set[UOp] = set()  # materialized only to bound the index walk (MAX_REQUESTS)
        self.inlined: dict[UOp, bool] = {}  # cheaper_inlined's answer per BUFFERIZE (asked at each of its reads)
        self.row_fill_reduces: set[UOp] = set()  # reduces below a row buffer's value, computed in its fill

    def realized_up_front(self, outputs: set[UOp]) -> set[UOp]:
        nodes = self.rf.nodes
        self.rf.realize |= outputs | {u for u in nodes if u.op in (Ops.CONTIGUOUS, Ops.ASSIGN)}
        self.rf.realize |= decided_all(copy_realizes(nodes), "a copy, or a copy's source that is not a whole buffer")
        self.rf.realize |= decided_all(nofuse_realize(nodes), "FUSE=0: every op its own kernel (no fusion)")
        self.rf.realize |= decided_all(self.long_chains(), "cuts a chain at MAX_KERNEL_OPS ops or MAX_KERNEL_BUFS")
        self.cost = CostModel(nodes, self.rf.realize, self.rf.src_requests)
        return self.rf.realize

    def must_realize(self, x: UOp, reqs: Requests) -> bool:
        if len(reqs) > MAX_REQUESTS and x.op not in GroupOp.Movement:
            self.many_reads.add(x)  # the walk stops here; `cheaper_inlined` may inline it again after the walk
            return decided(self, x, reqs, True, "read at over MAX_REQUESTS index sets: computed once")
        if x.op is Ops.RESHAPE and any(index_size(i) > MAX_INDEX_NODES for req in reqs for i in req[0]):
            return decided(self, x, reqs, True, "views composed divmods that do not fold: a copy keeps indexing linear")
        if x in self.row_fill_reduces and len(reqs) == 1:  # read only by a row buffer's fill: once per element
            return decided(self, x, reqs, False, "a reduce computed in a row buffer's fill (attention's scores)")
        if x.op in GroupOp.Elementwise and self.is_unhoistable_row_statistic(x, reqs):
            return decided(self, x, reqs, True, "a function of row reduces read inside a reduce: stored, they in it")
        if x.op is Ops.REDUCE_AXIS:
            if (hoisted := self.hoisted_reduce_requests(x, reqs)) is None:
                return decided(self, x, reqs, True, "a reduce read in a loop it does not vary along (not hoistable)")
            reqs = hoisted  # computed before the loops it does not vary along open: evaluated in the others only
        if x.op in GroupOp.Elementwise and (fill := self.row_buffer_request(x, reqs)) is not None:
            self.rf.row_buffered[x] = fill  # schedule/bufferize.py: a BUFFERIZE over the row, inside the kernel
            return decided(self, x, reqs, False, "a row buffer: computed once per element in its reduce's loop")
        if (x.op in GroupOp.Elementwise or x.op is Ops.REDUCE_AXIS) and self.cost.inline_is_costlier(x, reqs):
            return decided(self, x, reqs, True, "the cost model: recomputed at every read costs more than a buffer")
        if x.op is Ops.REDUCE_AXIS and self.cost.split_epilogue_is_cheaper(x, reqs):
            # its epilogue would run on scalars (gelu after x @ w.T): its own vector-wide kernel is cheaper
            return decided(self, x, reqs, True, "the cost model: its epilogue would run on scalars; split off")
        if x.op is Ops.PAD and self.reads_buffer(x) and prod(x.tensor_shape) <= 4 * prod(x.src[0].tensor_shape):
            window = [req for req in reqs if any(is_window(i) for i in req[0])]
            if window and not self.plain_read(x, window[0]):
                return decided(self, x, reqs, True, "a window over computed values or divmods: a padded copy")
        return decided(self, x, reqs, False, "inlined: no rule keeps it")

    def hoisted_reduce_requests(self, x: UOp, reqs: Requests) -> Requests | None:
        """A reduce's requests with each scope narrowed to the loops its index uses, where it can stay in its
        consumer's kernel computed once per iteration of those; None where a read would recompute it.

        # out[i, j] = f(red[i], ...), red[i] = reduce_k g[i, k]  (j nested inside i)
        #   -> for i: { acc = reduce_k g[i, k]; for j: out[i, j] = f(acc, ...) }
        The accumulator is initialised in the loops its value depends on (codegen/accumulator.py: range_scopes) and
        a reduce's loops open before output loops that are ready too (codegen/linearize.py), so a loop the reduce
        does not vary along costs nothing when it is nested inside every loop the reduce does vary along (softmax's
        and layernorm's row statistics, read across the row). On a GPU such a kernel runs a work-group per row, its
        threads sharing the reduce and the loop along the row (codegen/gpudims.py: split_rows), not a thread per
        output that would compute the whole reduce again. One output's inputs stay within MAX_HOISTED_ROW, so the
        passes over a row after the first read it from a core's cache: softmax reads each row from memory once.
        A reduce broadcast along an outer loop (column means subtracted from each row) is recomputed: stored. A pad's
        gate gates the reduce's loads, so the loops the gate varies along are used too: a cat of row maxes computes
        each part's max at every column of the cat, not once per row (schedule/cost.py: read_ranges)."""
        narrowed: Requests = {}
        for req, scope in reqs.items():
            used = read_ranges(*req)
            unused = scope - used
            if unused and not self.hoistable(x, used, unused):
                return None
            narrowed[req] = scope & used
        return narrowed

    def is_unhoistable_row_statistic(self, x: UOp, reqs: Requests) -> bool:
        """Whether x is an elementwise function of several reduces of its shape and constants only (a row's
        log-sum-exp, log(sum(exp(v - max))) + max) that a consumer reads inside a reduce loop it varies along (a
        loss's sum over the rows), the reduces read by nothing outside x's graph: stored, x's kernel computes its
        reduces once per row (the max hoisted into the sum's); inlined, each reduce is read there, cannot be hoisted,
        and is stored in a kernel of its own.

        # loss = sum_i f(max_j v[i, j], sum_j g(v[i, j], max_j v[i, j]))
        #   -> lse[i] = f(max, sum) (one kernel); loss = sum_i lse[i] (one kernel), not three kernels"""
        if not any(r.arg[1] is not AxisType.LOOP for req in reqs for r in read_ranges(*req)):
            return False
        reduces: set[UOp] = set()
        stack, seen = list(x.src), set()
        while stack:
            if (u := stack.pop()) in seen:
                continue
            seen.add(u)
            if u.op is Ops.REDUCE_AXIS:
                reduces.add(u)
            elif u.op in GroupOp.Elementwise or u.op in GroupOp.Movement:
                stack.extend(u.src)
            elif u.op is not Ops.CONST:
                return False  # reads a buffer or another value at its own elements: not a function of the reduces
        if len(reduces) < 2 or any(r in self.rf.realize or r.tensor_shape != x.tensor_shape for r in reduces):
            return False  # (a reduce broadcast into x, attention's row max into the scores: x is not per row)
        graph = set(x.toposort(gate=lambda u: u not in self.rf.realize))
        return all(c in graph for r in graph if r.op is Ops.REDUCE_AXIS for c in self.cost.consumers.get(r, []))

    def hoistable(self, x: UOp, used: set[UOp], unused: set[UOp]) -> bool:
        if not self.cost.static(x) or prod(x.src[0].tensor_shape) > MAX_HOISTED_ROW * prod(x.tensor_shape):
            return False  # a row longer than a core's cache holds (or of unknown length): read from memory again
        if any(r.arg[1] is not AxisType.LOOP for r in used):
            return False  # read inside a reduce loop it varies along: every output loop is outside that one
        if len(x.arg[1]) > 1 and (dev := self.rf.device.get(x)) and Device[dev].renderer.has_local:
            return False  # a GPU's row shares one reduce loop (split_rows): another axis's groups would each redo it
        inner_used = max((r.arg[0] for r in used), default=-1)
        return all(r.arg[0] > inner_used for r in unused if r.arg[1] is AxisType.LOOP)

    def row_buffer_request(self, x: UOp, reqs: Requests) -> Request | None:
        """The request at which x fills a row buffer, where x is read across one row of its last dimension at several
        places of one kernel: once inside a reduce over exactly that row (the fill: softmax's sum of exp), the others
        at loops walking the same row (the division by the sum). Then x is computed once per element in the reduce's
        loop, stored in a stack array of the row's length, and read back from it (`schedule/bufferize.py`,
        `row_buffer`) instead of recomputed at each read (inlined) or written to memory (materialized).

        # out[i, j] = f(x[i, j], reduce_r g(x[i, r]))
        #   -> for i: { for r: buf[r] = x[i, r]; acc = acc op g(buf[r]) }; for j: out[i, j] = f(buf[j], acc) }
        For a row within `row_buffer_bytes` (a CPU's stack; a GPU's local memory, shared by the work-group that
        runs the row: codegen/gpudims.py, split_rows), reads at one index of the other dimensions (one row) without
        a pad's gate, each at a bare loop of the row's length, and where the cost model finds the recomputation
        dearer than the buffer."""
        if len(reqs) < 2 or not self.cost.static(x) or not x.tensor_shape:
            return None
        n = x.tensor_shape[-1]
        if n < 2 or n * x.dtype.itemsize > self.row_buffer_bytes(x) or any(valid is not None for _, valid in reqs):
            return None
        if len({idx[:-1] for idx, _ in reqs}) != 1 or len({idx[-1] for idx, _ in reqs}) != len(reqs):
            return None  # not one row, or two reads at one element
        if not all(idx[-1].op is Ops.RANGE and const_trip_count(idx[-1]) == n for idx, _ in reqs):
            return None  # a read at an expression of the row's index (a shifted or flipped row)
        fills = [req for req in reqs if req[0][-1].arg[1] is AxisType.REDUCE and self.reduces_alone(req[0][-1])]
        if len(fills) > 1:  # reads in several reduces over the row: the fill is the one the others' reduces read
            fills = self.first_reduce(fills, reqs)
        if len(fills) != 1:
            return None
        fill, rows = fills[0], {idx[-1] for idx, _ in reqs}
        # a read inside the fill's loop, or the fill inside another read's loop: each would wait for the other
        inside = any(req != fill and fill[0][-1] in scope for req, scope in reqs.items())
        if inside or rows & reqs[fill] - {fill[0][-1]}:
            return None
        if not self.fits_local_memory(x, fill):
            return None
        below = self.reduces_below(x, fill)
        if not self.cost.row_buffer_is_cheaper(x, reqs, fill, below, self.reads_row_contiguously(x, fill, below)):
            return None
        self.row_fill_reduces |= below
        return fill

    def row_buffer_bytes(self, x: UOp) -> int:
        """The longest row buffer x's kernel may keep: ROW_BUFFER_BYTES on a CPU's stack; on a GPU, a work-group's
        local memory less GPU_ROW_BUFFER_RESERVE (codegen/gpudims.py: split_rows)."""
        if (dev := self.rf.device.get(x)) and (ren := Device[dev].renderer).has_local:
            return ren.local_memory_bytes - GPU_ROW_BUFFER_RESERVE
        return ROW_BUFFER_BYTES

    def fits_local_memory(self, x: UOp, fill: Request) -> bool:
        """On a GPU, whether x's row buffer and the others of its kernel (filled at the same row, the same outer
        index: attention's scores and exp rows) fit one work-group's local memory together (`row_buffer_bytes`)."""
        if not ((dev := self.rf.device.get(x)) and Device[dev].renderer.has_local):
            return True
        same_row = [y for y, other in self.rf.row_buffered.items() if other[0][:-1] == fill[0][:-1]]
        return sum(y.tensor_shape[-1] * y.dtype.itemsize for y in [x, *same_row]) <= self.row_buffer_bytes(x)

    def reduces_below(self, x: UOp, fill: Request) -> set[UOp]:
        """The reduces x's value at its fill reads through elementwise and view ops only (not through a materialized
        node, another reduce or a node something else reads too) that vary along the row (attention's scores, a
        contraction over d read through the scale and the mask; not a row statistic such as the max, computed once
        per row): a row buffer's fill computes them once per element of the row."""
        row = fill[0][-1]
        found: set[UOp] = set()
        seen: set[tuple[UOp, Request]] = set()
        stack = [(s, sreq) for s, sreq, _ in self.rf.src_requests(x, fill)]
        while stack:
            u, req = stack.pop()
            if (u, req) in seen or u in self.rf.realize or len(self.cost.consumers.get(u, [])) > 1:
                continue  # (a node read elsewhere too, the scores read by their max: decided at its own reads)
            seen.add((u, req))
            if u.op is Ops.REDUCE_AXIS:
                if any(row in i.ranges for i in req[0]):
                    found.add(u)
            elif u.op in GroupOp.Elementwise or u.op in GroupOp.Movement:
                stack.extend((s, sreq) for s, sreq, _ in self.rf.src_requests(u, req))
        return found

    def reads_row_contiguously(self, x: UOp, fill: Request, below: set[UOp]) -> bool:
        """Whether the contractions x's fill computes (`reduces_below`) read an operand that varies along the row with
        stride 1 in its buffer, or in panels of it (attention's keys: tensor/attention.py, _keys_in_panels): index j or
        j % P, P >= 8, of the row's range j. Their loads then go along the keys as vectors (codegen's score tile)."""
        if not below:
            return False
        row = fill[0][-1]
        seen: set[tuple[UOp, Request]] = set()
        stack = [(s, sreq) for s, sreq, _ in self.rf.src_requests(x, fill)]
        while stack:
            u, req = stack.pop()
            if (u, req) in seen:
                continue
            seen.add((u, req))
            leaf = u.op is Ops.BUFFER or (u in self.rf.realize and u not in below)
            if leaf and u.tensor_shape and all(isinstance(s, int) for s in u.tensor_shape):
                if row in (flat := flat_index(req[0], u.tensor_shape)).ranges and steps_by_one(flat, row):
                    return True
            elif not leaf and (u in below or u.op in GroupOp.Elementwise or u.op in GroupOp.Movement):
                stack.extend((s, sreq) for s, sreq, _ in self.rf.src_requests(u, req))
        return False

    def first_reduce(self, reads: list[Request], reqs: Requests) -> list[Request]:
        """Of reads at reduce ranges over one row, the one whose reduce runs first, so it fills the row buffer the
        others read: a reduce the others' reduces read (the scores' max, read by the exp's sum), or one in fewer
        loops than each other read (the exp's sum, per query row, before the loop over v's columns whose product
        with v reads the exp again). [] where no read is first."""
        reduce_of = {rngs[-1]: x for (x, _), rngs in self.rf.red_ranges.items() if rngs}
        found = [reduce_of.get(req[0][-1]) for req in reads]
        reduces = [red for red in found if red is not None]
        if len(reduces) != len(reads):
            return []
        graphs = [red.toposort(gate=lambda u: u not in self.rf.realize) for red in reduces]
        outer = [reqs[req] - {req[0][-1]} for req in reads]
        return [
            req
            for req, red, loops in zip(reads, reduces, outer)
            if all(
                red in graph or loops < other_loops
                for other, graph, other_loops in zip(reduces, graphs, outer)
                if other is not red
            )
        ]

    def reduces_alone(self, r: UOp) -> bool:
        """Whether reduce range r belongs to a reduce over r alone (its loop is the row's: the fill's loop)."""
        return any(r in rngs and [u for u in rngs if u.op is Ops.RANGE] == [r] for rngs in self.rf.red_ranges.values())

    def cheaper_inlined(self, b: UOp) -> bool:
        """Whether BUFFERIZE b, materialized only because the walk met it at more than MAX_REQUESTS index sets, is
        cheaper evaluated at each read (the cost model over those reads). Only a value computed from input buffers
        alone, with no reduce: substituting it at each read copies a small graph and reads nothing it would have to
        walk again (a stencil of an elementwise prologue: one kernel, not a stored prologue and a stencil)."""
        x = b.arg.node
        if b.arg.keep or x not in self.many_reads:
            return False
        if b not in self.inlined:
            value = kernel_value_nodes(b.src[0])
            self.inlined[b] = (
                len(value) <= MAX_INLINED_VALUE_NODES
                and not any(u.op is Ops.REDUCE or (u.op is Ops.INDEX and u.src[0].op is Ops.BUFFERIZE) for u in value)
                and not self.cost.inline_is_costlier(x, self.rf.reqs[x])
            )
            decided_after_walk(self, b, value, self.inlined[b])
        return self.inlined[b]

    def plain_read(self, x: UOp, req: Request) -> bool:
        """Whether x read at req is a buffer read through view ops whose index and validity do not divide: one load.
        Not a prologue (bn + relu before a conv: recomputed for every window position and output channel) nor a
        reshape that does not fold away or a zero-inserting pad (conv_transpose's input: divmods on every read)."""
        while x.op in GroupOp.Movement:
            x, req, _ = self.rf.src_requests(x, req)[0]
        exprs = [*req[0]] + ([req[1]] if req[1] is not None else [])
        return x.op is Ops.BUFFER and not any(u.op in (Ops.IDIV, Ops.MOD) for e in exprs for u in e.toposort())

    def reads_buffer(self, x: UOp) -> bool:
        return any(u.op is Ops.BUFFER for u in x.toposort(gate=lambda u: u.op is not Ops.BUFFER))

    def long_chains(self) -> set[UOp]:
        """Where a fused chain of elementwise ops reaches MAX_KERNEL_OPS ops or MAX_KERNEL_BUFS input buffers:
        materialized there to cut it (C compilers choke on huge functions; GPUs limit kernel arguments)."""
        cut: set[UOp] = set()
        ops: dict[UOp, int] = {}
        bufs: dict[UOp, frozenset[UOp]] = {}

        def counts(u: UOp) -> tuple[int, frozenset[UOp]]:
            n = (u.op in GroupOp.ALU) + sum(ops[s] for s in u.src if below_views(s) not in cut)
            if n > MAX_KERNEL_OPS:  # the sum counts shared subexpressions once per use (erf's polynomial): recount
                n = self.distinct_alu_ops(u, cut, MAX_KERNEL_OPS + 1)
            if u.op is Ops.BUFFER:
                return n, frozenset([u])
            return n, frozenset().union(*[bufs[s] for s in u.src if below_views(s) not in cut])

        for u in self.rf.nodes:
            n, b = counts(u)
            if u.op in GroupOp.ALU and (n > MAX_KERNEL_OPS or len(b) > MAX_KERNEL_BUFS):
                # a broadcast product (a conv's x * w: cout x the input's size) is cut at its computed operands
                # instead, each stored at its own size (ResNet-50's stride-2 conv stored its 115M-element product)
                if smaller := self.broadcast_operands(u, cut):
                    cut.update(smaller)
                    n, b = counts(u)
                if not smaller or n > MAX_KERNEL_OPS or len(b) > MAX_KERNEL_BUFS:
                    cut.add(u)
                    n, b = 0, frozenset()
            ops[u], bufs[u] = min(n, MAX_KERNEL_OPS + 1), b
        return cut

    @staticmethod
    def broadcast_operands(u: UOp, cut: set[UOp]) -> list[UOp]:
        """The computed nodes below u's sources' view ops that are smaller than u (broadcast into it), not cut yet."""
        if not all(isinstance(d, int) for d in u.tensor_shape):
            return []
        size = prod(u.tensor_shape)
        out = []
        for s in u.src:
            v = below_views(s)
            if v not in cut and v not in out and v.op in GroupOp.ALU | {Ops.REDUCE_AXIS} and v.tensor_shape:
                if all(isinstance(d, int) for d in v.tensor_shape) and prod(v.tensor_shape) < size:
                    out.append(v)
        return out

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


def steps_by_one(flat: UOp, r: UOp) -> bool:
    """flat = (terms without r) + r, or + (r // P) * c + r % P with P >= 8 (panels of P): consecutive r read
    consecutive elements (in runs of P)."""
    terms, _ = split_sum(flat)
    on_r = [(t, c) for t, c in terms if r in t.ranges]
    if [t for t, c in on_r] == [r]:
        return on_r[0][1] == 1
    mods = [t for t, c in on_r if c == 1 and t.op is Ops.MOD and t.src[0] is r and t.src[1].op is Ops.CONST]
    if len(mods) != 1 or mods[0].src[1].arg < 8:
        return False
    panel = mods[0].src[1]
    return all(t is mods[0] or (t.op is Ops.IDIV and t.src[0] is r and t.src[1] is panel) for t, _ in on_r)


def below_views(u: UOp) -> UOp:
    """The node u views: u itself, or the first node below its movement ops."""
    while u.op in GroupOp.Movement:
        u = u.src[0]
    return u


def index_size(i: UOp) -> int:
    """The UOps in an index expression, counted up to MAX_INDEX_NODES + 1."""
    seen: set[UOp] = set()
    stack = [i]
    while stack and len(seen) <= MAX_INDEX_NODES:
        u = stack.pop()
        if u not in seen:
            seen.add(u)
            stack.extend(u.src)
    return len(seen)
