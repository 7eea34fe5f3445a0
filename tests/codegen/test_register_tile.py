"""A matmul's register tile sized to the host's vector registers, and B read from column panels.

x @ w on the CPU backends reads a large w from a copy laid out in panels of 32 columns (tensor/matmul_layout.py); the
heuristic (codegen/opt/heuristic.py) tiles those 32 columns as 4 AVX2 vectors x 3 rows (12 accumulators of 16
registers) or 2 AVX-512 vectors x 8 rows (16 of 32), and steps through the panels outside the row tiles so one
panel stays in cache while every row of A passes it."""

from __future__ import annotations

import re

import numpy as np
import pytest

from zeptograd import Tensor
from zeptograd.codegen import full_rewrite, kernel_name, ranges_simplified
from zeptograd.codegen.opt import Opt, OptOps
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations
from zeptograd.codegen.opt.tiles import tile_shape
from zeptograd.renderer.llvmir import LLVMRenderer
from zeptograd.uop.ops import Ops

rng = np.random.default_rng(0)


def matmul_kernel(m: int, k: int, n: int):
    a = Tensor(rng.standard_normal((m, k), dtype=np.float32))
    b = Tensor(rng.standard_normal((k, n), dtype=np.float32))
    items = [it for it in (a @ b).schedule() if it.ast.op is Ops.SINK]
    (matmul,) = [it.ast for it in items if any(u.op is Ops.REDUCE for u in it.ast.toposort())]
    return ranges_simplified(matmul), len(items)  # the optimizer's input: the panel index split into its loops


def test_the_tile_fits_the_registers():
    # AVX2 (32-byte vectors, 16 registers): 4 vectors x 3 rows where rows are many, else at most 12 accumulators
    assert tile_shape(32, 128, 1024) == (4, (3,), False)
    assert tile_shape(32, 128, 28) == (2, (6, 4, 2), True)
    assert tile_shape(32, 7, 1024) == (1, (8, 6, 4, 2), True)
    assert tile_shape(32, 64, 10) == (2, (5,), False)  # 2 rows that divide: 4 accumulators, too few; 2 tiles of 5
    # AVX-512 (64-byte vectors, 32 registers): 2 vectors x up to 8 rows (16 accumulators)
    assert tile_shape(64, 64, 1024) == (2, (8, 6, 4, 2), False)  # 8 rows, their tail a tile of its own
    # few rows: the fewest tiles of at most 8, as even as they go (4 of 7, not 7 of 4: too few accumulators)
    assert tile_shape(64, 64, 28) == (2, (7,), False)
    assert tile_shape(64, 32, 10) == (2, (5,), False)


@pytest.mark.parametrize("simd_bytes,lanes,cols,rows", [(32, 8, 4, 3), (64, 16, 2, 8)])
def test_a_matmul_from_column_panels_tiles_a_whole_panel(simd_bytes, lanes, cols, rows):
    ast, n_kernels = matmul_kernel(1024, 256, 1024)
    assert n_kernels == 2  # B's copy in column panels, then the matmul
    _, opts = hand_coded_optimizations(ast, simd_bytes, threads=2)
    upcasts = [o.arg for o in opts if o.op is OptOps.UPCAST]
    assert upcasts == [lanes, cols, rows] and lanes * cols == 32  # the panel's 32 columns, all in registers
    # the panel loop (axis 1) outside the row tiles (axis 0): a panel stays in cache across every row tile
    assert Opt(OptOps.SWAP, 0, 1) in opts
    renderer = LLVMRenderer(simd_bytes=simd_bytes)
    uops, _ = full_rewrite(ast, renderer)
    src = renderer.render(kernel_name(ast), uops).src
    assert set(re.findall(r"llvm\.fma\.(v\d+f32)", src)) == {f"v{lanes}f32"}
    accumulators = {m for m in re.findall(r"%(acc\d+) = alloca", src)}
    assert len(accumulators) >= cols * rows


@pytest.mark.parametrize("simd_bytes,lanes,cols,rows", [(32, 8, 4, 3), (64, 16, 2, 8)])
def test_a_deep_linear_reads_its_weight_from_column_panels(simd_bytes, lanes, cols, rows):
    """x @ W.T over a depth of 1536 (a BERT layer's second Linear, (batch, seq, 1536) rows): W.T from a copy in
    column panels, tiled as A @ B is (a broadcast of x per step, the panel's vectors), not as a tile of dot
    products, which re-reads its 8 rows of x (48 KiB) from L2 for every pair of W's rows."""
    x = Tensor(rng.standard_normal((2, 64, 1536), dtype=np.float32))
    w = Tensor(rng.standard_normal((384, 1536), dtype=np.float32)).realize()
    items = [it for it in (x @ w.T).schedule() if it.ast.op is Ops.SINK]
    assert len(items) == 2  # W.T's copy in column panels, then the product
    (matmul,) = [it.ast for it in items if any(u.op is Ops.REDUCE for u in it.ast.toposort())]
    _, opts = hand_coded_optimizations(ranges_simplified(matmul), simd_bytes, threads=1)
    assert not any(o.op is OptOps.UNROLL for o in opts)  # no vector along the reduce: no dot products to fold
    assert [o.arg for o in opts if o.op is OptOps.UPCAST] == [lanes, cols, rows] and lanes * cols == 32


