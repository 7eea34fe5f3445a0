"""Optimizer actions: each one changes how a RANGE is emitted, never what the kernel computes.

An action names an axis: an index into `kernel_axes(ast)`, the kernel's RANGEs ordered by axis id (outputs
first, then reduces). UPCAST/UNROLL/THREAD split that range with the algebra of range splitting:

    RANGE(n) -> RANGE(n/amt)*amt + RANGE(amt, UPCAST|UNROLL)     (the inner part becomes vector lanes / copies)
    RANGE(n) -> SPECIAL(core_id, amt)*(n/amt) + RANGE(n/amt)     (THREAD: each core takes a contiguous block)
    RANGE(n) -> RANGE(n/amt)*amt + SPECIAL(core_id, amt)         (THREAD_INTERLEAVED: every amt-th iteration)
    RANGE(n) -> RANGE(n/amt)*amt + RANGE(amt, LOCAL|GROUP)        (GPU: codegen/gpudims.py makes them local ids)
    RANGE(n) -> RANGE'(n/amt)*amt + RANGE(amt)                    (TILE: RANGE' nests outside every other loop)

An UPCAST/UNROLL/THREAD amount that does not divide n splits the largest part it divides and adds a tail for the
rest (codegen/opt/tail.py); LOCAL/GROUP amounts must divide.

A symbolic size n (an expression of DEFINE_VARs, uop/variable.py) is split by the same algebra wherever it holds for
every value of the variables: UPCAST/UNROLL take RANGE(n//amt)*amt + RANGE(amt) and a tail loop over the n%amt left
(tail.py); THREAD, where amt does not divide n, gives each core a chunk of c = ceil(n/amt) iterations, the last
ones cut at n by the loop's own bound (no gate, no load past n):

    RANGE(n) -> SPECIAL(core_id, amt)*c + RANGE(c - max((core_id+1)*c - n, 0))

THREAD_INTERLEAVED takes no tail either: core c runs the iterations c, c+amt, c+2*amt, ... below n, ceil((n-c)/amt)
of them, RANGE(n) -> RANGE((n - core_id + amt-1) // amt)*amt + core_id. It is for a loop whose iterations grow in
work along it (the heuristic's choice: a gated reduce inside ends its loop by this loop's value,
codegen/gated_reduce.py): contiguous blocks would give the last core the longest iterations, every amt-th one gives
each core a share of the short and the long.

TILE, LOCAL and GROUP need amt to divide n for every value (n = 16*v, say), and refuse otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto

from zeptograd.codegen.opt.tail import core_id, gate_single_core, masked_tail, split_tail, thread_tail, vector_tail
from zeptograd.dtype import PtrDType, dtypes
from zeptograd.uop.ops import AxisType, Ops, UOp, trip_count
from zeptograd.uop.upat import PatternMatcher, UPat, graph_rewrite, graph_substitute
from zeptograd.viz.hook import named_pass  # VIZ=1: this pass is a named step of the trace


class OptOps(Enum):
    UPCAST = auto()  # an output axis -> vector lanes / unrolled copies
    MASKED_UPCAST = auto()  # UPCAST whose tail (an amount that does not divide) is one masked vector (masks_tail)
    UNROLL = auto()  # a reduce axis -> vector lanes / unrolled copies (several accumulators)
    THREAD = auto()  # an output axis split across CPU cores, each a contiguous block
    THREAD_INTERLEAVED = auto()  # an output axis split across CPU cores, each every amt-th iteration
    LOCAL = auto()  # an output axis -> GPU local (work-group) ids
    GROUP = auto()  # a reduce axis -> GPU local ids, reduced through shared memory
    SWAP = auto()  # exchange the nesting of two output axes (arg: the other axis)
    TILE = auto()  # cache blocking: an output axis -> an outermost loop over blocks of arg, and a loop in a block

    def __repr__(self):
        return f"OptOps.{self.name}"


@dataclass(frozen=True)
class Opt:
    op: OptOps
    axis: int
    arg: int

    def __repr__(self):
        return f"Opt({self.op.name}, {self.axis}, {self.arg})"


class OptError(ValueError):
    pass


_EXPANDED = (AxisType.UPCAST, AxisType.UNROLL)


def kernel_axes(ast: UOp) -> list[UOp]:
    """The kernel's loops an action can name: RANGEs not yet expanded, by axis id (nesting order)."""
    return sorted(
        (u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] not in _EXPANDED), key=lambda r: r.arg[0]
    )


def _vmax(n: int | UOp) -> int:
    return n if isinstance(n, int) else n.vmax


