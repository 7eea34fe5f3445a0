"""Odd sizes at the speed of their power-of-two siblings: what each choice relies on, and values against numpy.

- a reduce of a size no d in 256..8 divides (2**24 + 3) is split all the same, its first (n//256)*256 elements as
  256 rows and the rest reduced beside their partials (schedule/split_reduce.py): two kernels, the first threaded,
  where it was one loop on one core;
- a matmul whose columns are an odd number of vectors (1000 = 125 x 8) takes a register tile whose columns leave a
  tail, after its rows, so the tail's loop nest is a tile of the same rows (codegen/opt/tiles.py:
  column_tail_tile), where it was 8 rows x 1 vector.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from zeptograd import Context, Tensor
from zeptograd.codegen import full_rewrite, kernel_name, ranges_simplified
from zeptograd.codegen.opt import Opt, OptOps
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations
from zeptograd.codegen.opt.tiles import column_tail_tile
from zeptograd.helpers import prod
from zeptograd.renderer.llvmir import LLVMRenderer
from zeptograd.tensor import matmul_layout
from zeptograd.uop.ops import AxisType, Ops

rng = np.random.default_rng(0)

PRIME = 131071  # no divisor in 256..8: 511 rows of 256 and 255 left over
CPU_DEVICES = ["CPU", "CPU:C"]


@pytest.fixture
def avx2_thread_threshold(monkeypatch):
    """The threading threshold these sizes were chosen at (1 << 15 loop iterations, set on an AVX2 host): the tests
    using it are about the split's code, not the threshold's value (renderer.MIN_THREAD_WORK)."""
    from zeptograd import device
    from zeptograd.codegen.opt import heuristic

    monkeypatch.setattr(heuristic, "MIN_THREAD_WORK", 1 << 15)
    monkeypatch.setattr(device, "MIN_THREAD_WORK", 1 << 15)


def kernels(t: Tensor) -> list:
    return [it.ast for it in t.schedule() if it.ast.op is Ops.SINK]


# ***** a big reduce of a size nothing divides: split with a tail *****


def test_a_prime_sized_sum_is_two_kernels_the_first_threaded(avx2_thread_threshold):
    x = Tensor(rng.standard_normal(PRIME, dtype=np.float32))
    first, second = kernels(x.sum())  # before: one kernel, a single loop of 131071 on one core
    out_first = next(u for u in first.toposort() if u.op is Ops.STORE)
    assert out_first.src[0].src[0].dtype.size == 256  # 256 partial sums of 511 elements each
    _, opts = hand_coded_optimizations(ranges_simplified(first), 32, threads=2)
    assert any(o.op is OptOps.THREAD for o in opts)
    # the second kernel reduces the 256 partials and the 255 elements left over
    sizes = sorted(r.src[0].arg for r in ranges_simplified(second).toposort() if r.op is Ops.RANGE)
    assert sizes == [PRIME % 256, 256]


def test_a_divisible_sum_keeps_its_split_without_a_tail():
    x = Tensor(rng.standard_normal(256 * 512, dtype=np.float32))
    _, second = kernels(x.sum())
    assert [r.src[0].arg for r in ranges_simplified(second).toposort() if r.op is Ops.RANGE] == [256]


@pytest.mark.parametrize("shape", [(1000, 1000), (4096, 4096), (1009, 1013)])
def test_a_full_reduce_of_a_matrix_is_split(shape, avx2_thread_threshold):
    """No single axis of these gives 256 rows of 256+: before, one loop on one core. Now the first axis's rows with
    the other axis ((4096, 4096): 256 x (16, 4096)), or, both sizes prime, the flat tensor's."""
    x = Tensor.empty(*shape)
    first, _ = kernels(x.sum())
    _, opts = hand_coded_optimizations(ranges_simplified(first), 32, threads=2)
    assert any(o.op is OptOps.THREAD for o in opts)


def test_batch_statistics_with_outputs_to_thread_are_not_split():
    """A batchnorm's mean over (N, H, W) has a channel per output: 64 outputs thread on their own, so its rows are
    not made of the other reduced axes (split, each statistic cost a second kernel: a ResNet block step 75 -> 98
    kernels, 5-10% slower); a full reduce of the same tensor still splits."""
    x = Tensor.empty(32, 64, 32, 32)
    assert len(kernels(x.mean((0, 2, 3)))) == 1
    assert len(kernels(x[:, :1].sum())) == 2