def test_panel_matmul_values_match_numpy():
    an = rng.standard_normal((300, 200), dtype=np.float32)  # 300 rows: 3-row tiles with no tail
    bn = rng.standard_normal((200, 1056), dtype=np.float32)  # 33 panels
    a, b = Tensor(an), Tensor(bn)
    np.testing.assert_allclose((a @ b).numpy(), an @ bn, rtol=1e-4, atol=1e-4)
    an = rng.standard_normal((257, 200), dtype=np.float32)  # a tail row
    np.testing.assert_allclose((Tensor(an) @ b).numpy(), an @ bn, rtol=1e-4, atol=1e-4)


def _reduce_kernel(t: Tensor):
    items = [it for it in t.schedule() if it.ast.op is Ops.SINK]
    (ast,) = [it.ast for it in items if any(u.op is Ops.REDUCE for u in it.ast.toposort())]
    return ranges_simplified(ast)


@pytest.mark.parametrize(
    "simd_bytes,expected",
    [
        # axes: cout, cin, ky, kx, n, oy, ox: 8 lanes along ox, kx's 3 columns x 2 cout rows x 2 cin columns
        (32, [(OptOps.UNROLL, 6, 8), (OptOps.UPCAST, 3, 3), (OptOps.UPCAST, 0, 2), (OptOps.UPCAST, 1, 2)]),
        # AVX-512's 32 registers: the 3 columns whole x 4 cout rows (before: 2 columns and a tail x 8 rows)
        (64, [(OptOps.UNROLL, 6, 16), (OptOps.UPCAST, 3, 3), (OptOps.UPCAST, 0, 4)]),
    ],
)
def test_a_conv_weight_gradient_tiles_its_three_window_columns(simd_bytes, expected):
    """The weight gradient of a 3x3 conv: dot products along the output columns, a tile of output channels x the
    window's 3 columns. With AVX2's 16 registers the 3 columns whole (no tail nest), 12 accumulators; before, 2
    columns and a tail x 8 rows spilled. Not 3 columns x 4 output channels: its 12 accumulators and the operands'
    3 + 1 vectors spilled an accumulator every step; 2 output channels x 2 input channels (`second_dot_column`: the
    output's gradient skips cin as it skips kx) keep 12 accumulators with 2 + 1 operand vectors ((32,64,32,32) x
    (64,64,3,3)'s weight gradient on one core of an AVX2 host, summed per image: 58 -> 38 ms)."""
    x = Tensor(rng.standard_normal((2, 64, 14, 56), dtype=np.float32))
    w = Tensor(rng.standard_normal((64, 64, 3, 3), dtype=np.float32), requires_grad=True)
    g = Tensor(rng.standard_normal((2, 64, 14, 56), dtype=np.float32))
    (gw,) = x.conv2d(w, padding=1).gradient(w, gradient=g)
    _, opts = hand_coded_optimizations(_reduce_kernel(gw), simd_bytes, threads=1)
    assert [(o.op, o.axis, o.arg) for o in opts[: len(expected)]] == expected


