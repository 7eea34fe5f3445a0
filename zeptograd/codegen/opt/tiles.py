"""The register tiles the CPU heuristic takes (codegen/opt/heuristic.py): rows x vectors of a matmul-like kernel and
their shapes per vector width and register file, the dot-product tile of x @ w.T, convolution window tiles, attention's
score tile, and the tiles of a tile's leftover nests."""

from __future__ import annotations

from collections.abc import Set as AbstractSet

from zeptograd.codegen.opt import Opt, OptOps, OptPlan, kernel_axes
from zeptograd.codegen.opt.access import amount_with_tail, index_of, largest_divisor, stride, symbolic_size
from zeptograd.uop.ops import AxisType, Ops, UOp, max_trip_count
from zeptograd.uop.symbolic import simplify

L2_BLOCK_BYTES = 1 << 19  # a block of an operand read again by every row tile: half of a 1 MiB L2 per core
TALL_TILE_MIN_ROWS = 64  # 3-row tiles leave a tail row where 3 does not divide: noise only among many rows


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
    (matmul 100x512x100 on 1 AVX-512 core: 4 x 2 65, 8 x 2 and a 4-row tail 49 us); with fewer rows, the fewest
    tiles split as evenly as they go (`even_rows`); with 16, only where the rows that divide make a tile of too few
    accumulators (10 rows: 2 x 2 vectors; AVX2 code on 1 core of an AVX-512 host, x.T @ g (512, 256) x (256, N):
    N = 10 2 -> 5 rows 49 -> 23 us, 14 2 -> 5 68 -> 33, 50 2 -> 6 254 -> 110; 10x512x512 244 -> 110; conv input
    gradients (4,C,14,14)x(C,C,3,3) C = 16 105 -> 61, 64 1726 -> 951), not where none divides (7 rows: 6 and a tail
    row 7.3-8.5 us, 4 and a 3-row tail 9.3)."""
    cols = 2 if n_vectors % 2 == 0 else 1
    if vector_registers(simd_bytes) == 16 and n_vectors % 4 == 0 and n_rows >= TALL_TILE_MIN_ROWS:
        return 4, (3,), False
    rows = tuple(r for r in (8, 6, 4, 2) if r * cols <= accumulator_budget(simd_bytes))
    divisor = largest_divisor(n_rows, rows)
    if n_rows < TALL_TILE_MIN_ROWS and (
        vector_registers(simd_bytes) == 32 or 1 < divisor and divisor * cols < LATENCY_ACCUMULATORS
    ):
        return cols, (even_rows(n_rows, rows[0]),), False
    return cols, rows, vector_registers(simd_bytes) == 16


# independent accumulators that keep the FMA units busy: 2 units x 4 cycles of latency (Zen 3 to 5, Skylake-X)
LATENCY_ACCUMULATORS = 8


def even_rows(n_rows: int, most: int) -> int:
    """The rows of each of the fewest tiles of at most `most` rows that cover n_rows, as even as they go (a tail
    tile of the rest). With few rows a smaller tile that divides them is not better: its accumulators, rows x 2
    vectors, are too few to hide the FMA's latency (2 rows' 4 wait on it; 8 keep both FMA units busy), and the tail
    tile of a near-even split is nearly full (x.T @ g, (512, 256) x (256, N), 1 AVX-512 core, divisor -> even:
    N = 10, mlp_step's h.T @ g: 2 rows 32 us -> 5 rows 13; N = 14: 2 -> 7 rows 45 -> 16; 20: 4 -> 7 32 -> 23; 28:
    4 -> 7 43 -> 32; 50: 2 -> 8 167 -> 60; 7: 6 and a tail row -> 7 13 -> 8; the same where both give 6 or 8)."""
    tiles = max(1, -(-n_rows // most))
    return -(-n_rows // tiles)


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


def dot_tile_shape(simd_bytes: int, n_cols: int, n_rows: int) -> tuple[int, tuple[int, ...]]:
    """A tile of dot products over an axis of n_cols columns and one of n_rows rows: (columns, row options largest
    first, a dividing one preferred). 2 columns x up to 8 rows with AVX-512's 32 registers; fewer than
    TALL_TILE_MIN_ROWS rows as the fewest tiles of 8 split evenly (`even_rows`: x @ W.T, x (M, 512), W (384, 512),
    1 AVX-512 core: M = 10, 2 rows -> 5, 24 -> 17 us; M = 14, 2 -> 7, 33 -> 23 us; M = 20, 4 -> 7, 35 -> 33 us). A
    column axis of 3 (a conv weight gradient's kx) is taken whole rather than 2 and a tail, with at most 12
    accumulators of AVX2's 16 registers and 16 of AVX-512's 32 (on 2 cores of an AVX2 host, conv
    (8,64,56,56)x(64,64,3,3)'s weight gradient: 2 x 8 54-156 ms, 3 x 4 34-72 ms; on 1 core of an AVX-512 host: 2 x 8
    25 ms, 3 x 4 11; x @ w.T 64x1024x1024 on AVX2: 2 x 8 6.6 ms, 2 x 4 3.9)."""
    if vector_registers(simd_bytes) == 32 and n_cols != 3:
        rows = (even_rows(n_rows, 8),) if n_rows < TALL_TILE_MIN_ROWS else (8, 6, 4, 2)
        return amount_with_tail(n_cols, (2,), divisors_first=True), rows
    cols = n_cols if n_cols <= 3 else amount_with_tail(n_cols, (2,), divisors_first=True)
    return cols, tuple(r for r in (8, 6, 4, 2) if r * cols <= accumulator_budget(simd_bytes))


CACHE_LINE_BYTES = 64


def row_line_bytes(r: UOp, broadcast: list[UOp], itemsize: int) -> int:
    """The bytes of new cache lines one more row along r makes the tile's broadcast loads touch per reduce step: a
    load whose rows lie within a line shares it (|stride| * itemsize of it per row), one strided a line or more apart,
    gathered, or not moving along r (no sharing to be had) touches a line of its own per row."""
    total = 0
    for u in broadcast:
        s = stride(u.src[1], r)
        total += CACHE_LINE_BYTES if s in (0, None) else min(abs(s) * itemsize, CACHE_LINE_BYTES)
    return total


def sharing_tile_row(row_options: list[UOp], broadcast: list[UOp], itemsize: int) -> UOp | None:
    """A register tile's row axis among row_options (output loops with room for a tile, outermost first): the one
    whose rows' broadcast loads share cache lines, then the innermost. A weight gradient whose rows' operand is read
    through a permute (attention's qkv gradient, (3, batch, heads, t, head_dim) as (batch*t, 3*heads*head_dim):
    x.T @ g's rows are heads 512 floats apart, or the contiguous head_dim): 4 rows along the heads load 4 lines per
    reduce step, 8 along head_dim half of one (512x192x64 on 1 AVX-512 core: 140 -> 53 us; AVX2 code: 236 -> 120)."""
    if not row_options:
        return None
    return min(reversed(row_options), key=lambda r: row_line_bytes(r, broadcast, itemsize))


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


# a sliding-window tile with AVX-512: vectors of columns, row options
SLIDING_WINDOW_TILE: tuple[int, tuple[int, ...]] = (4, (4, 2))
# with AVX2's 16 registers: 8 accumulators, 4 weight vectors, a broadcast value
SLIDING_WINDOW_TILE_16_REGISTERS: tuple[int, tuple[int, ...]] = (4, (2,))
SLIDING_WINDOW_ROWS = 4  # its rows in all: where the output columns give 2, 2 output rows each
# 2 vectors of output channels (32 with AVX-512): up to 8 rows, a divisor first (14 columns: 2 x 7, 16 accumulators
# at most). 1 AVX-512 core, (1,128,h,h)x(32,128,3,3) pad 1, per call with ~0.15 ms of dispatch: h = 14 0.36 -> 0.30 ms
# (tile_shape's 2 x 2; 2 x 2 x 2 output rows 0.31), 28 0.52 -> 0.48, 56 1.25 -> 1.25, 7 0.26 -> 0.255.
SLIDING_WINDOW_TWO_VECTOR_ROWS = (8, 7, 6, 4, 2)


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
    2 x 7 5.5 / 10, 4 x 4 5.9 / 5.9, 2 x 14 (28 accumulators, spilled) 10-15 / -. 2 vectors of output channels:
    2 x SLIDING_WINDOW_TWO_VECTOR_ROWS. With AVX2's 16 registers, 4 vectors x 2 rows (a tail row where 2 does not
    divide), where tile_shape's 2 vectors took 2 rows at 14 columns and 6 and a tail at 7 (each weight vector fed 2
    FMAs), or 5, 5 and 4 rows at 14 (10 accumulators: spilled, 35 ms); 4 x 3 (12 accumulators) spills too. 8-lane
    code on 1 core of an AVX-512 host compiling without AVX-512 (AVX2's 16 registers), ms before -> after: pad 1
    (8,256,14,14)x(256,256,3,3) 2 x 2 30.8 -> 17.6, (8,512,7,7)x(512,512,3,3) 2 x 6 34.0 -> 20.4 (4 x 3 32.7);
    stride 2 (8,64,56,56)x(128,64,3,3) 2 x 4 10.6 -> 9.9, (8,128,28,28)x(256,128,3,3) 2 x 2 16.0 -> 9.5,
    (8,256,14,14)x(512,256,3,3) 2 x 6 16.6 -> 10.6."""
    if not window_slides(broadcast, row, reduce_axes):
        return None
    if vector_registers(simd_bytes) != 32:
        cols, rows = SLIDING_WINDOW_TILE_16_REGISTERS
        return (cols, rows, True) if n_vectors % cols == 0 else None
    cols, rows = SLIDING_WINDOW_TILE
    if n_vectors == 2:
        return 2, SLIDING_WINDOW_TWO_VECTOR_ROWS, True
    if n_vectors % cols:
        return None
    return cols, rows, True


def second_window_row(
    simd_bytes: int,
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
    if more < 2 or vector_registers(simd_bytes) != 32:  # AVX2's 4 vectors x 2 columns x 2 rows: 16 accumulators
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
    AVX-512 host: 8-lane columns 19 ms, 16 output channels per vector 9 ms. AVX2's 8 lanes divide 56 and keep their
    vector there, but not 28 (3 vectors and 4 lanes left): (8,128,28,28)x(128,128,3,3) with its channels-last weight
    kept the vector on the columns, each row of its tile a block of 32 output channels whose weight is one scalar
    load, and the pad's gates on every input vector: 8-lane code on 1 core of an AVX-512 host compiling without
    AVX-512 (AVX2's 16 registers) 68 ms; 8 output channels per vector 18 ms (`sliding_window_tile`'s 4 x 2)."""
    vec_r = axes[vec_i]
    if vec_r.arg[1] is not AxisType.LOOP or symbolic_size(vec_r) or max_trip_count(vec_r) % width == 0:
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