def test_a_reduce_whose_tail_would_be_large_is_not_split_so():
    # 1009 = 3 x 256 + 241: the part left over would be a quarter of the axis, on one core; the flat tensor instead
    (first, second) = kernels(Tensor.empty(1009, 1013).sum())
    assert [r.src[0].arg for r in ranges_simplified(first).toposort() if r.op is Ops.RANGE] == [256, 3992]
    assert sorted(r.src[0].arg for r in ranges_simplified(second).toposort() if r.op is Ops.RANGE) == [165, 256]


@pytest.mark.parametrize("device", CPU_DEVICES)
def test_split_matrix_reduces_match_numpy(device):
    a = rng.standard_normal((1009, 1013), dtype=np.float32)
    t = Tensor(a, device=device)
    np.testing.assert_allclose(t.sum().numpy(), a.astype(np.float64).sum(), rtol=1e-4, atol=1e-2)
    np.testing.assert_allclose(t.T.sum().numpy(), a.astype(np.float64).sum(), rtol=1e-4, atol=1e-2)
    assert t.max().item() == a.max() and t.T.min().item() == a.min()
    b = rng.standard_normal((3, 4099, 1013), dtype=np.float32)
    np.testing.assert_allclose(Tensor(b, device=device).sum().numpy(), b.astype(np.float64).sum(), rtol=1e-4, atol=0.1)
    np.testing.assert_allclose(
        Tensor(b, device=device).sum((1, 2)).numpy(), b.astype(np.float64).sum((1, 2)), rtol=1e-4
    )


def _reduces(x: Tensor) -> dict:
    return {
        "sum": x.sum(),
        "max": x.max(),
        "min": x.min(),
        "mean": x.mean(),
        "prod": (x * 0.001 + 1).prod(),
        "rows": x.reshape(1, -1).expand(3, -1).sum(1),
    }


def _want(a: np.ndarray) -> dict:
    a64 = a.astype(np.float64)
    return {
        "sum": a64.sum(),
        "max": a.max(),
        "min": a.min(),
        "mean": a64.mean(),
        "prod": np.prod(a64 * 0.001 + 1),
        "rows": np.full(3, a64.sum()),
    }


@pytest.mark.parametrize("device", CPU_DEVICES)
@pytest.mark.parametrize("noopt", [0, 1])
def test_prime_sized_reduces_match_numpy(device, noopt):
    a = rng.standard_normal(PRIME, dtype=np.float32)
    a[12345] = 7.5  # the max in the main part, the min in the part left over
    a[PRIME - 3] = -8.25
    with Context(NOOPT=noopt):
        got = {k: v.numpy() for k, v in _reduces(Tensor(a, device=device)).items()}
    for k, want in _want(a).items():
        np.testing.assert_allclose(got[k], want, rtol=1e-4, atol=1e-3, err_msg=k)


def test_a_nan_in_the_part_left_over_reaches_the_max_and_the_sum():
    a = rng.standard_normal(PRIME, dtype=np.float32)
    a[PRIME - 1] = np.nan
    assert np.isnan(Tensor(a).max().item()) and np.isnan(Tensor(a).sum().item())
    a[PRIME - 1], a[0] = 1.0, np.inf
    assert Tensor(a).max().item() == np.inf and Tensor(a).sum().item() == np.inf


# ***** a matmul whose columns are an odd number of vectors: a tile with a column tail *****


def matmul_kernel(m: int, k: int, n: int):
    a = Tensor(rng.standard_normal((m, k), dtype=np.float32))
    b = Tensor(rng.standard_normal((k, n), dtype=np.float32))
    (ast,) = kernels(a @ b)
    return ranges_simplified(ast)


def test_the_column_tail_tile_only_for_many_odd_vectors():
    assert column_tail_tile(32, 125, 1000) == (3, (4, 3, 2), True)  # AVX2: 4 rows x 3 vectors
    assert column_tail_tile(64, 63, 1000) == (2, (8, 6, 4, 2), False)  # AVX-512: 8 x 2, 8 rows if they divide or not
    assert column_tail_tile(32, 128, 1000) is None  # even: tile_shape's tile divides them
    assert column_tail_tile(32, 7, 1000) is None  # a conv's 56-wide rows: a tail would be 1/7 of them
    assert column_tail_tile(32, 125, 8) is None  # few rows


