"""The hand-coded optimizer: which actions to take for a kernel on a CPU with SIMD and several cores.

- the vector axis: the loop most loads and stores walk with stride 1 -> UPCAST (an output axis) or UNROLL
  (a reduce axis) by the SIMD width (16 floats with AVX-512);
- a reduce over a vector axis: 4 copies of the vector -> 4 independent accumulators, so the adds of one
  iteration do not wait on each other (an FMA has ~4 cycles of latency);
- a matmul-like kernel (a reduce whose loads each miss an output axis): a register tile, rows as copies and
  two vectors of columns, summed into one accumulator per tile element with fused multiply-adds;
- a transposed copy (lanes reading rows a page apart): TILE blocks of a few rows, each row's line read for 16 steps
  (with 16 lanes the vector is the block: its loop outermost);
- the outermost output loop with enough work -> THREAD across the cores, in each loop nest (a tail is one);
- an amount that does not divide its axis: the largest part it divides, and a tail for the rest.

A symbolic loop (a size from a Variable) counts as its largest size (the kernel serves every value, so it is
shaped for the most work): it is split like any other, with a tail loop for n % amount and, for THREAD, per-core
chunks; divisors are not preferred where the size is not known.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet

from zeptograd.codegen.expander import live_ranges, row_buffer_of
from zeptograd.codegen.opt import Opt, OptOps, OptPlan, kernel_axes, masks_tail
from zeptograd.codegen.opt.tail import gate_single_core
from zeptograd.dtype import PtrDType
from zeptograd.helpers import THREADS, prod
from zeptograd.renderer import MIN_THREAD_WORK
from zeptograd.uop.ops import AxisType, Ops, UOp, max_trip_count
from zeptograd.uop.symbolic import simplify, split_sum

L2_BLOCK_BYTES = 1 << 19  # a block of an operand read again by every row tile: half of a 1 MiB L2 per core
TALL_TILE_MIN_ROWS = 64  # 3-row tiles leave a tail row where 3 does not divide: noise only among many rows


def accesses(ast: UOp) -> list[UOp]:
    """The INDEX nodes of loads and stores into buffers."""
    return [u for u in ast.toposort() if u.op is Ops.INDEX and u.src[0].op is Ops.DEFINE_GLOBAL]


def stride(idx: UOp, r: UOp) -> int | None:
    """The coefficient of r in idx when idx is linear in r, 0 if idx does not use r, None otherwise."""
    terms, _ = split_sum(idx)
    coef = [c for t, c in terms if t is r]
    if any(r in t.toposort() for t, _ in terms if t is not r):
        return None
    return coef[0] if coef else 0


def symbolic_size(r: UOp) -> bool:
    return r.src[0].op is not Ops.CONST


def symbolic_work(ast: UOp) -> str | None:
    """The kernel's loop iterations as a Python expression of its Variables; None without a symbolic loop. A kernel
    threaded for its largest size runs on one core where a call's values make it small (runtime: run_on_cores)."""
    sizes = [r.src[0] for r in kernel_axes(ast)]
    if all(s.op is Ops.CONST for s in sizes):
        return None
    from zeptograd.uop.variable import render_sint

    work = sizes[0]
    for s in sizes[1:]:
        work = work * s
    return render_sint(work.simplify(), names_only=True)


def largest_divisor(n: int, options: tuple[int, ...]) -> int:
    return next((o for o in options if n % o == 0), 1)


def amount_with_tail(n: int, options: tuple[int, ...], divisors_first: bool = False) -> int:
    """The largest option that fits n (options largest first); where it does not divide n, the rest of the axis
    runs as a tail (codegen/opt/tail.py). divisors_first: an option that divides n, if any, before that."""
    if divisors_first and (d := largest_divisor(n, options)) > 1:
        return d
    return next((o for o in options if o <= n), 1)


def amounts_largest_first(n: int) -> tuple[int, ...]:
    """n, n-1, ..., 2: the amounts to try, largest first."""
    return tuple(range(n, 1, -1))


def index_of(ast: UOp, r: UOp) -> int | None:
    """Where the loop with r's axis id is in the kernel's axes now (None: an action expanded all of it)."""
    return next((i for i, a in enumerate(kernel_axes(ast)) if a.arg[0] == r.arg[0]), None)


def has_hoisted_reduce(ast: UOp) -> bool:
    """Whether a reduce's value misses an output loop of its loop nest: it is kept before that loop (a row's mean
    before a matmul over the normalized rows: schedule/policy.py, hoisted_reduce_requests), and a loop moved outside
    the others (SWAP, a TILE's block loop) would compute it again once per iteration of the moved loop."""
    for nest in ast.src:
        loops = (
            {r for r in nest.src[1:] if r.op is Ops.RANGE and r.arg[1] is AxisType.LOOP}
            if nest.op is Ops.END
            else set()
        )
        for red in nest.toposort():
            if red.op is Ops.REDUCE and not loops <= set(red.src[0].ranges):
                return True
    return False


def vector_registers(simd_bytes: int) -> int:
    """x86-64's vector registers: 32 with AVX-512 (64-byte vectors), 16 with AVX2 or SSE."""
    return 32 if simd_bytes >= 64 else 16


def accumulator_budget(simd_bytes: int) -> int:
    """A register tile's accumulators: 16 of AVX-512's 32 registers; 12 of AVX2's 16, leaving room for the operands'
    vectors and broadcast values."""
    return 16 if vector_registers(simd_bytes) == 32 else 12


def tile_shape(simd_bytes: int, n_vectors: int, n_rows: int) -> tuple[int, tuple[int, ...], bool]:
    """A register tile over n_rows rows and an output axis of n_vectors vectors: (vectors of columns, row options
    largest first, whether a row count that divides the axis comes first). Its accumulators leave registers for a
    row of B's vectors and A's broadcast value: up to 8 rows x 2 vectors (16 accumulators) with AVX-512's 32
    registers, up to 12 accumulators with AVX2's 16 (8 x 2 spilled). There, 3 rows x 4 vectors where there are rows
    enough for the tail row to be noise (matmul 1024 on 2 cores of an AVX2 host, B in column panels: 8 x 2 50, 3 x
    4 119 GFLOPS; a conv over 32x32 images 67 -> 44 ms), else 2 vectors of up to 6 rows or 1 of up to 8. With 32
    registers and many rows, the most rows whether or not they divide: the rows left are a tile of their own (the
    tile's vectors x the rows left, copies: codegen/opt/tail.py), not a reason for a smaller tile everywhere
    (matmul 100x512x100 on 1 AVX-512 core: 4 x 2 65, 8 x 2 and a 4-row tail 49 us)."""
    cols = 2 if n_vectors % 2 == 0 else 1
    if vector_registers(simd_bytes) == 16 and n_vectors % 4 == 0 and n_rows >= TALL_TILE_MIN_ROWS:
        return 4, (3,), False
    divisors_first = vector_registers(simd_bytes) == 16 or n_rows < TALL_TILE_MIN_ROWS
    return cols, tuple(r for r in (8, 6, 4, 2) if r * cols <= accumulator_budget(simd_bytes)), divisors_first


