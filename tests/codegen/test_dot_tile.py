"""The CPU heuristic's tile of dot products for A @ B.T (both operands contiguous along the reduce: nn.Linear's
x @ weight.T, attention's q @ k.T), and the vector axis chosen by how often each access runs."""

import re

import numpy as np
import pytest

from tests.slow import fast_first
from zeptograd import Context, Tensor
from zeptograd.codegen import full_rewrite, kernel_name
from zeptograd.codegen.opt import OptOps
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations
from zeptograd.renderer.cstyle import CStyleRenderer

rng = np.random.default_rng(0)


def data(*shape):
    x = rng.standard_normal(shape, dtype=np.float32)
    return Tensor(x), x


def dot_t(x: Tensor, w: Tensor) -> Tensor:
    """x @ w.T as the products summed over the shared last axis: the kernel this file's tile is for, without the
    column-panel copy that `@` reads a large right operand through (tensor/matmul_layout.py)."""
    return (x.unsqueeze(-2) * w).sum(-1)


def test_linear_gets_a_tile_of_vector_dot_products():
    (x, _), (w, _) = data(64, 48), data(32, 48)
    (item,) = (x @ w.T).schedule()
    _, opts = hand_coded_optimizations(item.ast, 64, threads=1)
    # before: UNROLL 16 then UNROLL 4 (four accumulators of one dot product); now rows x columns of dot products
    assert [o.op for o in opts] == [OptOps.UNROLL, OptOps.UPCAST, OptOps.UPCAST]
    assert opts[0].arg == 16 and {o.arg for o in opts[1:]} == {2, 8}
    uops, _ = full_rewrite(item.ast, CStyleRenderer(), opts)
    src = CStyleRenderer().render(kernel_name(item.ast), uops).src
    assert src.count("zg_floatx16 acc") == 16  # 8 rows x 2 columns of 16-lane accumulators
    # folded together after the loop (codegen/expander.py: _fold_lanes_packed): pairs' halves added, 8 + 4 + 2 + 1
    # 16-lane adds, then the 16 results are one vector (the epilogue's), stored as 8 rows of 2 columns
    assert len(re.findall(r"zg_floatx16 alu\d+ = \(vec\d+\+vec\d+\);", src)) == 15
    assert src.count("zg_floatx2 t_ = ") == 8 and "float alu" not in src  # no scalar lane math
    loop = src[src.rindex("for (") :]
    assert len(re.findall(r"memcpy\(&val\d+, \(data", loop)) == 10  # 8 row + 2 column vector loads feed 16 FMAs


def test_a_linear_over_few_rows_tiles_them_evenly():
    """x @ W.T over 10 rows of x (a small batch): 5 rows x 2 columns of dot products (10 accumulators hide the FMA
    latency), not the 2 rows that divide 10 with 8, 6, 4, 2 (4 accumulators, each FMA waiting on the last)."""
    (x, xn), (w, wn) = data(10, 512), data(384, 512)
    (item,) = (x @ w.T).schedule()
    _, opts = hand_coded_optimizations(item.ast, 64, threads=1)
    assert [o.arg for o in opts if o.op in (OptOps.UNROLL, OptOps.UPCAST)] == [16, 2, 5]
    uops, _ = full_rewrite(item.ast, CStyleRenderer(), opts)
    assert CStyleRenderer().render(kernel_name(item.ast), uops).src.count("zg_floatx16 acc") == 10
    np.testing.assert_allclose((x @ w.T).numpy(), xn @ wn.T, rtol=1e-4, atol=1e-4)


def test_attention_times_values_vectorizes_the_output_axis():
    """att @ v: the reduce (keys) is contiguous in att, the output (head dim) in v and in the store; every load inside
    the reduce runs equally often, so v's and the store's axis wins and att rows are the tile's rows."""
    (att, _), (v, _) = data(2, 3, 16, 16), data(2, 16, 3 * 32)
    out = att @ v.reshape(2, 16, 3, 32).transpose(1, 2)
    (item,) = out.schedule()
    _, opts = hand_coded_optimizations(item.ast, 64, threads=1)
    assert opts[0].op is OptOps.UPCAST and opts[0].arg == 16
    assert not any(o.op is OptOps.UNROLL for o in opts)


@pytest.mark.parametrize("shape", fast_first([(64, 48, 32), (37, 19, 23), (5, 100, 3), (2, 16, 1), (1, 64, 64)]))
@pytest.mark.parametrize("device", ["CPU", "CPU:C"])
def test_a_times_b_transposed_values(shape, device):
    m, k, n = shape
    (x, xn), (w, wn) = data(m, k), data(n, k)
    ref = xn @ wn.T
    got = (x.to(device) @ w.to(device).T).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    with Context(NOOPT=1):
        np.testing.assert_allclose((x.to(device) @ w.to(device).T).numpy(), ref, rtol=1e-4, atol=1e-4)