def _divides(n: int | UOp, amt: int) -> bool:
    """amt divides n for every value of its variables"""
    if isinstance(n, int):
        return n % amt == 0
    rem = (n % amt).simplify()
    return rem.op is Ops.CONST and rem.arg == 0


def _div(n: int | UOp, amt: int) -> int | UOp:
    if isinstance(n, int):
        return n // amt
    q = (n // amt).simplify()
    return q.arg if q.op is Ops.CONST else q


def _chunked(n: UOp, core: UOp, cores: int, axis: int) -> UOp:
    """# RANGE(n) -> core*c + RANGE(c - max((core+1)*c - n, 0)), c = ceil(n/cores): the last chunk ends at n"""
    c = ((n + (cores - 1)) // cores).simplify()
    over = ((core + 1) * c - n).maximum(UOp.const(dtypes.index, 0))
    return core * c + UOp.range((c - over).simplify(), axis, AxisType.LOOP)


def _fix_range_lists(x: UOp) -> UOp | None:
    """# END/REDUCE(x, ..., outer*amt + inner, ...) -> END/REDUCE(x, ..., outer, inner, ...): ranges stay ranges,
    listed outermost first"""
    new: list[UOp] = []
    for s in x.src[1:]:
        for r in [s] if s.op is Ops.RANGE else s.ranges:
            if r not in new:
                new.append(r)
    new.sort(key=lambda r: r.arg[0])
    return None if tuple(new) == x.src[1:] else UOp(x.op, x.dtype, (x.src[0], *new), x.arg)


pm_fix_range_lists = PatternMatcher([(UPat((Ops.END, Ops.REDUCE), name="x"), _fix_range_lists)])


def _nest_of(ast: UOp, r: UOp) -> UOp:
    """the loop nest (a source of the kernel's SINK) that r is a loop of"""
    return next((s for s in ast.src if r in s.toposort()), ast)


def shared_row_buffers(ast: UOp, r: UOp) -> set[UOp]:
    """The row buffers (array DEFINE_REGs, schedule/kernel.py) filled with values that vary along r where their index
    does not: rows that reuse one buffer in turn. As copies or vector lanes (UPCAST) they would write it at once, and
    a SWAP could reorder its fill and its reads; a THREAD's cores each have their own."""
    nodes = list(ast.toposort())
    if not any(u.op is Ops.DEFINE_REG for u in nodes):
        return set()
    varies: dict[UOp, bool] = {}  # whether a value varies along r: a REDUCE over r does not (it closes r)
    for u in nodes:
        varies[u] = u is r or (any(varies[s] for s in u.src) and not (u.op is Ops.REDUCE and r in u.src[1:]))
    return {
        u.src[0].src[0]
        for u in nodes
        if u.op is Ops.STORE and u.src[0].src[0].op is Ops.DEFINE_REG and varies[u.src[1]] and not varies[u.src[0]]
    }


def _row_buffer(ix: UOp) -> UOp | None:
    """The DEFINE_REG an INDEX reads or writes, directly or after its fill (AFTER(buf, fill))."""
    base = ix.src[0].src[0] if ix.src[0].op is Ops.AFTER and ix.src[0].src else ix.src[0]
    return base if base.op is Ops.DEFINE_REG else None


ROW_BUFFER_PAD_BYTES = 64  # rows 2**k bytes apart map to one set of the L1 cache: each lane's row one line further


def row_buffer_lane_stride(n: int, itemsize: int) -> int:
    """Elements between the rows of a row buffer that each lane of an UPCAST has its own of (`_row_buffer_per_lane`):
    n, and a cache line more where n's bytes are a multiple of 256 (attention's 2048 keys: eight rows 8 KiB apart
    would share one set of an 8-way L1 with the values' and the keys' lines)."""
    return n + ROW_BUFFER_PAD_BYTES // itemsize if (n * itemsize) % 256 == 0 else n


def _row_buffer_per_lane(ast: UOp, bufs: set[UOp], inner: UOp) -> UOp:
    """# DEFINE_REG(ptr(n)) -> DEFINE_REG(ptr(s*amt)); INDEX(buf, j) -> INDEX(buf', j + inner*s), s >= n
    Each position of an UPCAST range (inner, amt long) that splits the rows sharing these row buffers gets a row of
    its own: the query rows of an attention tile fill their scores rows at once."""
    amt = trip_count(inner)
    ptrs = {b: b.dtype for b in bufs if isinstance(b.dtype, PtrDType)}
    strides = {b: row_buffer_lane_stride(p.size, p.base.itemsize) for b, p in ptrs.items()}
    grown = {b: UOp(Ops.DEFINE_REG, p.base.ptr(strides[b] * amt), (), b.arg) for b, p in ptrs.items()}
    lane_stride = {grown[b]: s for b, s in strides.items()}
    return graph_rewrite(graph_substitute(ast, grown), pm_row_per_lane, (lane_stride, inner))


def _own_row(ctx: tuple[dict[UOp, int], UOp], ix: UOp) -> UOp | None:
    lane_stride, inner = ctx
    if (b := _row_buffer(ix)) is None or b not in lane_stride or inner in ix.src[1].toposort():
        return None
    return UOp(Ops.INDEX, ix.dtype, (ix.src[0], ix.src[1] + inner * lane_stride[b], *ix.src[2:]))


pm_row_per_lane = PatternMatcher([(UPat(Ops.INDEX, name="ix"), _own_row)])  # INDEX(buf, j) -> INDEX(buf, j + lane*n)


@named_pass("apply_opt {0}", "an optimizer action: a loop split, swapped or made vector lanes, unrolled or threads")
def apply_opt(ast: UOp, opt: Opt) -> UOp:
    axes = kernel_axes(ast)
    if not 0 <= opt.axis < len(axes):
        raise OptError(f"{opt}: the kernel has {len(axes)} axes")
    r = axes[opt.axis]
    n, kind = trip_count(r), r.arg[1]
    if opt.op is not OptOps.SWAP and (opt.arg <= 1 or opt.arg > _vmax(n)):
        raise OptError(f"{opt}: {opt.arg} does not fit the axis size {n}")
    if opt.op is OptOps.MASKED_UPCAST:
        upcast = Opt(OptOps.UPCAST, opt.axis, opt.arg)
        if kind is AxisType.LOOP and isinstance(n, int) and masks_tail(n % opt.arg) and not _has_row_buffer(ast, r):
            return apply_opt(split_tail(ast, r, opt.arg, masked_tail(n), gate_accesses=True), upcast)
        opt = upcast  # it divides, or its tail is copies
    shared = shared_row_buffers(ast, r) if opt.op in (OptOps.UPCAST, OptOps.UNROLL, OptOps.SWAP) else set()
    if shared and not (opt.op is OptOps.UPCAST and _divides(n, opt.arg) and isinstance(n, int)):
        raise OptError(  # (an UPCAST that divides the axis gives each lane a row buffer of its own)
            f"{opt}: axis {opt.axis} runs a row buffer's rows, which take one buffer one after another"
        )
    if opt.op in (OptOps.UPCAST, OptOps.UNROLL):
        if (opt.op is OptOps.UPCAST) != (kind is AxisType.LOOP):
            raise OptError(f"{opt}: UPCAST splits output axes, UNROLL reduce axes; axis {opt.axis} is {kind.name}")
    if opt.op in (OptOps.THREAD, OptOps.THREAD_INTERLEAVED):
        if kind is not AxisType.LOOP:
            raise OptError(f"{opt}: only an output loop can be split across cores")
        core = UOp(Ops.SPECIAL, dtypes.index, (UOp.const(dtypes.index, opt.arg),), "core_id")
        if (old := core_id(ast)) is not None and (old is not core or core in _nest_of(ast, r).toposort()):
            raise OptError(f"{opt}: this loop nest already runs on {old.src[0].arg} cores")
    if opt.op is OptOps.TILE:
        # a block of the axis outermost: what the inner loops read of this axis stays in cache across the others
        if kind is not AxisType.LOOP or not _divides(n, opt.arg):
            raise OptError(f"{opt}: TILE splits an output loop evenly; axis {opt.axis} is {kind.name} of size {n}")
        first = min(u.arg[0] for u in ast.toposort() if u.op is Ops.RANGE)
        new = UOp.range(_div(n, opt.arg), first - 1, AxisType.LOOP) * opt.arg + UOp.range(opt.arg, r.arg[0], kind)
        return graph_rewrite(graph_substitute(ast, {r: new}), pm_fix_range_lists)
    if opt.op is OptOps.THREAD_INTERLEAVED:
        # RANGE(n) -> RANGE(ceil((n - core)/amt))*amt + core: core c takes c, c+amt, ... below n (n/amt if amt divides)
        count = _div(n, opt.arg) if _divides(n, opt.arg) else ((n - core + (opt.arg - 1)) // opt.arg).simplify()
        new = UOp.range(count, r.arg[0], AxisType.LOOP) * opt.arg + core if n != opt.arg else core
        return graph_rewrite(graph_substitute(ast, {r: new}), pm_fix_range_lists)
    if opt.op is not OptOps.SWAP and not _divides(n, opt.arg):
        # the largest part the amount divides, then a tail (codegen/opt/tail.py): vector lanes and cores only
        if opt.op in (OptOps.UPCAST, OptOps.UNROLL):
            kind_t = AxisType.UPCAST if opt.op is OptOps.UPCAST else AxisType.UNROLL
            return apply_opt(split_tail(ast, r, opt.arg, vector_tail(kind_t)), opt)
        if opt.op is OptOps.THREAD and isinstance(n, UOp):  # symbolic: per-core chunks, the last one cut at n
            return graph_rewrite(graph_substitute(ast, {r: _chunked(n, core, opt.arg, r.arg[0])}), pm_fix_range_lists)
        if opt.op is OptOps.THREAD:
            return apply_opt(split_tail(ast, r, opt.arg, thread_tail(core)), opt)
        raise OptError(f"{opt}: {opt.arg} does not divide the axis size {n}")
    next_id = max(u.arg[0] for u in ast.toposort() if u.op is Ops.RANGE) + 1
    if opt.op in (OptOps.UPCAST, OptOps.UNROLL):
        inner = UOp.range(opt.arg, next_id, AxisType.UPCAST if opt.op is OptOps.UPCAST else AxisType.UNROLL)
        new = inner if opt.arg == n else UOp.range(_div(n, opt.arg), r.arg[0], kind) * opt.arg + inner
        if shared:  # each lane's rows get their own row buffers
            ast = graph_rewrite(graph_substitute(ast, {r: new}), pm_fix_range_lists)
            return _row_buffer_per_lane(ast, shared, inner)
    elif opt.op is OptOps.SWAP:
        if not 0 <= opt.arg < len(axes) or opt.arg == opt.axis or axes[opt.arg].arg[1] is not kind:
            raise OptError(f"{opt}: SWAP needs two different axes of the same kind")
        other = axes[opt.arg]
        a, b = UOp.range(r.src[0], other.arg[0], kind), UOp.range(other.src[0], r.arg[0], kind)
        return graph_rewrite(graph_substitute(ast, {r: a, other: b}), pm_fix_range_lists)
    elif opt.op is OptOps.THREAD:
        new = core * _div(n, opt.arg) + (UOp.range(_div(n, opt.arg), r.arg[0], AxisType.LOOP) if n != opt.arg else 0)
    elif opt.op in (OptOps.LOCAL, OptOps.GROUP):
        # RANGE(n) -> RANGE(n/amt)*amt + RANGE(amt, LOCAL|GROUP): neighbouring threads take neighbouring elements
        if not (kind is AxisType.LOOP if opt.op is OptOps.LOCAL else kind is AxisType.REDUCE):
            raise OptError(f"{opt}: LOCAL splits output loops, GROUP reduce loops; axis {opt.axis} is {kind.name}")
        if any(u.op is Ops.DEFINE_REG for u in ast.toposort()):  # (before codegen, only a row buffer is one)
            raise OptError(f"{opt}: a row buffer's kernel takes its threads from its row (codegen/gpudims.py)")
        inner = UOp.range(opt.arg, next_id, AxisType.LOCAL if opt.op is OptOps.LOCAL else AxisType.GROUP)
        new = inner if opt.arg == n else UOp.range(_div(n, opt.arg), r.arg[0], kind) * opt.arg + inner
    else:
        raise OptError(f"{opt.op} is not supported on this target")
    return graph_rewrite(graph_substitute(ast, {r: new}), pm_fix_range_lists)


def _has_row_buffer(ast: UOp, r: UOp) -> bool:
    """whether r's loop nest reads or writes a row buffer (a DEFINE_REG array: a masked lane would index past it)"""
    return any(u.op is Ops.DEFINE_REG for u in _nest_of(ast, r).toposort())


def masks_tail(t: int) -> bool:
    """Whether an UPCAST's tail of t positions runs as one masked vector (codegen/opt/tail.py: masked_tail) rather
    than t copies: where t is no power of two (those are a narrower vector of their own), and more than 2."""
    return t > 2 and t & (t - 1) != 0


class OptPlan:
    """A kernel and the actions taken on it so far (what the heuristics build up)."""

    def __init__(self, ast: UOp):
        self.ast = ast
        self.opts: list[Opt] = []

    def take(self, opt: Opt) -> bool:
        """Apply the action if it is valid for the kernel as it is now; report whether it was."""
        try:
            self.ast = apply_opt(self.ast, opt)
        except OptError:
            return False
        self.opts.append(opt)
        return True


def apply_opts(ast: UOp, opts: list[Opt]) -> UOp:
    for opt in opts:
        ast = apply_opt(ast, opt)
    return gate_single_core(ast)  # a loop nest no THREAD split (a tail) stores from core 0 only