COLUMN_TAIL_MIN_VECTORS = 16  # a tile's column tail (under one tile of vectors) is at most 1/8 of the axis


def column_tail_tile(simd_bytes: int, n_vectors: int, n_rows: int) -> tuple[int, tuple[int, ...], bool] | None:
    """A register tile for an odd number of vectors of columns (matmul 1000: 125 vectors of 8), where tile_shape's
    columns must divide the vectors and leave one: 8 rows x 1 vector, 9 loads per 8 FMAs. Instead, columns that
    leave a tail, taken after the rows so the tail's loop nest shares them (codegen/opt/tail.py: a tail shares the
    expanded ranges it was split under): with AVX2's 16 registers 4 rows x 3 vectors and a 4 x 1-2 tail tile, with
    AVX-512's 32, 8 x 2 and an 8 x 1 tail, 8 rows whether or not they divide the rows, as tile_shape's (matmul 500
    on 1 AVX-512 core: 4 x 2, 4 dividing 500, 1.6 ms; 8 x 2 and a 4-row tail 1.1 ms, numpy 1.05). (matmul 1000 on
    1 core of an AVX2 host: 8 x 1 57 ms, 4 x 3 26-29, 5 x 2 27, 6 x 2 28-33, 3 x 4 45; numpy 30.) None where the
    vectors are even or too few for a tail to be noise (a conv's 56-wide rows: 7 vectors): tile_shape's choice."""
    if n_vectors % 2 == 0 or n_vectors < COLUMN_TAIL_MIN_VECTORS or n_rows < TALL_TILE_MIN_ROWS:
        return None
    if vector_registers(simd_bytes) == 16:
        return 3, (4, 3, 2), True
    return 2, (8, 6, 4, 2), False


def dot_tile_shape(simd_bytes: int, n_cols: int) -> tuple[int, tuple[int, ...]]:
    """A tile of dot products over an axis of n_cols columns: (columns, row options largest first). 2 columns x up
    to 8 rows with AVX-512's 32 registers. A column axis of 3 (a conv weight gradient's kx) is taken whole rather
    than 2 and a tail, with at most 12 accumulators of AVX2's 16 registers and 16 of AVX-512's 32 (on 2 cores of an
    AVX2 host, conv (8,64,56,56)x(64,64,3,3)'s weight gradient: 2 x 8 54-156 ms, 3 x 4 34-72 ms; on 1 core of an
    AVX-512 host: 2 x 8 25 ms, 3 x 4 11; x @ w.T 64x1024x1024 on AVX2: 2 x 8 6.6 ms, 2 x 4 3.9)."""
    if vector_registers(simd_bytes) == 32 and n_cols != 3:
        return amount_with_tail(n_cols, (2,), divisors_first=True), (8, 6, 4, 2)
    cols = n_cols if n_cols <= 3 else amount_with_tail(n_cols, (2,), divisors_first=True)
    return cols, tuple(r for r in (8, 6, 4, 2) if r * cols <= accumulator_budget(simd_bytes))


def column_panel_loop(axes: list[UOp], row_i: int, main_ids: AbstractSet[int], broadcast: list[UOp]) -> int | None:
    """Where a tile took the whole vector axis, the output loop after the rows that steps through B's column
    panels: B stored as (N/32, K, 32) (tensor/matmul_layout.py: _stored_in_column_panels), a loop the rows' operand (A,
    broadcast along the columns) does not use."""
    return next(
        (
            i
            for i, r in enumerate(axes)
            if i > row_i
            and r.arg[1] is AxisType.LOOP
            and r.arg[0] in main_ids
            and broadcast
            and all(stride(u.src[1], r) == 0 for u in broadcast)
        ),
        None,
    )


def dot_tile(axes: list[UOp], vec_loads: list[UOp]) -> tuple[UOp, UOp] | None:
    """(row, column): two output loops of at least 2, each skipped by one of the loads vectorized along the reduce
    (x[m, k] skips n, w[n, k] skips m: a matmul with a transposed right operand), the column the innermost."""
    loops = [r for r in axes if r.arg[1] is AxisType.LOOP and max_trip_count(r) >= 2]
    skipped = [[r for r in loops if stride(u.src[1], r) == 0] for u in vec_loads]
    for col in reversed(loops):
        for row in reversed(loops):
            if (
                row is not col
                and any(col in s and row not in s for s in skipped)
                and any(row in s and col not in s for s in skipped)
            ):
                return row, col
    return None


def second_dot_column(axes: list[UOp], row: UOp, col: UOp, vec_loads: list[UOp]) -> UOp | None:
    """A second column axis for a tile of dot products (`dot_tile`'s row, col): an output loop of an even trip
    count that the rows' operand skips and the columns' operand uses, as col (a conv weight gradient's input
    channels, beside its window column kx: the output's gradient skips both)."""
    row_ops = [u for u in vec_loads if stride(u.src[1], col) == 0 and stride(u.src[1], row) != 0]
    col_ops = [u for u in vec_loads if stride(u.src[1], row) == 0 and stride(u.src[1], col) != 0]
    if not row_ops or not col_ops:
        return None
    return next(
        (
            r
            for r in reversed(axes)
            if r.arg[1] is AxisType.LOOP
            and r is not row
            and r is not col
            and not symbolic_size(r)
            and max_trip_count(r) % 2 == 0
            and all(stride(u.src[1], r) == 0 for u in row_ops)
            and all(stride(u.src[1], r) not in (0, None) for u in col_ops)
        ),
        None,
    )


WINDOW_TILE_ROWS = 2  # broadcast rows (output channels) of a window tile
WINDOW_TILE_COLUMNS = (4, 2)  # its vector columns along the output's rows, largest first
MAX_WINDOW_UNROLL = 3  # the longest window loop unrolled whole (a 3x3 kernel's rows)


def window_columns(
    axes: list[UOp], vec_r: UOp, tile_row: UOp, vec_loads: list[UOp], broadcast: list[UOp]
) -> tuple[UOp, UOp] | None:
    """(column, window) for a register tile whose vector axis gives it one column (a conv vectorized along its
    output columns, ow = 56: 7 vectors of 8 lanes): an output loop the vector loads use and the broadcast loads do
    not (the output row oh: the weight is the same for every row), and a reduce loop of at most MAX_WINDOW_UNROLL
    iterations that moves the vector loads' index by the same stride (the window row kh: input row oh + kh)."""
    for col in axes:
        if (
            col.arg[1] is not AxisType.LOOP
            or col is vec_r
            or col is tile_row
            or symbolic_size(col)
            or largest_divisor(max_trip_count(col), WINDOW_TILE_COLUMNS) == 1
            or not broadcast
            or any(stride(u.src[1], col) != 0 for u in broadcast)
        ):
            continue
        steps = {stride(u.src[1], col) for u in vec_loads}
        if len(steps) != 1 or (step := steps.pop()) in (0, None):
            continue
        for k in axes:
            if (
                k.arg[1] is AxisType.REDUCE
                and not symbolic_size(k)
                and 1 < max_trip_count(k) <= MAX_WINDOW_UNROLL
                and all(stride(u.src[1], k) == step for u in vec_loads)
            ):
                return col, k
    return None