@pytest.mark.parametrize("simd_bytes,n,lanes,rows,cols", [(32, 1000, 8, 4, 3), (64, 1008, 16, 8, 2)])
def test_matmul_1000_tiles_rows_then_columns_with_a_tail(simd_bytes, n, lanes, rows, cols):
    ast = matmul_kernel(1000, 1000, n)  # 125 vectors of 8 (AVX2), 63 of 16 (AVX-512)
    sink, opts = hand_coded_optimizations(ast, simd_bytes, threads=1)
    upcasts = [(o.axis, o.arg) for o in opts if o.op is OptOps.UPCAST]
    # before: the lanes, then 8 rows x 1 vector; now the rows (axis 0) before the columns (axis 1)
    assert upcasts == [(1, lanes), (0, rows), (1, cols)]
    main, *tails = sink.src
    n_vectors = n // lanes
    assert len(tails) == (1 if n_vectors % cols else 0)
    for nest in (main, *tails):  # every nest is a tile of the same rows: its stores as many vectors
        expanded = {r.src[0].arg for r in nest.toposort() if r.op is Ops.RANGE and r.arg[1] is AxisType.UPCAST}
        assert rows in expanded
    if tails:
        tail_vectors = {r.src[0].arg for r in tails[0].toposort() if r.op is Ops.RANGE}
        assert n_vectors % cols in tail_vectors or n_vectors % cols == 1


def test_matmul_1000_renders_vector_fmas_in_every_nest():
    ast = matmul_kernel(1000, 1000, 1000)
    renderer = LLVMRenderer(simd_bytes=32)
    with Context(THREADS=1):  # (cores add a nest for the column tiles they do not divide)
        uops, _ = full_rewrite(ast, renderer)
    src = renderer.render(kernel_name(ast), uops).src
    assert set(re.findall(r"llvm\.fma\.(v\d+f32)", src)) == {"v8f32"}  # no scalar FMA: the tail is vectors too
    assert len(re.findall(r"alloca <8 x float>", src)) == 4 * 3 + 4 * 2  # 4x3 tile, its 4x2 tail tile


@pytest.mark.parametrize("device", CPU_DEVICES)
@pytest.mark.parametrize("noopt", [0, 1])
@pytest.mark.parametrize("shape", [(68, 40, 136), (70, 33, 200), (64, 16, 1000)])
def test_odd_vector_matmuls_match_numpy(device, noopt, shape):
    m, k, n = shape  # 17 vectors (4 x 3 and a 2-vector tail), 25 (a 1-vector tail; 70 rows: a row tail), 125
    an, bn = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    with Context(NOOPT=noopt):
        got = (Tensor(an, device=device) @ Tensor(bn, device=device)).numpy()
    np.testing.assert_allclose(got, an @ bn, rtol=1e-4, atol=1e-4)


# ***** B's rows 2 KiB apart: a column block's walk down K in a few cache sets, read from column panels *****