def test_batched_q_times_k_transposed_values():
    (q, qn), (k, kn) = data(2, 3, 20, 32), data(2, 3, 20, 32)
    np.testing.assert_allclose((q @ k.transpose(-2, -1)).numpy(), qn @ kn.transpose(0, 1, 3, 2), rtol=1e-4, atol=1e-4)


def test_tile_makes_an_outermost_block_loop():
    from zeptograd.codegen.opt import Opt, apply_opt, kernel_axes
    from zeptograd.uop.ops import AxisType, Ops

    (x, _), (w, _) = data(8, 4), data(12, 4)
    (item,) = (x @ w.T).schedule()
    before = [(r.arg[0], r.src[0].arg) for r in kernel_axes(item.ast)]
    assert before == [(0, 8), (1, 12), (2, 4)]
    after = apply_opt(item.ast, Opt(OptOps.TILE, 1, 3))
    # RANGE(12) -> RANGE'(4)*3 + RANGE(3), RANGE' nested outside the rows
    assert [(r.arg[0], r.src[0].arg) for r in kernel_axes(after)] == [(-1, 4), (0, 8), (1, 3), (2, 4)]
    end = next(u for u in after.toposort() if u.op is Ops.END)
    assert [r.arg[0] for r in end.src[1:]] == [-1, 0, 1]
    assert all(r.arg[1] is AxisType.LOOP for r in end.src[1:])


