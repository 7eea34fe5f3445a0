"""The hand-coded optimizer: which actions to take for a kernel on a CPU with SIMD and several cores.

- the vector axis: the loop most loads and stores walk with stride 1 -> UPCAST (an output axis) or UNROLL
  (a reduce axis) by the SIMD width (16 floats with AVX-512);
- a reduce over a vector axis: 4 copies of the vector -> 4 independent accumulators, so the adds of one
  iteration do not wait on each other (an FMA has ~4 cycles of latency);
- a matmul-like kernel (a reduce whose loads each miss an output axis): a register tile, rows as copies and
  two vectors of columns, summed into one accumulator per tile element with fused multiply-adds;
- a transposed copy (lanes reading rows a page apart): TILE blocks of a few rows, each row's line read for 16 steps
  (with 16 lanes the vector is the block: its loop outermost);
- the outermost output loop with enough work (access.work_estimate: each store and reduce in the loops it runs in,
  a matmul's multiply-adds at 1/8, not the product of every loop) -> THREAD across the cores, in each loop nest (a
  tail is one);
  each core a contiguous block, or every amt-th iteration where the loop's iterations grow in work along it (a gated
  reduce inside ends its loop by this loop's value: causal attention's query tiles), in blocks of a cache line's
  rows where a row is narrower;
- an amount that does not divide its axis: the largest part it divides, and a tail for the rest.

A symbolic loop (a size from a Variable) counts as its largest size (the kernel serves every value, so it is
shaped for the most work): it is split like any other, with a tail loop for n % amount and, for THREAD, per-core
chunks; divisors are not preferred where the size is not known.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet

from zeptograd.codegen.expander import live_ranges, row_buffer_of, vector_ranges
from zeptograd.codegen.opt import Opt, OptOps, OptPlan, kernel_axes, masks_tail
from zeptograd.codegen.opt.access import (
    accesses,
    amount_with_tail,
    amounts_largest_first,
    has_hoisted_reduce,
    index_of,
    largest_divisor,
    stride,
    symbolic_size,
    work_estimate,
)
from zeptograd.codegen.opt.tail import gate_single_core
from zeptograd.codegen.opt.tiles import (
    L2_BLOCK_BYTES,
    _store_stride,
    accumulator_budget,
    column_panel_loop,
    column_tail_tile,
    dot_tile,
    dot_tile_shape,
    full_vector_output_axis,
    score_tile,
    second_dot_column,
    second_window_row,
    sharing_tile_row,
    sliding_window_tile,
    take_score_tile,
    take_window_tile,
    tile_shape,
    tile_tail_nests,
    vector_registers,
    window_columns,
)
from zeptograd.dtype import PtrDType
from zeptograd.helpers import THREADS, prod
from zeptograd.renderer import MIN_THREAD_WORK
from zeptograd.uop.ops import AxisType, Ops, UOp, max_trip_count
from zeptograd.uop.symbolic import simplify


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
    thread_work = work_estimate(plan.ast)  # what a split over the cores would share (not every loop's product)
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
        if threads > 1 and thread_work >= MIN_THREAD_WORK:
            thread_nests(plan, threads, blocks)
        return gate_single_core(plan.ast), plan.opts

    def contiguous_count(r: UOp) -> int:
        return sum(weight[u] for u in idxs if stride(u.src[1], r) == 1)

    def vec_amount(r: UOp) -> int:  # a full vector and a tail where the width does not divide a long enough axis
        options = tuple(w for w in (16, 8, 4, 2) if w <= width) or (1,)
        if max_trip_count(r) >= options[0] or symbolic_size(r):
            return amount_with_tail(max_trip_count(r), options)
        if (d := largest_divisor(max_trip_count(r), options)) == 1 and max_trip_count(r) >= 8:
            # an odd axis shorter than the vector (SqueezeNet's 13 pooled columns under AVX-512's 16 lanes): 8 lanes
            # and a tail, as with AVX2's 8, rather than scalar code
            return amount_with_tail(max_trip_count(r), tuple(w for w in options if w <= 8))
        return d

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
        # a tile's columns left of the last vector: one masked vector (tile_tail_nests gives it the tile's rows); so
        # too the columns of a reduce along a strided axis, each copy its own chain of scalar loads over the reduce
        # (x.mean(0)[:, 1:-1] of (256, 128): 126 columns, 14 left)
        masked = (
            masked_vectors
            and not is_reduce
            and (tile_rows or reduces_along(plan.ast, vec_r))
            and masks_tail(max_trip_count(vec_r) % vec_amt)
        )
        take(Opt(OptOps.UNROLL if is_reduce else OptOps.MASKED_UPCAST if masked else OptOps.UPCAST, vec_i, vec_amt))
        axes = kernel_axes(plan.ast)
        tile = dot_tile(kernel_axes(plan.ast), [u for u in idxs if stride(u.src[1], vec_r) == 1]) if is_reduce else None
        if tile is not None:
            # A @ B.T (both operands contiguous along the reduce): a tile of rows x columns of dot products, each a
            # vector accumulator; one vector load of a row feeds every column and one of a column every row
            row, col = tile
            cols, row_amounts = dot_tile_shape(simd_bytes, max_trip_count(col), max_trip_count(row))
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
        # of them with room for a tile, the one whose rows' broadcast loads share cache lines, then the innermost:
        # the rows' broadcast operand is read at nearby addresses (a conv vectorized along its output channels: 4
        # output columns of one input row, not 8 images 200 KB apart); a loop the vector's split made is none (the
        # accesses above index the loops before it)
        unsplit = set(kernel_axes(ast))
        broadcast = [u for u in idxs if u in in_reduce and u not in vec_loads]
        tile_row = sharing_tile_row(
            [r for r in row_options if r in unsplit and max_trip_count(r) >= 4 and not symbolic_size(r)],
            broadcast,
            itemsize,
        )
        if tile_row is None and row_options:
            tile_row = row_options[0]
        if tile_row is not None:
            axes = kernel_axes(plan.ast)
            vi = next((i for i, r in enumerate(axes) if r.arg[0] == vec_r.arg[0]), None)
            n_vectors = max_trip_count(axes[vi]) if vi is not None else 1
            cols, row_amounts, divisors_first = tile_shape(simd_bytes, n_vectors, max_trip_count(tile_row))
            odd = column_tail_tile(simd_bytes, n_vectors, max_trip_count(tile_row))  # rows first, then columns
            if odd is not None:
                cols, row_amounts, divisors_first = odd
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
                        simd_bytes, kernel_axes(ast), rows, (vec_r, tile_row), vec_loads, broadcast, reduce_axes
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
    # 1.16 -> 0.25 ms with 8 vectors), all of them where they are that many or fewer (7 vectors: 4 and a tail of 3
    # read every row twice); not where the reduces are hoisted out of the vector's loop (a row's norm before
    # its columns are divided by it): there they have no accumulator along it, and a tail of the wider block would
    # be a loop nest computing them again
    if has_reduce and not is_reduce and len(plan.opts) == 1 and reduces_along(ast, vec_r):
        vectors = 1
        if (vi := index_of(plan.ast, vec_r)) is not None:
            n = max_trip_count(kernel_axes(plan.ast)[vi])
            whole = n <= STRIDED_REDUCE_VECTORS and not symbolic_size(kernel_axes(plan.ast)[vi])
            if (more := n if whole else amount_with_tail(n, (8, 4, 2))) > 1:
                take(Opt(OptOps.UPCAST, vi, more))
                vectors = more
        take_continuing_rows(plan, vec_r, [u for u in idxs if u in runs_in_reduce], vectors)

    vectorize_own_loops(plan, contiguous_count, vec_amount, simd_bytes)
    take_interleaved_rows(plan, simd_bytes)

    if not has_reduce and is_transposed_copy(plan.ast, vec_r, idxs, itemsize):
        take_transpose_block(plan, vec_r, blocks)

    if threads > 1 and thread_work >= MIN_THREAD_WORK:
        thread_nests(plan, threads, blocks)
    return gate_single_core(plan.ast), plan.opts


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
    plan: OptPlan, contiguous_count: Callable[[UOp], int], vec_amount: Callable[[UOp], int], simd_bytes: int
) -> None:
    """A loop no value moves with together with a range expanded already, walked with stride 1 by some access (of a
    buffer or a row buffer: attention's exp loop reads the scores row and fills the exp row), gets a
    vector of its own (the expander vectorizes each such range: codegen/expander.py, choose_vector_ranges): a
    reduce computed before an output loop it does not vary along (softmax's row max and sum, then its output row:
    schedule/policy.py, hoisted_reduce_requests) runs three loops one after another in each row, each 16 lanes
    wide, a reduce's with 4 accumulators. An output loop takes a vector that divides it: a tail would be a loop
    nest of its own, computing the reduces before it again.
    Only a vector blocks another (the expander gives a value one vector range at most): a register tile's rows, copies,
    do not. A row statistic inside the rows (the max and sum over the keys of softmax(q @ k.T) @ v, 8 query rows x
    2 vectors of columns with AVX-512) is a vector per row copy, its accumulators within the tile's budget: left a
    scalar loop per row, each row's exp ran on one lane ((1,2,128,32) against 32 keys, causal, 1 AVX-512 core: both
    kernels 81 -> 13 us; the unfused kernels 15)."""
    if not any(u.op is Ops.REDUCE for u in plan.ast.toposort()):
        return
    while True:
        nodes = list(plan.ast.toposort())
        expanded = {u for u in nodes if u.op is Ops.RANGE and u.arg[1] in (AxisType.UPCAST, AxisType.UNROLL)}
        if not expanded:  # no vector beside which another would run: the choice above stands
            return
        axes = kernel_axes(plan.ast)
        vectors = vector_ranges(plan.ast, simd_bytes)
        live = [x for x in live_ranges(nodes, expanded | set(axes)).values() if x & expanded]
        rows = [u for u in nodes if u.op is Ops.INDEX and row_buffer_of(u) is not None]
        budget = accumulator_budget(simd_bytes)

        def copies(r: UOp) -> int:  # the unrolled copies r's values are made in (a register tile's rows)
            return max((prod(max_trip_count(e) for e in x & expanded - vectors) for x in live if r in x), default=1)

        own = [
            r
            for r in axes
            if r.arg[1] in (AxisType.LOOP, AxisType.REDUCE)
            and (contiguous_count(r) or any(stride(u.src[1], r) == 1 for u in rows))
            and not any(r in x and x & vectors for x in live)
            and copies(r) <= budget
        ]
        for r in own:
            is_reduce = r.arg[1] is AxisType.REDUCE
            amt = vec_amount(r) if is_reduce else largest_divisor(max_trip_count(r), (16, 8, 4, 2))
            amt = min(amt, vec_amount(r))
            fit = tuple(a for a in (8, 4, 2) if a * copies(r) <= budget)  # more vectors: each copy has them
            if amt > 1 and plan.take(Opt(OptOps.UNROLL if is_reduce else OptOps.UPCAST, axes.index(r), amt)):
                if is_reduce and (i := index_of(plan.ast, r)) is not None:  # accumulators hide the add latency
                    n = max_trip_count(kernel_axes(plan.ast)[i])
                    plan.take(Opt(OptOps.UNROLL, i, amount_with_tail(n, tuple(a for a in fit if a <= 4), True)))
                elif (i := index_of(plan.ast, r)) is not None and reduces_along(plan.ast, r):
                    # an output loop whose vectors accumulate a reduce nested inside it (attention's product with v,
                    # per query row): more vectors of it are independent accumulators (one multiply-add chain per
                    # vector waited on each add: (1,1,2048,64) attention 80 -> 32 ms on 2 AVX2 cores)
                    n = max_trip_count(kernel_axes(plan.ast)[i])
                    plan.take(Opt(OptOps.UPCAST, i, amount_with_tail(n, fit, divisors_first=True)))
                break  # the axes moved: look again
        else:
            return


INTERLEAVED_ROWS = (8, 4, 2)  # rows whose reduces one iteration computes side by side, the most that divides


def take_interleaved_rows(plan: OptPlan, simd_bytes: int) -> None:
    """Short reduced rows (every reduce's axis taken whole in vectors: 16-64 floats) computed several at once: UPCAST
    of the rows' loop, so the rows' horizontal reductions (a log2 tree of shuffles, each step of a max a compare and
    two selects for NaN) and what waits on them (softmax's exp after its max, layernorm's variance after its mean, a
    normalized row after its statistic) are independent chains in one straight-line body, not one row's chain after
    another's. Measured on one core of this AVX-512 host, kernel CPU time, heuristic's -> 8 rows: exp(x - max) over
    32 keys (gpt_tiny's attention, (2048, 32)) 33 -> 20 us; softmax (4096, 16) 47 -> 26, (2048, 32) 42 -> 26,
    (1024, 64) 32 -> 23; layernorm 16 -> 9, 11 -> 7, 8 -> 6; rmsnorm 8.6 -> 4.7, 5.3 -> 3.9, 4.0 -> 3.7; max 13 -> 4,
    11 -> 4, 8 -> 4; with 8-lane AVX2 code (16 registers) softmax 54 -> 41, 47 -> 39 (4 rows of 4 vectors). Not a
    lone row sum whose result is all the row's work: an add's step is short and the rows stream at the cache's
    bandwidth ((2048, 32) x.sum(-1) 2.2 us, 2.6 with 8 rows; (x + v).sum(2) of (256, 256, 64) 155-164 -> 169), nor
    rows sharing an operand along the reduce (a matmul's: its register tile is the rows)."""
    axes = kernel_axes(plan.ast)
    reduces = [u for u in plan.ast.toposort() if u.op is Ops.REDUCE]
    if not reduces or any(r.arg[1] is AxisType.REDUCE for r in axes):
        return  # no reduce, or a row longer than its vectors: its loop, not the horizontal step, is the work
    in_reduces = {r for red in reduces for r in red.src[0].ranges}
    stores = [u.src[0].src[1] for u in plan.ast.toposort() if u.op is Ops.STORE and u.src[0].op is Ops.INDEX]
    row_continues = any(r not in in_reduces for idx in stores for r in idx.ranges)  # (an output row after its reduces)
    if len(reduces) == 1 and reduces[0].arg is Ops.ADD and not row_continues:
        return  # a row sum (an add's step is short), its result all the row's work: no chain worth interleaving
    loads = [
        u for red in reduces for u in red.src[0].toposort() if u.op is Ops.INDEX and u.src[0].op is Ops.DEFINE_GLOBAL
    ]
    expanded = (AxisType.UPCAST, AxisType.UNROLL)
    tile = {r for red in reduces for r in red.src[0].ranges if r.arg[1] is AxisType.UPCAST}
    if not loads or any(stride(u.src[1], r) == 0 for u in loads for r in tile):
        return  # a contraction's register tile (an output's copies sharing a load: q @ k.T's rows x vectors of keys)
    # the rows: the innermost loop the reduces' loads walk (neighbouring rows, one run of memory), each load its own
    # row there (x + v of v (2048, 1, 1) read by (2048, 1024, 64).max(2): not 8 rows 256 KiB apart along the outer
    # loop, 43-53 -> 75-111 ms, each a stream of its own); a load that no output loop moves is every row's (v (16,)
    # of (x * v).max(-1) over (256, 256, 16): 218 -> 62 us, one core)
    loads = [u for u in loads if any(stride(u.src[1], r) != 0 for r in axes if r.arg[1] is AxisType.LOOP)]
    rows = [r for r in axes if r.arg[1] is AxisType.LOOP and any(stride(u.src[1], r) != 0 for u in loads)]
    if not rows or symbolic_size(row := rows[-1]) or any(stride(u.src[1], row) == 0 for u in loads):
        return
    width = max(1, simd_bytes // 4)
    lanes = max(
        prod(max_trip_count(r) for r in red.src[1:] if r.op is Ops.RANGE and r.arg[1] in expanded) for red in reduces
    )
    vectors = max(1, -(-lanes // width))
    amounts = tuple(a for a in INTERLEAVED_ROWS if a * vectors <= vector_registers(simd_bytes))
    if (n := largest_divisor(max_trip_count(row), amounts)) > 1:
        plan.take(Opt(OptOps.UPCAST, axes.index(row), n))


def reduces_along(ast: UOp, r: UOp) -> bool:
    """Whether a REDUCE of the kernel runs inside loop r with a body that varies along it (a reduce per output of r,
    not a row statistic computed before r's loop opens)."""
    return any(u.op is Ops.REDUCE and any(x.arg[0] == r.arg[0] for x in u.src[0].ranges) for u in ast.toposort())


CACHE_LINE_BYTES = 64


def interleave_block(ast: UOp, nest: UOp, r: UOp) -> int | None:
    """The iterations of r the cores take in turn (OptOps.THREAD_INTERLEAVED) rather than contiguous blocks, where a
    gated reduce's loop ends by r's value (codegen/gated_reduce.py: causal attention's key loops end at the query
    tile's last row, so the last block's iterations are the longest): 1 where each iteration of r stores its own
    whole cache lines, else as many as store one line (a triangular row sum's 4-byte rows: 16 of them, TILE's
    blocks), so that neighbouring cores never write one line and pass it back and forth. None: contiguous blocks."""
    from zeptograd.codegen.gated_reduce import ends_along

    st = next((u for u in nest.toposort() if u.op is Ops.STORE and u.src[0].src[0].op is Ops.DEFINE_GLOBAL), None)
    if st is None or not isinstance(ptr := st.src[0].src[0].dtype, PtrDType):
        return None
    if not (step := stride(simplify(st.src[0].src[1]), r)):
        return None
    row_bytes = abs(step) * ptr.base.itemsize
    if row_bytes % CACHE_LINE_BYTES == 0:
        block = 1
    elif CACHE_LINE_BYTES % row_bytes == 0 and not symbolic_size(r) and r.arg[0] == min(x.arg[0] for x in nest.ranges):
        block = CACHE_LINE_BYTES // row_bytes  # (r outermost in its nest: TILE's block loop goes where r is)
        if max_trip_count(r) % block != 0:
            return None
    else:
        return None
    return block if ends_along(ast, r) else None


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
            work = work_estimate(nest)
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
            # a contiguous block per core, unless r's iterations differ in work: then every threads-th one (or block
            # of a cache line's rows: TILE, and its block loop, the kernel's first axis, interleaved) per core
            block = interleave_block(plan.ast, nest, r)
            if block is not None and block > 1:
                fits = max_trip_count(r) // block >= threads
                block = block if fits and plan.take(Opt(OptOps.TILE, axes.index(r), block)) else None
            i = axes.index(r) if block in (None, 1) else 0
            op = OptOps.THREAD if block is None else OptOps.THREAD_INTERLEAVED
            if not plan.take(Opt(op, i, threads)) and op is not OptOps.THREAD:
                plan.take(Opt(OptOps.THREAD, i, threads))
            break
        else:
            return