SLIDING_WINDOW_TILE = (4, (4, 2))  # a sliding-window tile with AVX-512: vectors of columns, row options
SLIDING_WINDOW_ROWS = 4  # its rows in all: where the output columns give 2, 2 output rows each


def window_slides(broadcast: list[UOp], row: UOp, reduce_axes: list[UOp]) -> bool:
    """Whether neighbouring values of the output loop row read overlapping windows of the broadcast operand: each
    load steps along row by at least a window loop's step and less than its extent (input column ow*s + kw, 1 <= s <
    3 for a 3-wide window; row oh*s + kh). Not a matmul's rows, which step by its whole reduce, nor a channels-last
    1x1 weight's output channels, which step by less than its input channels (the reduce)."""

    def slides(k: UOp) -> bool:
        if symbolic_size(k) or max_trip_count(k) < 2:
            return False
        steps = [(stride(u.src[1], row), stride(u.src[1], k)) for u in broadcast]
        return all(r is not None and w is not None and 0 < w <= r < w * max_trip_count(k) for r, w in steps)

    return bool(broadcast) and any(slides(k) for k in reduce_axes)


def sliding_window_tile(
    simd_bytes: int, n_vectors: int, row: UOp, reduce_axes: list[UOp], broadcast: list[UOp]
) -> tuple[int, tuple[int, ...], bool] | None:
    """A register tile for a conv vectorized along its output channels (a channels-last weight): rows along the
    output columns, whose windows overlap (`window_slides`). With AVX-512's 32 registers, 4 vectors x 4 rows (16
    accumulators, 4 weight vectors, 4 broadcast values). Measured on an AVX-512 host, CPU time per call, 1 core /
    both of 2 cores: (8,64,56,56)x(64,64,3,3) pad 1: 2 x 8 (tile_shape's) 10.4 / 12.3 ms, 2 x 7 9.1-9.6 / 12.3,
    4 x 4 9.0 / 9.5; stride 2 with 128 output channels: 2 x 4 (tile_shape's: 8 and 6 do not divide 28) 6.4 / 6.9,
    2 x 7 5.5 / 10, 4 x 4 5.9 / 5.9, 2 x 14 (28 accumulators, spilled) 10-15 / -. AVX2's 16 registers keep
    tile_shape's."""
    cols, rows = SLIDING_WINDOW_TILE
    if vector_registers(simd_bytes) != 32 or n_vectors % cols or not window_slides(broadcast, row, reduce_axes):
        return None
    return cols, rows, True


def second_window_row(
    axes: list[UOp],
    rows: int,
    taken: tuple[UOp, ...],
    vec_loads: list[UOp],
    broadcast: list[UOp],
    reduce_axes: list[UOp],
) -> tuple[UOp, int] | None:
    """Where a sliding-window tile's output columns give it fewer than SLIDING_WINDOW_ROWS rows (14 columns: 2), the
    output rows for the rest: another output loop whose windows overlap and that the vector loads do not use, 2 rows
    of 2 columns each. (8,256,14,14)x(256,256,3,3) pad 1, one core / both of 2: 4 vectors x 2 columns 27 / - ms, x 4
    columns and a tail 18 / 21, 2 vectors x 7 columns 11-13 / 16-19, 4 vectors x 2 columns x 2 rows 14-15 / 13-14."""
    more = SLIDING_WINDOW_ROWS // rows
    if more < 2:
        return None
    return next(
        (
            (r, more)
            for r in reversed(axes)
            if r.arg[1] is AxisType.LOOP
            and r not in taken
            and not symbolic_size(r)
            and max_trip_count(r) % more == 0
            and all(stride(u.src[1], r) == 0 for u in vec_loads)
            and window_slides(broadcast, r, reduce_axes)
        ),
        None,
    )


def full_vector_output_axis(
    axes: list[UOp], vec_i: int, simd_bytes: int, width: int, reduce_loads: list[UOp], weight: dict[UOp, int]
) -> int | None:
    """Another output loop for the vector where axes[vec_i] is an output loop that AVX-512's full vectors do not
    divide (a conv's ow = 56: 3 x 16 lanes and 8 left, so its register tile takes 8 lanes, half of each register): one
    that full vectors divide and that the reduce's loads read contiguously as often (a channels-last weight's output
    channels: tensor/conv_layout.py stores it so for such convs). (8,64,56,56)x(64,64,3,3) pad 1 on one core of an
    AVX-512 host: 8-lane columns 19 ms, 16 output channels per vector 9 ms. Measured on AVX-512 only: AVX2's 8 lanes
    divide 56, and its kernels keep their vector."""
    vec_r = axes[vec_i]
    if (
        vector_registers(simd_bytes) != 32
        or vec_r.arg[1] is not AxisType.LOOP
        or symbolic_size(vec_r)
        or max_trip_count(vec_r) % width == 0
    ):
        return None

    def contiguous_reads(r: UOp) -> int:
        return sum(weight[u] for u in reduce_loads if stride(u.src[1], r) == 1)

    own = contiguous_reads(vec_r)
    return next(
        (
            i
            for i, r in enumerate(axes)
            if r is not vec_r
            and r.arg[1] is AxisType.LOOP
            and not symbolic_size(r)
            and max_trip_count(r) % width == 0
            and contiguous_reads(r) >= own > 0
        ),
        None,
    )


def take_window_tile(plan: OptPlan, rows: UOp, col: UOp, window: UOp) -> None:
    """A tile of WINDOW_TILE_ROWS broadcast rows x vector columns taken along a second output loop (4 output rows,
    each its own vector load, every one feeding both output channels), with the window loop that moves the loads
    along that loop unrolled whole, so neighbouring output rows share their input rows' loads: 4 rows x 3 window
    rows read 6 input rows, not 12. On one core of an AVX2 host, (8,64,56,56)x(64,64,3,3) pad 1, the interior
    peeled (codegen/peel.py): 8 channels x 1 vector 44 ms, 4 x 2 rows 38, 2 x 4 rows 32, 4 x 4 (16 accumulators,
    spilled) 49; 2 x 4 without the window unrolled 44."""
    if (ci := index_of(plan.ast, col)) is not None:
        n = max_trip_count(kernel_axes(plan.ast)[ci])
        plan.take(Opt(OptOps.UPCAST, ci, largest_divisor(n, WINDOW_TILE_COLUMNS)))
    if (ri := index_of(plan.ast, rows)) is not None:
        n = max_trip_count(kernel_axes(plan.ast)[ri])
        plan.take(Opt(OptOps.UPCAST, ri, amount_with_tail(n, (WINDOW_TILE_ROWS,), divisors_first=True)))
    if (ki := index_of(plan.ast, window)) is not None:
        plan.take(Opt(OptOps.UNROLL, ki, max_trip_count(window)))