@pytest.mark.parametrize(
    "lanes,shape,panels",
    [
        (8, (512, 512, 512), True),
        (8, (512, 384, 512), True),
        (8, (256, 784, 512), True),  # mlp_step's forward
        (8, (64, 512, 512), True),
        (8, (32, 784, 512), False),  # too few rows to share the copy
        (8, (512, 256, 512), False),  # 256 rows of B (2 lines each) fit the L2's 64 sets x 8 ways
        # AVX-512 hosts (1 MiB of L2 or more per core): in place up to a depth of 1024
        (16, (256, 784, 512), False),  # mlp_step's forward
        (16, (512, 512, 512), False),
        (16, (512, 1024, 512), True),
        (16, (32, 1024, 512), False),
    ],
)
def test_a_2kib_row_stride_with_many_rows_and_depth_reads_column_panels(lanes, shape, panels, monkeypatch):
    monkeypatch.setattr(matmul_layout, "_vector_lanes", lambda device, itemsize: lanes * 4 // itemsize)
    m, k, n = shape
    a, b = Tensor(rng.standard_normal((m, k), dtype=np.float32)), Tensor(rng.standard_normal((k, n), dtype=np.float32))
    assert len(kernels(a @ b)) == (2 if panels else 1)  # B's copy in panels of 32 columns, then the matmul
    if panels:  # the tile takes a whole panel and steps through the panels outside the row tiles
        (_, ast) = kernels(a @ b)
        _, opts = hand_coded_optimizations(ranges_simplified(ast), 32, threads=1)
        assert [o.arg for o in opts if o.op is OptOps.UPCAST] == [8, 4, 3]


@pytest.mark.parametrize("device", CPU_DEVICES)
def test_a_512_matmul_from_panels_matches_numpy(device):
    an, bn = rng.standard_normal((512, 300), dtype=np.float32), rng.standard_normal((300, 512), dtype=np.float32)
    np.testing.assert_allclose(
        (Tensor(an, device=device) @ Tensor(bn, device=device)).numpy(), an @ bn, rtol=1e-4, atol=1e-4
    )


# ***** a product into 10 columns: the vector along the long axis, not one vector of the 10 and a tail *****


@pytest.mark.parametrize("n", [10, 13])
def test_a_product_into_few_columns_is_vectorized_along_the_long_axis(n):
    """h.T @ g, (512, 256) x (256, n) (mlp_step's output-layer weight gradient): the heuristic takes its vector
    along the 512 (8 lanes of h's rows), not along the n columns (8 lanes and a tail), and the expander keeps the
    8-lane range as the vector although the store and g are contiguous along the tile's 2 columns."""
    h = Tensor(rng.standard_normal((256, 512), dtype=np.float32))
    g = Tensor(rng.standard_normal((256, n), dtype=np.float32)) - 0.5  # computed (softmax - labels): not copied
    ast = kernels(h.T @ g)[-1]
    renderer = LLVMRenderer(simd_bytes=32)
    with Context(THREADS=1):
        uops, _ = full_rewrite(ast, renderer)
    src = renderer.render(kernel_name(ast), uops).src
    assert set(re.findall(r"llvm\.fma\.(v\d+f32)", src)) == {"v8f32"}  # before: v2f32, a 2-column vector
    hn, gn = h.numpy(), g.numpy()
    np.testing.assert_allclose((h.T @ g).numpy(), hn.T @ gn, rtol=1e-4, atol=1e-3)


# ***** a tile's leftovers: the columns left of the last vector and the rows left of the last tile *****


def _accumulators(nest, simd_bytes: int) -> int:
    """independent accumulators of a loop nest per reduce step: its expanded ranges' positions, a vector's lanes one"""
    from zeptograd.codegen.expander import vector_ranges
    from zeptograd.dtype import dtypes
    from zeptograd.uop.ops import UOp

    vectors = vector_ranges(UOp(Ops.SINK, dtypes.void, (nest,)), simd_bytes)
    return prod(
        r.src[0].arg for r in nest.toposort() if r.op is Ops.RANGE and r.arg[1] is AxisType.UPCAST and r not in vectors
    )


def _work(nest) -> int:
    return prod(r.src[0].arg for r in nest.toposort() if r.op is Ops.RANGE)


@pytest.mark.parametrize("simd_bytes", [32, 64])
@pytest.mark.parametrize("shape", [(513, 257, 513), (257, 257, 257), (1000, 1000, 1000)])
def test_a_column_tail_is_a_tile_of_rows(simd_bytes, shape):
    """The columns left of the last vector (513 = 32 x 16 + 1; 1000 = 62 x 16 + 8) for every row were one nest of one
    accumulator per output row: a chain of dependent multiply-adds per output (the 1 column of 513 took 17% of the
    kernel's time on one AVX-512 core). Every tail nest that covers a whole column of rows or more now takes rows as
    copies (tile_tail_nests): 4+ independent accumulators per reduce step."""
    m, k, n = shape
    sink, _ = hand_coded_optimizations(matmul_kernel(m, k, n), simd_bytes, threads=1)
    tails = [nest for nest in sink.src[1:] if any(u.op is Ops.REDUCE for u in nest.toposort())]
    assert tails and all(_accumulators(nest, simd_bytes) >= 4 for nest in tails if _work(nest) >= m * k)


@pytest.mark.parametrize("shape", [(500, 500, 500), (100, 512, 100), (300, 300, 300)])
def test_many_rows_take_8_row_tiles_with_avx512_whether_or_not_8_divides_them(shape):
    """500 rows: 8 x 2 and a tail of 4 rows (a tile of the same vectors), not 4 x 2 everywhere because 4 divides 500
    (1.6 -> 1.1 ms on one AVX-512 core, numpy 1.05)"""
    m, k, n = shape
    _, opts = hand_coded_optimizations(matmul_kernel(m, k, n), 64, threads=1)
    assert Opt(OptOps.UPCAST, 0, 8) in opts and Opt(OptOps.UPCAST, 0, 4) not in opts


def test_a_row_tail_of_one_row_takes_more_vectors():
    sink, _ = hand_coded_optimizations(matmul_kernel(513, 129, 512), 64, threads=1)  # 513 = 64 x 8 + 1 rows
    (main, row_tail) = sink.src
    assert _accumulators(main, 64) == 16 and _accumulators(row_tail, 64) == 8  # 1 row x 8 vectors (before: 2)


@pytest.mark.parametrize("simd_bytes,n", [(32, 1005), (64, 1005), (64, 1001)])
def test_a_column_tail_of_no_power_of_two_is_one_masked_vector(simd_bytes, n):
    """1005 = 125 x 8 + 5 (AVX2), 62 x 16 + 13 (AVX-512): the 5 or 13 columns left were as many scalar copies of
    each row (scalar FMAs); now one masked vector of 8 or 16 lanes x the tile's rows, where the renderer has masked
    loads and stores (LLVM); the C renderer, without them, keeps copies."""
    ast = matmul_kernel(64, 16, n)
    _, opts = hand_coded_optimizations(ast, simd_bytes, threads=1)
    assert opts[0] == Opt(OptOps.MASKED_UPCAST, 1, simd_bytes // 4)
    _, opts = hand_coded_optimizations(ast, simd_bytes, threads=1, masked_vectors=False)
    assert opts[0] == Opt(OptOps.UPCAST, 1, simd_bytes // 4)
    renderer = LLVMRenderer(simd_bytes=simd_bytes)
    with Context(THREADS=1):
        uops, _ = full_rewrite(ast, renderer)
    src = renderer.render(kernel_name(ast), uops).src
    lanes = f"v{simd_bytes // 4}f32"
    assert set(re.findall(r"llvm\.fma\.(\w+)\(", src)) == {lanes}  # no scalar FMA: the tail is vectors too
    assert f"llvm.masked.load.{lanes}" in src and f"llvm.masked.store.{lanes}" in src


ODD_MATMULS = [
    (1, 1, 1),
    (1, 257, 1),
    (1, 7, 33),  # 1 row
    (33, 7, 1),  # 1 column
    (9, 1, 17),  # K = 1
    (17, 3, 45),  # 2 vectors + 13 columns (AVX-512), 5 vectors + 5 (AVX2)
    (65, 257, 49),
    (100, 100, 100),
    (70, 33, 201),
    (130, 17, 131),
    (2, 9, 19, 23),  # batched
    (3, 65, 33, 65),
]


@pytest.mark.parametrize("device", CPU_DEVICES)
@pytest.mark.parametrize("noopt", [0, 1])
def test_odd_matmuls_match_numpy(device, noopt):
    for shape in ODD_MATMULS:
        *batch, m, k, n = shape
        an = rng.standard_normal((*batch, m, k), dtype=np.float32)
        bn = rng.standard_normal((*batch, k, n), dtype=np.float32)
        with Context(NOOPT=noopt):
            got = (Tensor(an, device=device) @ Tensor(bn, device=device)).numpy()
        np.testing.assert_allclose(got, an @ bn, rtol=1e-4, atol=1e-4, err_msg=str(shape))


def test_odd_matmuls_with_masked_tails_match_numpy_on_python():
    """the PYTHON device (masked vectors, lane by lane) runs the kernels with a masked column tail"""
    for shape in [(9, 5, 13), (17, 3, 45), (2, 9, 7, 23)]:
        *batch, m, k, n = shape
        an = rng.standard_normal((*batch, m, k), dtype=np.float32)
        bn = rng.standard_normal((*batch, k, n), dtype=np.float32)
        got = (Tensor(an, device="PYTHON") @ Tensor(bn, device="PYTHON")).numpy()
        np.testing.assert_allclose(got, an @ bn, rtol=1e-4, atol=1e-4, err_msg=str(shape))