def test_a_weight_gradient_tile_of_two_input_channels_matches_torch():
    """The tile of 2 output x 2 input channels x 3 window columns: an odd number of input channels (a tail of the
    second column axis: none taken, it must be even), and an even one, against torch."""
    import torch

    for cin in (5, 6):
        xn = rng.standard_normal((2, cin, 9, 20), dtype=np.float32)
        wn = rng.standard_normal((8, cin, 3, 3), dtype=np.float32)
        gn = rng.standard_normal((2, 8, 9, 20), dtype=np.float32)
        w = Tensor(wn, requires_grad=True)
        (gw,) = Tensor(xn).conv2d(w, padding=1).gradient(w, gradient=Tensor(gn))
        tw = torch.from_numpy(wn).requires_grad_()
        torch.nn.functional.conv2d(torch.from_numpy(xn), tw, padding=1).backward(torch.from_numpy(gn))
        np.testing.assert_allclose(gw.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("simd_bytes,rows", [(32, 4), (64, 8)])
def test_a_linear_tile_keeps_to_the_registers(simd_bytes, rows):
    """x @ w.T as dot products (few rows: no column panels): 2 columns x 4 rows on AVX2 (2 x 8 spilled: 64x1024x
    1024 6.6 -> 3.9 ms), 2 x 8 on AVX-512."""
    x, w = (
        Tensor(rng.standard_normal((64, 256), dtype=np.float32)),
        Tensor(rng.standard_normal((512, 256), dtype=np.float32)),
    )
    _, opts = hand_coded_optimizations(_reduce_kernel((x.unsqueeze(-2) * w).sum(-1)), simd_bytes, threads=1)
    assert [o.arg for o in opts if o.op is OptOps.UPCAST][:2] == [2, rows]


@pytest.mark.parametrize("simd_bytes", [32, 64])
def test_a_3x3_conv_tiles_output_rows_sharing_the_window_rows_loads(simd_bytes):
    """A 3x3 conv vectorized along its 56 output columns (7 vectors of 8 lanes: no second vector column): the tile
    takes its columns along the output rows instead (4 rows, each a vector load of the input) x 2 output channels
    (each weight broadcast feeds the 4 rows), and unrolls the window's 3 rows, so 4 output rows read 6 input rows,
    not 12. Before: 8 output channels x 1 vector, 9 loads per 8 multiply-adds."""
    x = Tensor(rng.standard_normal((2, 16, 56, 56), dtype=np.float32))
    w = Tensor(rng.standard_normal((16, 16, 3, 3), dtype=np.float32))
    ast = _reduce_kernel(x.conv2d(w, padding=1))  # axes: n, cout, oh, ow, cin, kh, kw
    _, opts = hand_coded_optimizations(ast, simd_bytes, threads=1)
    assert opts[:4] == [
        Opt(OptOps.UPCAST, 3, 8),  # the vector: 8 output columns
        Opt(OptOps.UPCAST, 2, 4),  # the tile's columns: 4 output rows
        Opt(OptOps.UPCAST, 1, 2),  # its rows: 2 output channels
        Opt(OptOps.UNROLL, 5, 3),  # the window's rows, whole
    ]
    renderer = LLVMRenderer(simd_bytes=64)  # (no peeling there: one loop nest)
    uops, _ = full_rewrite(ast, renderer, opts)
    src = renderer.render(kernel_name(ast), uops).src
    input_loads = re.findall(r"call <8 x float> @llvm\.masked\.load\.v8f32", src)
    fmas = re.findall(r"call <8 x float> @llvm\.fma\.v8f32", src)
    assert (len(input_loads), len(fmas)) == (6, 24)  # per input channel and window column


def test_window_tile_values_match_torch():
    import torch

    for xs, ws in (((2, 6, 14, 24), (6, 6, 3, 3)), ((1, 3, 12, 56), (5, 3, 3, 3))):  # 3 vectors; 7, a channel tail
        xn, wn = rng.standard_normal(xs, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
        want = torch.nn.functional.conv2d(torch.from_numpy(xn), torch.from_numpy(wn), padding=1).numpy()
        np.testing.assert_allclose(Tensor(xn).conv2d(Tensor(wn), padding=1).numpy(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("simd_bytes,lanes", [(64, 16), (32, 8)])
def test_few_rows_tile_as_evenly_as_the_fewest_tiles_go(simd_bytes, lanes):
    """h.T @ g of a 10-class output layer's gradient, (512, 256) x (256, 10): the 10 classes are the tile's rows (g's
    broadcast values), h's columns its vectors. 5 rows x 2 vectors (10 accumulators, enough to hide the FMA
    latency), not the 2 rows that divide 10 with 8 of 8, 6, 4, 2 (4 accumulators, each FMA waits on the last)."""
    h = Tensor(rng.standard_normal((256, 512), dtype=np.float32))
    g = Tensor(rng.standard_normal((256, 10), dtype=np.float32))
    items = [it for it in (h.T @ g).schedule() if it.ast.op is Ops.SINK]
    (matmul,) = [it.ast for it in items if any(u.op is Ops.REDUCE for u in it.ast.toposort())]
    ast = ranges_simplified(matmul)
    _, opts = hand_coded_optimizations(ast, simd_bytes, threads=1)
    assert [o.arg for o in opts if o.op is OptOps.UPCAST] == [lanes, 2, 5]
    renderer = LLVMRenderer(simd_bytes=simd_bytes)
    uops, _ = full_rewrite(ast, renderer)
    src = renderer.render(kernel_name(ast), uops).src
    assert len(set(re.findall(r"%(acc\d+) = alloca", src))) >= 10
    np.testing.assert_allclose((h.T @ g).numpy(), h.numpy().T @ g.numpy(), rtol=1e-4, atol=1e-4)
