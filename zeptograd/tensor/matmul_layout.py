"""Which copy of a matmul's operand the product reads (column panels, transposed, rows padded to whole vectors),
and the gradients of the products that read them: `x @ w` (tensor/nn_ops.py: NNMixin.dot) asks these first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zeptograd.dtype import dtypes
from zeptograd.gradient import with_gradient
from zeptograd.uop.ops import Ops

if TYPE_CHECKING:
    from zeptograd.tensor import Tensor


PANEL = 32  # columns of B per panel: a register tile's width, 4 AVX2 vectors or 2 AVX-512 vectors of float32
PANEL_MIN_ROW_BYTES = 4096  # B's rows a page or more apart: a column block's walk down K misses the caches
PANEL_MIN_ROWS = 128  # rows of A that share each panel (64x1024x1024 with w.T: 3.8 ms in the dot tile, 6.3 packed)
PANEL_MIN_DEPTH = 128  # a shorter column block stays in L1 however it is laid out
# Fewer rows share the copy where the walk down K is long: its block, 2 lines of B a row a page or more apart, falls
# out of L2 from a few hundred rows on, and every row tile walks it again (1 core of an AVX-512 host, copy included,
# in place -> panels: 64x1024x1024 0.92 -> 0.71 ms, 64x2048x1024 2.4-2.7 -> 1.7-1.9, 64x1024x2048 2.2-2.4 -> 1.6-1.7,
# 96x1024x1024 1.38 -> 1.02, q.T @ A as (64, 2048) x (2048, 2048) 5.1 -> 3.7; not from a depth of 512:
# 64x512x1024 0.36 -> 0.38, 64x256x1024 0.20 -> 0.23)
PANEL_FEW_ROWS = 64
PANEL_FEW_ROWS_MIN_DEPTH = 1024
# below a page, B's rows a multiple of 2 KiB apart (512 floats) put a column block's walk down K in 1/32 of the L2's
# sets (1024 sets of 64-byte lines, a row 32 lines on; 8 ways: 256 lines per line of the block's width): over 256
# rows of B the block (2 lines a row) falls out of L2 all the same. There the copy pays from 64 rows of A on (the
# kernels, 1 core of a Zen 3 host, 512 KiB 8-way L2, copy included, alternating in one process: 256x784x512 3.8 ->
# 2.7 ms, mlp_step's forward; 256x512x512 2.3 -> 1.6; 128x784x512 2.1 -> 1.3; 64x784x512 0.86 -> 0.68; 32x784x512
# 0.55 -> 0.49 is noise; at a depth of 256, 512x256x512 1.66 -> 1.62 too)
PANEL_CONFLICT_ROW_BYTES = 2048
PANEL_CONFLICT_MIN_ROWS = 64
PANEL_CONFLICT_MIN_DEPTH = 257
# An AVX-512 host's L2 is 1 MiB or more per core (Zen 4 and 5; 2 MiB Sapphire Rapids): twice the rows of the block
# fit, and the 8-row x 2-vector tile's 16 FMAs per line pair of B hide an L3 hit where they don't, so there the copy
# pays from a depth of 1024 on (1 core of a Zen 5 host, 1 MiB 16-way L2, copy included, alternating in one process,
# panels -> B read in place: 256x784x512, mlp_step's forward, 796 -> 784 us and one kernel fewer; 256x640x512 666 ->
# 636; 128x784x512 421 -> 393; 64x784x512 225 -> 200; 512x512x512 1044 -> 1051; from 1024 not: 512x1024x512 2076 ->
# 2367, 256x1024x512 1087 -> 1080)
PANEL_CONFLICT_MIN_DEPTH_AVX512 = 1024
# x @ W.T (nn.Linear: W (N, K) stored row-major, both operands contiguous along K) is otherwise a tile of dot products
# (codegen/opt/heuristic.py: dot_tile), which re-reads its rows of x, 8 x K floats, for every pair of W's rows: from
# L1 while they fit (32 KiB from K = 1024 on), from L2 beyond; and folds 16 vector accumulators per tile (noise only
# over a long K). From the panels, a broadcast of x per step feeds 2 vectors of W.T, and each line of x serves 16
# steps. On 1 core of an AVX-512 host (Zen 5), copy included, GFLOPS against numpy's, alternating: 2048x1536x384
# 0.63 -> 1.05, 256x1536x384 0.71-0.76 -> 0.95-1.02, 512x1024x1024 0.89-0.94 -> 0.96-0.99, 2048x384x384 0.87-0.93
# -> 0.99-1.02, 2048x768x768 0.90-0.92 -> 1.04-1.06; not at 512x384x384 (0.91-0.94 -> 0.85) nor 256x768x768 (1.03-1.06
# -> 0.94-0.97): the copy, K x N, is no longer noise beside the product there
TRANSPOSED_PANEL_MIN_ROWS = 1024
TRANSPOSED_PANEL_DEEP = 1024  # depth from which the dot tile's rows of x fall out of L1: PANEL_MIN_ROWS rows suffice
# Where K is no whole number of vectors the dot tile loads across cache lines and adds a tail after its horizontal
# sums (see PADDED_DEPTH_MIN_MACS below); the panels have neither (a broadcast of x per step of K, 32 columns of W.T
# 128 bytes apart) and pay from PANEL_MIN_ROWS rows and ~25M multiply-adds on (1 AVX-512 core, copy included,
# alternating: 256x1001x256 0.90 -> 0.66 ms, 512x263x384 0.82 -> 0.54, 512x257x384 0.61 -> 0.53, 256x263x384
# 0.45 -> 0.35, 128x1001x256 0.48 -> 0.41, 512x129x384 0.35 -> 0.33; not 256x257x256 0.25 -> 0.28, 128x1001x128)
TRANSPOSED_PANEL_TAIL_MIN_MACS = 24 << 20


def _packs_right_operand(x: Tensor, w: Tensor) -> bool:
    """Whether x @ w reads w, (..., K, N), from a copy stored in column panels. Without it a register tile's
    column block walks B down K with a stride of N floats: a page per row of B, a power-of-two stride that maps
    every row to a few cache sets, so the block falls out of L2 (2048^3 on 2 cores of an AVX2 host: 398 ms; in
    panels 144 ms, the copy included; 1024^3 29 -> 18 ms). Below a page per row only where the rows are a 2 KiB
    multiple apart, B is deep and A has rows enough to share the copy (PANEL_CONFLICT_*: with AVX2, 512^3 and
    mlp_step's 256x784x512 yes, 512x256x512 no; with AVX-512 from a depth of 1024); from 64 rows of A where B is
    deep (PANEL_FEW_ROWS_*).
    Only float32 on the CPU backends: the tile is 32 floats wide there."""
    if x.ndim < 2 or w.ndim < 2 or not isinstance(w.device, str) or w.device.split(":")[0] != "CPU":
        return False
    if x.dtype != dtypes.float32 or w.dtype != dtypes.float32:
        return False
    m, (k, n) = _rows_per_matrix(x, w), w.shape[-2:]
    if not all(isinstance(v, int) for v in (m, k, n)) or n % PANEL or not _a_stored_matrix(w):
        return False
    if _contiguous_along_depth(w) and k >= PANEL_MIN_DEPTH:  # W.T: the dot tile's rows of x against the copy
        if m >= TRANSPOSED_PANEL_MIN_ROWS or (m >= PANEL_MIN_ROWS and k >= TRANSPOSED_PANEL_DEEP):
            return True
        if m >= PANEL_MIN_ROWS and m * k * n >= TRANSPOSED_PANEL_TAIL_MIN_MACS and k % _vector_lanes(w.device, 4):
            return True  # K no whole number of vectors: the dot tile's tail and misaligned rows (see above)
    row_bytes = n * w.dtype.itemsize
    if row_bytes < PANEL_MIN_ROW_BYTES:  # a 2 KiB multiple: the walk down K in a few cache sets (see above)
        wide = _vector_lanes(w.device, w.dtype.itemsize) * w.dtype.itemsize >= 64
        depth = PANEL_CONFLICT_MIN_DEPTH_AVX512 if wide else PANEL_CONFLICT_MIN_DEPTH
        return row_bytes % PANEL_CONFLICT_ROW_BYTES == 0 and m >= PANEL_CONFLICT_MIN_ROWS and k >= depth
    return (m >= PANEL_MIN_ROWS and k >= PANEL_MIN_DEPTH) or (m >= PANEL_FEW_ROWS and k >= PANEL_FEW_ROWS_MIN_DEPTH)


def _rows_per_matrix(x: Tensor, w: Tensor) -> int:
    """The rows of x that x @ w multiplies by each matrix of w: x's rows times x's batch dims that w broadcasts along
    (a Linear over (batch, seq, K) multiplies batch * seq rows by its one weight)."""
    rows = x.shape[-2]
    w_batch = w.shape[:-2]
    for i, d in enumerate(reversed(x.shape[:-2])):
        if i >= len(w_batch) or w_batch[-1 - i] == 1:
            rows = rows * d
    return rows


def _contiguous_along_depth(w: Tensor) -> bool:
    """Whether w, (K, N), is a stored (N, K) matrix seen transposed (nn.Linear's weight.T): contiguous along K, the
    reduce, as x is."""
    return _a_transposed_buffer(w)


def _a_transposed_buffer(t: Tensor) -> bool:
    """Whether t, 2-D, is a stored matrix seen transposed: a buffer through reshapes, then one permute (1, 0)."""
    u = t.uop
    if t.ndim != 2 or u.op is not Ops.PERMUTE or tuple(u.arg) != (1, 0):
        return False
    u = u.src[0]
    while u.op is Ops.RESHAPE:
        u = u.src[0]
    return u.op is Ops.BUFFER


ROW_PANEL = 16  # rows of A.T per panel: a 64-byte cache line of float32 per step of K
ROW_PANEL_MIN_ROW_BYTES = 4096  # A's rows (A.T's columns) a page or more apart: the walk down K in a few cache sets
ROW_PANEL_MIN_DEPTH = 128  # a shorter walk stays in L1 however it is laid out
ROW_PANEL_MIN_COLUMNS = 64  # columns sharing the copy: at 32, (2048, 2048).T @ (2048, 32) 3.6-4.1 -> 4.3 ms


def _packs_left_operand(x: Tensor, w: Tensor) -> bool:
    """Whether x @ w, x = A.T (M, K) with A (K, M) a stored matrix (a weight gradient's x.T @ g, attention's k.T @
    g), reads x from a copy stored in row panels (M/16, K, 16). In place, a register tile's rows of x are A's
    columns: each step down K reads a few floats of another row of A, M floats on. A page or more apart, those rows
    map to a few cache sets, so the walk down K falls out of L1 and L2, and half of each line is used before its
    eviction (the next row tile reads the other half). From the panels each step reads 16 floats of one line and the
    walk is sequential (1 core of an AVX-512 host, copy included: (2048, 2048).T @ (2048, 64) 6.4 -> 4.9 ms)."""
    if x.ndim != 2 or not _a_transposed_buffer(x) or not isinstance(x.device, str) or x.device.split(":")[0] != "CPU":
        return False
    if x.dtype != dtypes.float32 or w.dtype != dtypes.float32:
        return False
    (m, k), n = x.shape, w.shape[-1]
    if not all(isinstance(v, int) for v in (m, k, n)) or m % ROW_PANEL:
        return False
    return m * x.dtype.itemsize >= ROW_PANEL_MIN_ROW_BYTES and k >= ROW_PANEL_MIN_DEPTH and n >= ROW_PANEL_MIN_COLUMNS


def _stored_in_row_panels(x: Tensor) -> Tensor:
    """The same (M, K) operand, read from a copy laid out as (M/16, K, 16): each panel of 16 rows contiguous, a
    cache line per step of K."""
    m, k = x.shape
    panels = x.reshape(m // ROW_PANEL, ROW_PANEL, k).transpose(-1, -2).contiguous()
    return panels.transpose(-1, -2).reshape(m, k)


# x @ W.T's dot tile (codegen/opt/heuristic.py: dot_tile) loads a vector of K per step from each of its rows of x and
# of W. Where K is no multiple of the vector, its rows start inside vectors (loads that cross cache lines) and the
# K % lanes positions left over are a tail after the horizontal sums: one vector of its own where they are a power of
# two, else one scalar copy of the tile per position (K = 1001 with 16 lanes: 9 copies of 16 products). From copies of
# x and W whose rows are padded with zeros to a whole number of vectors, every load is aligned and there is no tail
# (0 * 0 adds 0: the sums are the same). The copies, O((M + N) * K) and two kernels more, pay where the tail's pieces
# (copies, or 1 vector) times M * N are more than (M + N) * K (TAIL_PIECES_PER_COPIED_DEPTH), from 2^26 multiply-adds
# on. 1 core of an AVX-512 host, copies included, alternating in one process: 1001^3 13.3 -> 9.4-9.7 ms,
# 512x1001x513 3.6 -> 2.8-2.9, 256x1001x256 0.93 -> 0.76-0.81, 512x263x513 1.12 -> 0.86, 1000x100x1000 1.57 -> 1.37,
# 1000x257x1000 3.17 -> 2.92; not at 512x257x513 (0.79 -> 0.82: one scalar copy over 16 vectors), 512x264x513
# (0.89 -> 0.93: the tail one vector), 512x129x513 0.44 -> 0.48, 256x257x256 0.24 -> 0.31, 128x1001x128 0.27 -> 0.30
PADDED_DEPTH_MIN_MACS = 1 << 26
TAIL_PIECES_PER_COPIED_DEPTH = 1.0


def _padded_depth(x: Tensor, w: Tensor) -> int:
    """The depth, K rounded up to a whole number of vectors, at which x @ w, w = W.T with W (N, K) a stored matrix
    (nn.Linear's weight), reads copies of x and W with their rows padded with zeros; 0 where it does not: K already a
    whole number of vectors, or a tail too cheap or a product too small to pay for the copies (see above), and where
    W.T is read from column panels (N a multiple of PANEL: `_packs_right_operand`, tried first)."""
    if x.ndim < 2 or not _contiguous_along_depth(w) or x.dtype != dtypes.float32 or w.dtype != dtypes.float32:
        return 0
    m, (k, n) = _rows_per_matrix(x, w), w.shape
    if not all(isinstance(v, int) for v in (m, k, n)) or m * k * n < PADDED_DEPTH_MIN_MACS:
        return 0
    if not (lanes := _vector_lanes(w.device, w.dtype.itemsize)) or not (tail := k % lanes):
        return 0
    pieces = 1 if tail & (tail - 1) == 0 else tail
    return -(-k // lanes) * lanes if m * n * pieces > TAIL_PIECES_PER_COPIED_DEPTH * (m + n) * k else 0


def _linear_gradients(g: Tensor, out: Tensor, x: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    """The gradients of x @ w, w = W.T (K, N) with W (N, K) stored, read from x and W themselves, not from the copies
    the product read (column panels, padded rows): g @ W, a matmul whose B is W row-major (N, K), and x.T @ g over
    all of x's rows. Through the copies, x's gradient reduced along the panels' split N, a tile of dot products of
    32 (256x1024x256 x @ W.T's backward on 1 AVX-512 core: 28 ms in panels, a few without)."""
    k, n = w.shape
    return g.dot(w.T), x.reshape(-1, k).T.dot(g.reshape(-1, n))


def _padded_along_depth(t: Tensor, depth: int) -> Tensor:
    """A copy of t whose last axis is padded with zeros to depth; its gradient is the gradient's first K columns."""
    k = t.shape[-1]
    copy = t.pad(((0, 0),) * (t.ndim - 1) + ((0, depth - k),)).contiguous()
    return with_gradient(copy, (t,), lambda g, out, src: (g[..., :k],))


NARROW_MAX_COLUMNS = 15  # fewer than two AVX2 vectors of float32: a vector along N is one vector and a tail
NARROW_MIN_ROWS = 64  # rows of A that share the copy
NARROW_MIN_DEPTH = 64  # a dot product of 8 vectors or more


def _transposes_right_operand(x: Tensor, w: Tensor) -> bool:
    """Whether x @ w reads w, (..., K, N) stored row-major with N narrow (a classifier's 10 outputs, not a multiple
    of 8), from a copy stored transposed, (..., N, K): the kernel is then a tile of dot products along K, both
    operands contiguous there, instead of one vector along N and a tail (codegen/opt/heuristic.py: dot_tile). The
    copy, N x K, is 1/M of the product; its gradient needs no kernel (the transposes cancel), and the gradient of x
    is then a matmul with B contiguous along its columns ((256, 10) @ (10, 512)), not a dot product of 10 (mlp_step's
    output layer, the kernels alone on 1 core of a Zen 3 host: h @ w 226 -> 46 us, g @ w.T 178 -> 55 us)."""
    if x.ndim < 2 or w.ndim < 2 or not isinstance(w.device, str) or w.device.split(":")[0] != "CPU":
        return False
    if x.dtype != dtypes.float32 or w.dtype != dtypes.float32:
        return False
    (m, k), n = x.shape[-2:], w.shape[-1]
    if not all(isinstance(v, int) for v in (m, k, n)):
        return False
    if n > NARROW_MAX_COLUMNS or n % 8 == 0 or m < NARROW_MIN_ROWS or k < NARROW_MIN_DEPTH:
        return False
    u = w.uop
    while u.op is Ops.RESHAPE:  # a buffer seen through reshapes only: stored row-major
        u = u.src[0]
    return u.op is Ops.BUFFER


def _a_stored_matrix(w: Tensor) -> bool:
    """Whether w is a buffer seen through reshapes, permutes, shrinks and flips (a weight, its transpose, a realized
    activation): not a computed value, whose copy would be its materialization, nor a broadcast (`Tensor.ones`,
    an expanded vector), whose reads are cheap where they repeat and which the copy would make a full matrix."""
    u = w.uop
    while u.op in (Ops.RESHAPE, Ops.PERMUTE, Ops.SHRINK, Ops.FLIP):
        u = u.src[0]
    return u.op is Ops.BUFFER


def _as_itself(copy: Tensor, w: Tensor) -> Tensor:
    """A copy of w in another layout, whose gradient is w's: handed straight to w, not through the copy's movement
    ops (each a gradient rule and Tensor ops at every backward: mlp_step's two copies cost more Python per step than
    their kernels saved)."""
    return with_gradient(copy, (w,), lambda g, out, x: (g,))


def _stored_in_column_panels(w: Tensor) -> Tensor:
    """The same (..., K, N) operand, read from a copy laid out as (..., N/32, K, 32): each panel of 32 columns
    contiguous (codegen/opt/heuristic.py tiles the columns 32 at a time and steps through the panels outside the
    row tiles, so one panel stays in L2 while every row of A passes it)."""
    *batch, k, n = w.shape
    panels = w.reshape(*batch, k, n // PANEL, PANEL).transpose(-3, -2).contiguous()
    return panels.transpose(-3, -2).reshape(*batch, k, n)


def _vector_lanes(device, itemsize: int) -> int:
    """How many elements of itemsize bytes a CPU device's vector holds (its renderer's width: 16 floats with AVX-512,
    8 with AVX2); 0 for other devices and tuples of devices."""
    if not isinstance(device, str) or device.split(":")[0] != "CPU":
        return 0
    from zeptograd.device import Device

    return Device[device].renderer.simd_bytes // max(itemsize, 1)