@pytest.mark.slow
def test_a_wide_weight_is_read_in_cache_blocks():
    """x @ w.T with w (1536, 384): 2.3 MB of w would be streamed from L3 once per row tile; TILE keeps a block of
    w's rows in L2 and the cores split the rows, not the blocks."""
    (x, xn), (w, wn) = data(64, 384), data(1536, 384)
    (item,) = (x @ w.T).schedule()
    _, opts = hand_coded_optimizations(item.ast, 64, threads=2)
    tile = [o for o in opts if o.op is OptOps.TILE]
    assert len(tile) == 1 and tile[0].arg * 2 * 384 * 4 <= 1 << 19
    thread = [o for o in opts if o.op is OptOps.THREAD]
    assert thread and thread[0].axis != 0  # axis 0 is the block loop
    np.testing.assert_allclose((x @ w.T).numpy(), xn @ wn.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("simd_bytes", [32, 64])
def test_vector_lanes_follow_the_accesses_run_most_often(simd_bytes):
    """x @ w.T with many columns: the store walks the 2 columns of a tile contiguously and its index spans
    2560*1536 elements, but the loads inside the reduce run 384 times as often: their reduce axis is the vector, as
    wide as the target's registers (before, counting index ranges only, the store won and the kernel ran 2-lane
    FMAs)."""
    from zeptograd.renderer.llvmir import LLVMRenderer

    (x, _), (w, _) = data(2560, 384), data(1536, 384)
    (item,) = dot_t(x, w).schedule()
    renderer = LLVMRenderer(simd_bytes=simd_bytes)
    uops, _ = full_rewrite(item.ast, renderer)
    src = renderer.render(kernel_name(item.ast), uops).src
    assert set(re.findall(r"llvm\.fma\.(v\d+f32)", src)) == {f"v{simd_bytes // 4}f32"}  # before: v2f32


@pytest.mark.parametrize("device", ["CPU", "CPU:C", "PYTHON"])
def test_tiled_kernel_runs_on_every_cpu_backend(device):
    """A TILE block loop has a negative axis id; every renderer names its loop variable."""
    (x, xn), (w, wn) = data(2 if device == "PYTHON" else 16, 384), data(1536, 384)  # the interpreter is slow
    (item,) = (x @ w.T).schedule()
    assert any(o.op is OptOps.TILE for o in hand_coded_optimizations(item.ast, 64, threads=2)[1])
    np.testing.assert_allclose((x.to(device) @ w.to(device).T).numpy(), xn @ wn.T, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_tile_columns_prefer_a_dividing_vector_when_a_tail_would_be_large():
    """conv's ow=56: two 16-lane vectors tile only 32 of the 56 columns (the tail nest gets no register tile);
    7 x 8 lanes tile them all (43 -> 15 ms here). A 1000-wide matmul tiles 992 with 16 lanes and keeps them."""
    from zeptograd.codegen.simplify import simplify_ranges

    (x, xn), (w, wn) = data(1, 8, 56, 56), data(16, 8, 3, 3)
    (item,) = x.conv2d(w, padding=1).schedule()
    _, opts = hand_coded_optimizations(simplify_ranges(item.ast), 64, threads=1)
    assert opts[0].op is OptOps.UPCAST and opts[0].arg == 8
    (a, _), (b, _) = data(8, 64), data(64, 1000)
    (item,) = (a @ b).schedule()
    _, opts = hand_coded_optimizations(simplify_ranges(item.ast), 64, threads=1)
    assert opts[0].op is OptOps.UPCAST and opts[0].arg == 16
    import torch

    ref = torch.nn.functional.conv2d(torch.from_numpy(xn), torch.from_numpy(wn), padding=1).numpy()
    np.testing.assert_allclose(x.conv2d(w, padding=1).numpy(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_strided_conv_gets_a_register_tile_over_gathered_input():
    """conv stride 2: no load is contiguous along ow (the input is read every other column) and the weights are
    contiguous only along kw=3. Before, 2 lanes of kw were chosen, refused, and the kernel ran scalar (237 ms on
    (8,64,56,56)x(128,64,3,3)); then ow got 4-lane vectors (4 divides 28) of gathered input feeding 8 output
    channels: 17 ms; now 8 lanes and a 4-lane tail, each lane pair loaded contiguously (test_strided_conv.py)."""
    from zeptograd.codegen.simplify import simplify_ranges

    (x, xn), (w, wn) = data(1, 8, 16, 16), data(16, 8, 3, 3)
    (item,) = x.conv2d(w, padding=1, stride=2).schedule()
    _, opts = hand_coded_optimizations(simplify_ranges(item.ast), 64, threads=1)
    ups = [o for o in opts if o.op is OptOps.UPCAST]
    assert len(ups) >= 2 and ups[0].arg == 8 and ups[1].arg == 8  # ow=8 in lanes, 8 output channels as rows
    import torch

    ref = torch.nn.functional.conv2d(torch.from_numpy(xn), torch.from_numpy(wn), padding=1, stride=2).numpy()
    for dev in ("CPU", "CPU:C"):
        got = x.to(dev).conv2d(w.to(dev), padding=1, stride=2).numpy()
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_column_sum_reads_rows_in_long_runs():
    """x.sum(0): the vector is along the output (columns) and the reduce walks rows 4 KB apart; with one 16-lane
    vector per row the kernel was latency-bound (4096x1024: 1.16 ms). It now takes 8 vectors (128 columns) of
    each row, into 8 independent accumulators (0.25-0.57 ms); 1003 columns: 8 vectors and a tail, its 11 columns left
    one masked vector."""
    from zeptograd import Context
    from zeptograd.codegen.simplify import simplify_ranges

    for cols in (1024, 1003):
        x, xn = data(64, cols)
        with Context(SPLIT_REDUCEOP=0):
            (item,) = x.sum(0).schedule()
        _, opts = hand_coded_optimizations(simplify_ranges(item.ast), 64, threads=1)
        first = OptOps.UPCAST if cols % 16 == 0 else OptOps.MASKED_UPCAST
        assert [(o.op, o.arg) for o in opts[:2]] == [(first, 16), (OptOps.UPCAST, 8)]
        for dev in ("CPU", "CPU:C"):
            np.testing.assert_allclose(x.to(dev).sum(0).numpy(), xn.sum(0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "program, v_shape",
    [
        (lambda x, v: (x + v).max(0), (16,)),  # the vector along the output's last axis
        (lambda x, v: (x * v).max((0, 2)), (256, 1, 1)),  # the vector along the reduce's last axis
    ],
    ids=["output_vector", "reduce_vector"],
)
@pytest.mark.parametrize("simd_bytes, rows", [(32, 4), (64, 8)])
def test_strided_reduce_over_a_short_vector_axis_takes_rows_that_continue_its_run(program, v_shape, simd_bytes, rows):
    """x (256, 256, 16) reduced over its first axis with a vector broadcast along an axis: the vector keeps the range
    rewrites from merging the last two axes (as they do for x + v stored first: 8 vectors of 8 lanes), so the
    16-wide vector axis was all the kernel took, one 64-byte line per step of the reduce at a 16 KiB stride (1.2-1.4
    ms on one AVX2 core against 0.6 ms for the unfused two kernels). Now rows of the middle axis, whose step
    continues the run in memory, make up 8 vectors (AVX2: 2 x 4 rows; AVX-512: 1 x 8): 0.25 ms."""
    from zeptograd.codegen.simplify import simplify_ranges
    from zeptograd.uop.ops import Ops

    xn = rng.standard_normal((256, 256, 16), dtype=np.float32)
    vn = rng.standard_normal(v_shape, dtype=np.float32)
    x, v = Tensor(xn), Tensor(vn)
    (item,) = program(x, v).schedule()
    ast = simplify_ranges(item.ast)
    _, opts = hand_coded_optimizations(ast, simd_bytes, threads=1)
    middle = next(r for r in ast.toposort() if r.op is Ops.RANGE and r.arg[0] == 0)  # the output's 256 rows
    assert middle.src[0].arg == 256 and (OptOps.UPCAST, 0, rows) in [(o.op, o.axis, o.arg) for o in opts], opts
    for dev in ("CPU", "CPU:C"):
        np.testing.assert_allclose(program(x.to(dev), v.to(dev)).numpy(), program(xn, vn), rtol=1e-5, atol=1e-5)