def hand_coded_optimizations(
    ast: UOp, simd_bytes: int = 64, threads: int | None = None, masked_vectors: bool = True
) -> tuple[UOp, list[Opt]]:
    """masked_vectors: the renderer has masked vector loads/stores (Renderer.masked_vectors): a register tile's columns
    left of the last vector, where they are no power of two, are one masked vector (OptOps.MASKED_UPCAST)."""
    threads = THREADS.value if threads is None else threads
    plan = OptPlan(ast)
    take = plan.take

    axes = kernel_axes(plan.ast)
    if not axes or any(max_trip_count(r) == 0 for r in axes):
        return plan.ast, plan.opts
    idxs = accesses(plan.ast)
    itemsize = max((d.base.itemsize for u in idxs if isinstance(d := u.src[0].dtype, PtrDType)), default=4)
    width = max(1, simd_bytes // itemsize)
    total_work = prod(max_trip_count(r) for r in axes)
    reduce_work = prod(max_trip_count(r) for r in axes if r.arg[1] is AxisType.REDUCE)
    blocks: set[int] = set()  # axis ids of TILE's block loops: the cores share a block rather than split them

    # the vector axis: stride 1 in the accesses executed most often (a load inside a reduce runs once per iteration
    # of every loop, whichever ranges its index uses; the store once per output element)
    in_reduce = {u for red in plan.ast.toposort() if red.op is Ops.REDUCE for u in red.src[0].toposort()}
    # ... unless its index uses no reduce range: then it is hoisted out of the reduce loops (softmax's max[row])
    runs_in_reduce = {u for u in idxs if u in in_reduce and any(r.arg[1] is AxisType.REDUCE for r in u.src[1].ranges)}

    def runs(u: UOp) -> int:  # an access outside a reduce runs in the loops its index uses and those around them:
        # the linearizer hoists it out of inner loops it does not use (batchnorm's gamma[c] over (n, c, h, w))
        used = u.src[1].ranges
        inner = max((r.arg[0] for r in used), default=-1)
        loops = [r for r in axes if r.arg[1] is not AxisType.REDUCE and (r in used or r.arg[0] < inner)]
        return prod(max_trip_count(r) for r in loops)

    # ... and one inside a reduce runs once per iteration of the reduce's loops and of the output loops its body
    # varies along (with those around them): a reduce that misses an inner output loop is computed before that loop
    # opens (schedule/policy.py: hoisted_reduce_requests), so its loads are not weighed as if run at every output
    # (the pooled gradient of a Linear, sum_k g[b, k] * w[k, c] read at every (b, c, h, w): the w loads took the
    # vector axis, c, and every output was stored with a 1024-float stride)
    reduce_runs: dict[UOp, int] = {}
    for red in (u for u in plan.ast.toposort() if u.op is Ops.REDUCE):
        body = list(red.src[0].toposort())
        own = set(red.src[1:])
        used = [r for r in body if r.op is Ops.RANGE and r not in own]
        if any(u.op is Ops.REDUCE for u in body) or any(r.arg[1] is not AxisType.LOOP for r in used):
            n = total_work  # nested reduces: counted as run at every iteration of every loop
        else:
            inner = max((r.arg[0] for r in used), default=-1)
            loops = [r for r in axes if r in own or (r.arg[1] is AxisType.LOOP and (r in used or r.arg[0] < inner))]
            n = prod(max_trip_count(r) for r in loops)
        for u in body:
            reduce_runs[u] = max(reduce_runs.get(u, 0), n)
    weight = {u: reduce_runs.get(u, total_work) if u in runs_in_reduce else runs(u) for u in idxs}

    if (scores := score_tile(plan.ast, width)) is not None:  # attention in one kernel: a register tile of scores
        take_score_tile(plan, *scores, width)
        if threads > 1 and total_work >= MIN_THREAD_WORK:
            thread_nests(plan, threads, blocks)
        return gate_single_core(plan.ast), plan.opts

    def contiguous_count(r: UOp) -> int:
        return sum(weight[u] for u in idxs if stride(u.src[1], r) == 1)

    def vec_amount(r: UOp) -> int:  # a full vector and a tail where the width does not divide a long enough axis
        options = tuple(w for w in (16, 8, 4, 2) if w <= width) or (1,)
        if max_trip_count(r) >= options[0] or symbolic_size(r):
            return amount_with_tail(max_trip_count(r), options)
        return largest_divisor(max_trip_count(r), options)

    def lanes_worth(r: UOp) -> float:  # 2 lanes of a 3-long axis (a conv's kw) don't pay when another axis has 4+
        n = vec_amount(r)
        if not (n >= 4 or all(vec_amount(a) < 4 for a in axes if contiguous_count(a))):
            return 0
        if not symbolic_size(r) and n < max_trip_count(r) < 2 * n:
            # one vector and a tail (10 classes: 8 lanes, then 2): two passes for the axis, max_trip_count/2 lanes
            # each (mlp_step's h.T @ g, (512, 256) x (256, 10), 1 core of an AVX2 host: vectorized along the 10,
            # 427 us; along the 512, 81 us, with the expander keeping those 8 lanes: codegen/expander.py)
            return max_trip_count(r) / 2
        return n

    vec_i = max(
        range(len(axes)),
        key=lambda i: (contiguous_count(axes[i]) * lanes_worth(axes[i]), axes[i].arg[1] is AxisType.LOOP, i),
    )
    in_reduce_loads = [u for u in idxs if u in runs_in_reduce]
    if (full := full_vector_output_axis(axes, vec_i, simd_bytes, width, in_reduce_loads, weight)) is not None:
        vec_i = full
    vec_r = axes[vec_i]
    is_reduce = vec_r.arg[1] is AxisType.REDUCE
    vec_amt = vec_amount(vec_r)
    vec_loads = [u for u in idxs if u in in_reduce and stride(u.src[1], vec_r) != 0]  # contiguous or gathers
    tile_rows = [
        r
        for r in axes
        if r.arg[1] is AxisType.LOOP
        and r is not vec_r
        and vec_loads
        and all(stride(u.src[1], r) == 0 for u in vec_loads)
    ]  # a register tile will follow (see below)
    if (
        not is_reduce
        and tile_rows
        and vec_amt > 1
        and max_trip_count(vec_r) % (2 * vec_amt) * 8 > max_trip_count(vec_r)
        and (whole := largest_divisor(max_trip_count(vec_r), tuple(w for w in (16, 8, 4) if w <= width))) >= 4
    ):
        # a register tile's columns (two vectors) leave over 1/8 of the axis to a tail, whose loop nest gets no
        # tile: a narrower vector that divides the axis (conv's ow=56: 7 x 8 lanes; 16 lanes tile only 32 of
        # the 56) is faster (conv 43 -> 15 ms); matmul 1000 (992 tiled with 16 lanes) keeps its 16
        n_cols = max_trip_count(vec_r)
        # (at most 8 lanes: 8 rows x 16 lanes is 16 registers where LLVM splits 16 lanes in two on an AVX2 host, and
        # spilled: conv (8,64,56,56)x(64,64,3,3) 1.12x slower than 8 rows x 8 lanes)
        lanes = next((w for w in (8, 4) if whole < w <= vec_amt and (t := n_cols % w) >= 4 and t & (t - 1) == 0), None)
        if lanes is not None and contiguous_count(vec_r) and not symbolic_size(vec_r):
            # ... unless a wider vector leaves a tail that is a vector itself: the tile's rows first (a tail shares
            # the expanded ranges it was split under), then one column of vectors and a tail nest, which the
            # expander vectorizes on its own (conv stride 2's ow=28: 3 x 8 + 4 lanes, each x 8 output channels,
            # instead of 7 x 4 lanes)
            row = tile_rows[0]
            rows = amount_with_tail(max_trip_count(row), (8, 6, 4, 2), divisors_first=True)
            take(Opt(OptOps.UPCAST, axes.index(row), rows))
            if (vi := index_of(plan.ast, vec_r)) is not None and take(Opt(OptOps.UPCAST, vi, lanes)):
                row_i, vi = index_of(plan.ast, row), index_of(plan.ast, vec_r)
                if row_i is not None and vi is not None and row_i < vi and not has_hoisted_reduce(plan.ast):
                    take(Opt(OptOps.SWAP, row_i, vi))  # columns outside rows, as below
            vec_amt = 1  # taken
        else:
            vec_amt = whole
    if contiguous_count(vec_r) and vec_amt > 1:
        # a tile's columns left of the last vector: one masked vector (tile_tail_nests gives it the tile's rows)
        masked = masked_vectors and tile_rows and not is_reduce and masks_tail(max_trip_count(vec_r) % vec_amt)
        take(Opt(OptOps.UNROLL if is_reduce else OptOps.MASKED_UPCAST if masked else OptOps.UPCAST, vec_i, vec_amt))
        axes = kernel_axes(plan.ast)
        tile = dot_tile(kernel_axes(plan.ast), [u for u in idxs if stride(u.src[1], vec_r) == 1]) if is_reduce else None
        if tile is not None:
            # A @ B.T (both operands contiguous along the reduce): a tile of rows x columns of dot products, each a
            # vector accumulator; one vector load of a row feeds every column and one of a column every row
            row, col = tile
            cols, row_amounts = dot_tile_shape(simd_bytes, max_trip_count(col))
            rows = amount_with_tail(max_trip_count(row), row_amounts, divisors_first=True)
            col2 = (
                second_dot_column(axes, row, col, [u for u in idxs if stride(u.src[1], vec_r) == 1])
                if rows * cols + min(rows, cols) + 1 >= vector_registers(simd_bytes)
                else None
            )
            if (col_i := index_of(plan.ast, col)) is not None and cols > 1:
                take(Opt(OptOps.UPCAST, col_i, cols))
            if col2 is not None:
                # 12 accumulators of 3 columns x 4 rows leave no register free for the operands' 3 + 1 vectors (the
                # weight gradient's tile spilled one accumulator each step): 2 rows x (3 x 2) columns need 2 + 1
                rows = amount_with_tail(max_trip_count(row), tuple(r for r in row_amounts if r <= rows // 2), True)
            if (row_i := index_of(plan.ast, row)) is not None:
                take(Opt(OptOps.UPCAST, row_i, rows))
            if col2 is not None and (col2_i := index_of(plan.ast, col2)) is not None:
                take(Opt(OptOps.UPCAST, col2_i, 2))  # the second column inside the rows (1.08x faster than outside)
            # the columns' operand (a weight) read by every row tile: in blocks that stay in the L2 cache
            if (col_i := index_of(plan.ast, col)) is not None:
                col_now = kernel_axes(plan.ast)[col_i]
                per_col = (
                    max_trip_count(col) // max(max_trip_count(col_now), 1) * reduce_work
                )  # elements of the operand per column step
                fit = max(1, L2_BLOCK_BYTES // max(per_col * itemsize, 1))
                if (
                    max_trip_count(col_now) > fit
                    and not has_hoisted_reduce(plan.ast)
                    and take(
                        Opt(OptOps.TILE, col_i, largest_divisor(max_trip_count(col_now), amounts_largest_first(fit)))
                    )
                ):
                    blocks.add(kernel_axes(plan.ast)[0].arg[0])
        elif is_reduce:
            n_accs = 1
            if vec_i < len(axes) and axes[vec_i].arg[0] == vec_r.arg[0]:
                # several independent accumulators hide the add latency: 4 of 64 bytes (AVX-512), 8 of narrower
                # vectors (AVX2's 8 lanes, sum of 2**24 floats: 4 accumulators took 1.15x the time of 16 lanes, 8 are
                # on par)
                accs = (4, 2) if vec_amt * itemsize >= 64 else (8, 4, 2)
                n_accs = amount_with_tail(max_trip_count(axes[vec_i]), accs, divisors_first=True)
                take(Opt(OptOps.UNROLL, vec_i, n_accs))
            take_continuing_rows(plan, vec_r, [u for u in idxs if u in runs_in_reduce], n_accs)

    # a register tile when loads each skip an output axis (matmul, conv)
    has_reduce = any(r.arg[1] is AxisType.REDUCE for r in kernel_axes(plan.ast))
    main_ids = {r.arg[0] for r in axes}  # not the copies of loops a tail made
    loop_axes = [r for r in kernel_axes(plan.ast) if r.arg[1] is AxisType.LOOP and r.arg[0] in main_ids]
    if has_reduce and not is_reduce and len(loop_axes) >= 2 and len(plan.opts) == 1:
        # rows: an axis no vector-loaded (or gathered: a strided conv's input) operand depends on, so one vector
        # load feeds every row
        vec_loads = [u for u in idxs if stride(u.src[1], vec_r) != 0 and u in in_reduce]
        row_options = [
            r
            for r in loop_axes
            if r.arg[0] != vec_r.arg[0] and vec_loads and all(stride(u.src[1], r) == 0 for u in vec_loads)
        ]
        # the innermost of them with room for a tile: the rows' broadcast operand is read at nearby addresses (a
        # conv vectorized along its output channels: 4 output columns of one input row, not 8 images 200 KB apart);
        # a loop the vector's split made is none (the accesses above index the loops before it)
        unsplit = set(kernel_axes(ast))
        tile_row = next(
            (r for r in reversed(row_options) if r in unsplit and max_trip_count(r) >= 4 and not symbolic_size(r)),
            row_options[0] if row_options else None,
        )
        if tile_row is not None:
            axes = kernel_axes(plan.ast)
            vi = next((i for i, r in enumerate(axes) if r.arg[0] == vec_r.arg[0]), None)
            n_vectors = max_trip_count(axes[vi]) if vi is not None else 1
            cols, row_amounts, divisors_first = tile_shape(simd_bytes, n_vectors, max_trip_count(tile_row))
            odd = column_tail_tile(simd_bytes, n_vectors, max_trip_count(tile_row))  # rows first, then columns
            if odd is not None:
                cols, row_amounts, divisors_first = odd
            broadcast = [u for u in idxs if u in in_reduce and u not in vec_loads]
            reduce_axes = [r for r in kernel_axes(ast) if r.arg[1] is AxisType.REDUCE]
            sliding = (
                sliding_window_tile(simd_bytes, n_vectors, tile_row, reduce_axes, broadcast) if odd is None else None
            )
            if sliding is not None:
                cols, row_amounts, divisors_first = sliding
            window = None
            if cols == 1 and odd is None:
                window = window_columns(axes, vec_r, tile_row, vec_loads, broadcast)
            if window is not None:
                take_window_tile(plan, tile_row, *window)
            if vi is not None and cols > 1 and odd is None:  # (a tail would get no tile: cols divides the vectors)
                take(Opt(OptOps.UPCAST, vi, cols))
            axes = kernel_axes(plan.ast)
            if window is None:
                ri = next(i for i, r in enumerate(axes) if r.arg[0] == tile_row.arg[0])
                rows = amount_with_tail(max_trip_count(axes[ri]), row_amounts, divisors_first)
                take(Opt(OptOps.UPCAST, ri, rows))
                if sliding is not None and (
                    second := second_window_row(
                        kernel_axes(ast), rows, (vec_r, tile_row), vec_loads, broadcast, reduce_axes
                    )
                ):
                    if (si := index_of(plan.ast, second[0])) is not None:
                        take(Opt(OptOps.UPCAST, si, second[1]))
            if odd is not None and (vi := index_of(plan.ast, vec_r)) is not None:
                take(Opt(OptOps.UPCAST, vi, cols))  # its tail nest a tile of the same rows
            # columns outside rows: the panel of B a column tile reads stays in cache across the row tiles
            axes = kernel_axes(plan.ast)
            row_i = next((i for i, r in enumerate(axes) if r.arg[0] == tile_row.arg[0]), None)
            vi = next((i for i, r in enumerate(axes) if r.arg[0] == vec_r.arg[0]), None)
            if vi is None and row_i is not None:  # the tile took the whole vector axis: B stored in column panels
                vi = column_panel_loop(axes, row_i, main_ids, broadcast)
            if row_i is not None and vi is not None and row_i < vi and not has_hoisted_reduce(plan.ast):
                take(Opt(OptOps.SWAP, row_i, vi))
            if window is None and (row_stride := _store_stride(ast.src[0], tile_row)):
                tile_tail_nests(plan, row_stride, max_trip_count(tile_row), width, simd_bytes)

    # a reduce along a strided axis (column sums, batch statistics) with no register tile: more vectors of the
    # output per input row, so each row is read in longer runs into independent accumulators (4096x1024 sum(0):
    # 1.16 -> 0.25 ms with 8 vectors); not where the reduces are hoisted out of the vector's loop (a row's norm before
    # its columns are divided by it): there they have no accumulator along it, and a tail of the wider block would
    # be a loop nest computing them again
    if has_reduce and not is_reduce and len(plan.opts) == 1 and reduces_along(ast, vec_r):
        vectors = 1
        if (vi := index_of(plan.ast, vec_r)) is not None:
            if (more := amount_with_tail(max_trip_count(kernel_axes(plan.ast)[vi]), (8, 4, 2))) > 1:
                take(Opt(OptOps.UPCAST, vi, more))
                vectors = more
        take_continuing_rows(plan, vec_r, [u for u in idxs if u in runs_in_reduce], vectors)

    vectorize_own_loops(plan, contiguous_count, vec_amount)

    if not has_reduce and is_transposed_copy(plan.ast, vec_r, idxs, itemsize):
        take_transpose_block(plan, vec_r, blocks)

    if threads > 1 and total_work >= MIN_THREAD_WORK:
        thread_nests(plan, threads, blocks)
    return gate_single_core(plan.ast), plan.opts


TAIL_TILE_VECTORS = (8, 4, 2)  # vectors of columns a leftover row's tile takes (one FMA chain each)
TAIL_TILE_ROWS = (8, 6, 4, 3, 2)  # rows a column tail's tile takes, as many as its accumulators fit the budget


def _store_stride(nest: UOp, r: UOp) -> int | None:
    """r's step in the index of the nest's store into a buffer (None: no such store, or not linear in r)."""
    st = next((u for u in nest.toposort() if u.op is Ops.STORE and u.src[0].src[0].op is Ops.DEFINE_GLOBAL), None)
    return None if st is None else stride(simplify(st.src[0].src[1]), r)


def _copies_per_row(nest: UOp, width: int) -> int:
    """A tail nest's accumulators per row of its tile: each expanded range the store walks contiguously with a power
    of two of at most `width` lanes is one vector (codegen/expander.py), every other expanded range a copy each."""
    n = 1
    for r in {u for u in nest.toposort() if u.op is Ops.RANGE and u.arg[1] is AxisType.UPCAST}:
        t = max_trip_count(r)
        if not (t <= width and t & (t - 1) == 0 and _store_stride(nest, r) == 1):
            n *= t
    return n


def tile_tail_nests(plan: OptPlan, row_stride: int, n_rows: int, width: int, simd_bytes: int) -> None:
    """The tail nests of a register tile get tiles of their own, from their copies of the tile's loops (split_tail
    gives a tail fresh loops, which the tile's actions did not split):
    - the columns' tail (the columns left of the last vector, for every row: `RANGE(rows) x T columns`): its rows
      (the loop that steps through the store like the tile's rows) as copies, so each step of the reduce feeds
      rows x T independent accumulators, not one chain of dependent multiply-adds per output (513x257x513 on one
      AVX-512 core: the 1-column tail, 1/513 of the products, took 17% of the kernel's time);
    - the rows' tail (the rows left of the last tile, its columns' vectors shared with the tile) of one row of at
      most 2 vectors: more of its vectors of columns (the loop that steps through the store by less than a row) per
      step, 8 chains (an FMA's latency times the 2 a cycle).
    Each only where the accumulators fit the tile's budget."""
    budget = accumulator_budget(simd_bytes)
    done: set[int] = set()
    while True:
        axes = kernel_axes(plan.ast)
        for nest in plan.ast.src[1:]:
            nodes = set(nest.toposort())
            if not any(u.op is Ops.REDUCE for u in nodes) or any(u.op is Ops.RANGE and symbolic_size(u) for u in nodes):
                continue  # (a symbolic size's tail is a loop of n % amount rows, sized for its largest value)
            per_row = _copies_per_row(nest, width)
            loops = [r for r in axes if r in nodes and r.arg[1] is AxisType.LOOP and r.arg[0] not in done]
            rows = next(
                (r for r in loops if _store_stride(nest, r) == row_stride and max_trip_count(r) == n_rows), None
            )
            cols = [r for r in loops if 0 < (_store_stride(nest, r) or 0) < row_stride and not symbolic_size(r)]
            if rows is not None and not symbolic_size(rows):
                done.add(rows.arg[0])
                fit = tuple(a for a in TAIL_TILE_ROWS if a * per_row <= budget)
                if fit and plan.take(Opt(OptOps.UPCAST, axes.index(rows), amount_with_tail(n_rows, fit))):
                    break
            elif rows is None and cols and per_row <= 2:
                done.add(cols[-1].arg[0])
                fit = tuple(a for a in TAIL_TILE_VECTORS if a * per_row <= TAIL_TILE_VECTORS[0])
                amt = largest_divisor(max_trip_count(cols[-1]), fit)
                if amt > 1 and plan.take(Opt(OptOps.UPCAST, axes.index(cols[-1]), amt)):
                    break
        else:
            return


SCORE_TILE_ACCUMULATORS = 8  # vectors a score tile (rows x vectors of keys) and its product with v accumulate in


def score_tile(ast: UOp, width: int) -> tuple[UOp, UOp, bool, list[UOp], UOp] | None:
    """(rows, keys, whether the keys' loads are contiguous, other row loops, columns) of a kernel whose row buffer is
    filled with a contraction computed in the fill's loop (attention in one kernel, schedule/policy.py:
    reduces_below): the scores row s[i, j] = sum_d q[i, d] * k[j, d], filled along the keys j (the range of stride 1
    in the row buffer's store) in the loop of their max. rows: an output loop the contraction's loads not along the
    keys (q) use and those along them (k) do not; other row loops: reduces of stride 1 in the other row buffers'
    fills (exp's sum); columns: the output loop every store walks with stride 1 (the head dimension of the product
    with v). None where any is missing or the keys are not a multiple of the vector width."""
    nodes = list(ast.toposort())
    fills = [
        u for u in nodes if u.op is Ops.STORE and u.src[0].op is Ops.INDEX and u.src[0].src[0].op is Ops.DEFINE_REG
    ]
    axes = kernel_axes(ast)
    stores = [u for u in nodes if u.op is Ops.STORE and u.src[0].src[0].op is Ops.DEFINE_GLOBAL]
    cols = [r for r in axes if r.arg[1] is AxisType.LOOP and all(stride(u.src[0].src[1], r) == 1 for u in stores)]
    for fill in fills:
        idx = fill.src[0].src[1]
        keys = next((r for r in axes if r.arg[1] is AxisType.REDUCE and stride(idx, r) == 1), None)
        if keys is None or symbolic_size(keys) or max_trip_count(keys) % width:
            continue
        fill_ranges = set(idx.ranges)
        dots = [
            red
            for red in fill.src[1].toposort()
            if red.op is Ops.REDUCE and red.arg is Ops.ADD and not fill_ranges & set(red.src[1:])
        ]
        if len(dots) != 1:
            continue
        loads = [u for u in dots[0].src[0].toposort() if u.op is Ops.INDEX and u.src[0].op is Ops.DEFINE_GLOBAL]
        along = [u for u in loads if fill_ranges & set(u.src[1].ranges)]
        across = [u for u in loads if u not in along]
        rows = [
            r
            for r in axes
            if r.arg[1] is AxisType.LOOP
            and not symbolic_size(r)
            and all(r in u.src[1].ranges for u in across)
            and not any(r in u.src[1].ranges for u in along)
            and max_trip_count(r) % 2 == 0
        ]
        if not along or not across or not rows or not stores or not cols:
            continue
        others = [
            r
            for f in fills
            if f is not fill
            for r in axes
            if r.arg[1] is AxisType.REDUCE and stride(f.src[0].src[1], r) == 1 and max_trip_count(r) % width == 0
        ]
        contiguous = all(stride(u.src[1], keys) == 1 for u in along)
        return rows[-1], keys, contiguous, others, cols[0]
    return None


def take_score_tile(plan: OptPlan, rows: UOp, keys: UOp, contiguous: bool, others: list[UOp], cols: UOp, width: int):
    """A register tile of query rows x vectors of keys, reduced over d with a vector load of k along the keys and a
    broadcast of q per row (no horizontal sum), each row's row buffers its own (codegen/opt: `_row_buffer_per_lane`);
    the exp loop one vector along the keys, and the product with v a tile of the same rows x vectors of v's columns.
    Keys read contiguously (k.T in panels of keys: tensor/attention.py, `_keys_in_panels`): 4 rows x 2 vectors of
    keys, 4 rows x 2 vectors of columns. Gathered (k itself: 8 scalar loads and shuffles per vector): 8 rows x 1
    vector, so each gather feeds 8 rows. Measured on 2 AVX2 cores at (1, 1, 2048, 64), median kernel CPU time in one
    process against the stored scores' kernels: in panels 4 x 2 0.67-0.74x (torch 0.61-0.76x), 8 x 1 0.88x, 4 x 4
    0.88x, 2 x 4 0.90x; gathered 8 x 1 1.02-1.06x; one query row at a time 1.5x."""
    vectors = 2 if contiguous and max_trip_count(keys) % (2 * width) == 0 else 1
    n_rows = largest_divisor(max_trip_count(rows), (8, 4, 2) if vectors == 1 else (4, 2))
    col_vectors = max(1, SCORE_TILE_ACCUMULATORS // n_rows)
    for r, op, amounts in [
        (rows, OptOps.UPCAST, (n_rows,)),
        (keys, OptOps.UNROLL, (width, vectors)),
        *[(r, OptOps.UNROLL, (width,)) for r in others],
        (cols, OptOps.UPCAST, (width, col_vectors)),
    ]:
        for amt in amounts:
            i = index_of(plan.ast, r)
            if amt > 1 and i is not None and max_trip_count(kernel_axes(plan.ast)[i]) % amt == 0:
                plan.take(Opt(op, i, amt))


STRIDED_REDUCE_VECTORS = 8  # output vectors per step of a reduce along a strided axis (above)


def take_continuing_rows(plan: OptPlan, vec_r: UOp, strided: list[UOp], vectors: int) -> None:
    """A reduce along a strided axis whose vector axis is short, taken whole in `vectors` vectors (fewer than
    STRIDED_REDUCE_VECTORS): rows of the output loop that continues its run in memory (whose step in every load
    inside the reduce is the vector axis's whole length) make up the rest, so each step of the strided reduce loop
    reads one longer run of memory into more independent accumulators. A broadcast operand along either loop keeps
    the range rewrites from merging the two into one long vector axis. On one AVX2 core, x (256, 256, 16): (x +
    v).max(0), v (16,), 2 vectors of 8 lanes read one 64-byte line per row at a 16 KiB stride, 1.2 ms; with 4 rows
    of them 0.25 ms (the same max with x + v stored first, whose axes merge into 8 vectors: 0.6 ms). (x *
    v).max((0, 2)), v (256, 1, 1), a vector reduce over the last axis: 1.4 -> 0.26 ms."""
    if vectors >= STRIDED_REDUCE_VECTORS or not strided or symbolic_size(vec_r) or index_of(plan.ast, vec_r):
        return
    axes = kernel_axes(plan.ast)
    run = max_trip_count(vec_r)
    # the loads along the vector axis (a broadcast one, v[j] of x[i, j] + v[j] along i, is read once per row)
    along = [(u, s) for u in strided if (s := stride(u.src[1], vec_r)) != 0]
    if not along or any(s is None for _, s in along):
        return

    def steps_over_run(r: UOp) -> bool:  # a reduce loop each load steps through by more than the run
        return all((t := stride(u.src[1], r)) is not None and s is not None and t > s * run for u, s in along)

    if not any(r.arg[1] is AxisType.REDUCE and steps_over_run(r) for r in axes):
        return
    for i, r in enumerate(axes):
        if (
            r.arg[1] is AxisType.LOOP
            and not symbolic_size(r)
            and all(s is not None and stride(u.src[1], r) == s * run for u, s in along)
        ):
            amounts = tuple(a for a in (8, 4, 2) if a * vectors <= STRIDED_REDUCE_VECTORS)
            if (rows := largest_divisor(max_trip_count(r), amounts)) > 1:
                plan.take(Opt(OptOps.UPCAST, i, rows))
            return


PAGE_BYTES = 4096
TRANSPOSE_BLOCK_ROWS = 16  # rows of a transposed read one block walks: each row's line is read for 16 outer steps


def is_transposed_copy(ast: UOp, vec_r: UOp, idxs: list[UOp], itemsize: int) -> bool:
    """An elementwise kernel whose vector lanes (along the store's contiguous axis) gather a load from rows far
    apart (stride of a page or more: a weight stored transposed, tensor/conv_layout.py's cout-last copy), where the same
    load is contiguous along an outer loop: each lane's row is read one element per outer step."""
    loops = [r for r in kernel_axes(ast) if r.arg[1] is AxisType.LOOP and r.arg[0] != vec_r.arg[0]]
    for u in idxs:
        st = stride(u.src[1], vec_r)
        if st is not None and abs(st) * itemsize >= PAGE_BYTES and any(stride(u.src[1], r) == 1 for r in loops):
            return True
    return False


def take_transpose_block(plan: OptPlan, vec_r: UOp, blocks: set[int]) -> None:
    """A transposed copy in blocks of TRANSPOSE_BLOCK_ROWS rows of the read (lanes of the store's vector axis): the
    block's loop outermost (TILE), so the outer loop walks a block's rows, each row's cache line read for 16 outer
    steps in a row and its page in the TLB, instead of a new page per lane (ResNet-50's (2048, 1024) weight copied
    cout-last: 9.3 -> 1.4 ms on 2 AVX2 cores; 16 rows measured faster than 32, 64 or 128)."""
    axes = kernel_axes(plan.ast)
    vi = index_of(plan.ast, vec_r)
    if vi is None:
        return
    lanes = prod(max_trip_count(u) for u in plan.ast.toposort() if u.op is Ops.RANGE and u.arg[1] is AxisType.UPCAST)
    per_block = max(1, TRANSPOSE_BLOCK_ROWS // lanes)
    n = max_trip_count(axes[vi])
    if per_block == 1:
        # a vector's lanes are a block already (AVX-512's 16): its loop outermost, the others in their order
        # ((512,512,3,3) copied cout-last on 1 AVX-512 core: 3.3 -> 0.7 ms)
        for i in range(vi, 0, -1):
            if not plan.take(Opt(OptOps.SWAP, i - 1, i)):
                return
        if vi > 0:
            blocks.add(kernel_axes(plan.ast)[0].arg[0])
        return
    if n > per_block and (b := largest_divisor(n, amounts_largest_first(per_block))) > 1:
        if plan.take(Opt(OptOps.TILE, vi, b)):
            blocks.add(kernel_axes(plan.ast)[0].arg[0])


def vectorize_own_loops(
    plan: OptPlan, contiguous_count: Callable[[UOp], int], vec_amount: Callable[[UOp], int]
) -> None:
    """A loop no value moves with together with a range expanded already, walked with stride 1 by some access (of a
    buffer or a row buffer: attention's exp loop reads the scores row and fills the exp row), gets a
    vector of its own (the expander vectorizes each such range: codegen/expander.py, choose_vector_ranges): a
    reduce computed before an output loop it does not vary along (softmax's row max and sum, then its output row:
    schedule/policy.py, hoisted_reduce_requests) runs three loops one after another in each row, each 16 lanes
    wide, a reduce's with 4 accumulators. An output loop takes a vector that divides it: a tail would be a loop
    nest of its own, computing the reduces before it again."""
    if not any(u.op is Ops.REDUCE for u in plan.ast.toposort()):
        return
    while True:
        nodes = list(plan.ast.toposort())
        expanded = {u for u in nodes if u.op is Ops.RANGE and u.arg[1] in (AxisType.UPCAST, AxisType.UNROLL)}
        if not expanded:  # no vector beside which another would run: the choice above stands
            return
        axes = kernel_axes(plan.ast)
        together = [live for live in live_ranges(nodes, expanded | set(axes)).values() if live & expanded]
        rows = [u for u in nodes if u.op is Ops.INDEX and row_buffer_of(u) is not None]
        own = [
            r
            for r in axes
            if r.arg[1] in (AxisType.LOOP, AxisType.REDUCE)
            and (contiguous_count(r) or any(stride(u.src[1], r) == 1 for u in rows))
            and not any(r in live for live in together)
        ]
        for r in own:
            is_reduce = r.arg[1] is AxisType.REDUCE
            amt = vec_amount(r) if is_reduce else largest_divisor(max_trip_count(r), (16, 8, 4, 2))
            amt = min(amt, vec_amount(r))
            if amt > 1 and plan.take(Opt(OptOps.UNROLL if is_reduce else OptOps.UPCAST, axes.index(r), amt)):
                if is_reduce and (i := index_of(plan.ast, r)) is not None:  # accumulators hide the add latency
                    n = max_trip_count(kernel_axes(plan.ast)[i])
                    plan.take(Opt(OptOps.UNROLL, i, amount_with_tail(n, (4, 2), divisors_first=True)))
                elif (i := index_of(plan.ast, r)) is not None and reduces_along(plan.ast, r):
                    # an output loop whose vectors accumulate a reduce nested inside it (attention's product with v,
                    # per query row): more vectors of it are independent accumulators (one multiply-add chain per
                    # vector waited on each add: (1,1,2048,64) attention 80 -> 32 ms on 2 AVX2 cores)
                    n = max_trip_count(kernel_axes(plan.ast)[i])
                    plan.take(Opt(OptOps.UPCAST, i, amount_with_tail(n, (8, 4, 2), divisors_first=True)))
                break  # the axes moved: look again
        else:
            return


def reduces_along(ast: UOp, r: UOp) -> bool:
    """Whether a REDUCE of the kernel runs inside loop r with a body that varies along it (a reduce per output of r,
    not a row statistic computed before r's loop opens)."""
    return any(u.op is Ops.REDUCE and any(x.arg[0] == r.arg[0] for x in u.src[0].ranges) for u in ast.toposort())


def thread_nests(plan: OptPlan, threads: int, blocks: AbstractSet[int] = frozenset()) -> None:
    """THREAD in each loop nest of the kernel (the main one, and tails with enough work): its outermost output loop
    the core count divides, else its outermost with at least 8 iterations per core, else its longest."""
    tried: set[int] = set()
    while True:
        axes = kernel_axes(plan.ast)
        for nest in plan.ast.src:
            nodes = set(nest.toposort())
            loops = [r for r in axes if r.arg[1] is AxisType.LOOP and r in nodes and max_trip_count(r) >= threads]
            loops.sort(key=lambda r: r.arg[0] in blocks)  # a cache block's loop last
            work = prod(max_trip_count(r) for r in nodes if r.op is Ops.RANGE)
            threaded = any(u.op is Ops.SPECIAL for u in nodes)
            if not loops or work < MIN_THREAD_WORK or loops[0].arg[0] in tried or threaded:
                continue
            r = next(
                (
                    r
                    for r in loops
                    if (max_trip_count(r) % threads == 0 and not symbolic_size(r)) or max_trip_count(r) >= 8 * threads
                ),
                max(loops, key=lambda r: max_trip_count(r)),
            )
            tried.add(loops[0].arg[0])
            plan.take(Opt(OptOps.THREAD, axes.index(r), threads))
            break
        else:
            return
