"""A conv on a CPU with AVX-512 (16-float vectors, 32 registers).

- tensor/conv_layout.py: a large stride-1 conv whose output columns 16 lanes do not divide (ow = 56: 3 x 16 and 8 left)
  stores its weight with the output channels contiguous, as a strided conv does; with 8 lanes (AVX2), which divide
  56, it keeps one kernel.
- heuristic: the vector then goes along the output channels (full vectors divide them), not along the columns, where
  the register tile would take 8 lanes, half of each register;
- heuristic: a conv vectorized along its output channels (rows: output columns whose windows overlap) takes a tile of
  4 vectors x 4 rows with AVX-512's 32 registers; AVX2's 4 vectors x 2 rows (tests/codegen/test_conv_avx2.py);
- heuristic: the weight gradient's tile of dot products takes its 3-wide window column whole with AVX-512 too.

(8,64,56,56)x(64,64,3,3) pad 1 on an AVX-512 host, CPU time per call: 19 -> 9.5 ms (torch 14); stride 2 with 128
output channels, on both of 2 cores: 6.9 -> 5.9 ms."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from zeptograd import Context, Tensor
from zeptograd.codegen import full_rewrite, kernel_name, ranges_simplified
from zeptograd.codegen.opt import Opt, OptOps
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations
from zeptograd.codegen.opt.tiles import accumulator_budget, vector_registers
from zeptograd.renderer.llvmir import LLVMRenderer
from zeptograd.tensor import conv_layout, nn_ops
from zeptograd.uop.ops import Ops

rng = np.random.default_rng(0)
U, S = OptOps.UPCAST, OptOps.SWAP


def lanes(monkeypatch, n: int) -> None:
    """The CPU's vector as n floats wide, whichever host runs the test (the weight's layout follows it): on nn_ops,
    whose conv2d reads it."""
    monkeypatch.setattr(nn_ops, "_vector_lanes", lambda device, itemsize: n, raising=False)


def conv_items(cout: int, stride: int):
    x, w = Tensor.empty(8, 64, 56, 56), Tensor.empty(cout, 64, 3, 3)
    return x.conv2d(w, padding=1, stride=stride).schedule()


def conv_ast(cout: int, stride: int):
    (ast,) = [it.ast for it in conv_items(cout, stride) if any(u.op is Ops.REDUCE for u in it.ast.toposort())]
    return ranges_simplified(ast)


def test_stride1_conv_stores_its_weight_channels_last_where_16_lanes_leave_a_tail(monkeypatch):
    lanes(monkeypatch, 8)
    assert len(conv_items(64, 1)) == 1  # AVX2's 8 lanes divide the 56 columns: one kernel, as before
    lanes(monkeypatch, 16)
    copy, _ = conv_items(64, 1)  # the weight's channels-last copy, then the conv
    assert copy.bufs[0].size == 64 * 64 * 3 * 3
    x, w = Tensor.empty(8, 64, 64, 64), Tensor.empty(64, 64, 3, 3)
    assert len(x.conv2d(w, padding=1).schedule()) == 1  # 64 columns: 4 full vectors, no copy
    x, w = Tensor.empty(8, 1024, 14, 14), Tensor.empty(256, 1024, 1, 1)
    assert len(x.conv2d(w).schedule()) == 1  # a 1x1 conv: a matmul, its vector along the output positions


def test_avx2_narrow_convs_vectorize_along_output_channels(monkeypatch):
    """AVX2's 8 lanes and 14 (or 7) output columns: the weight channels-last too, and the vector along the output
    channels, 4 vectors x 2 rows (before: 8 lanes and a 6-lane tail along ow, or no vector at all for 7;
    measured as 8-lane code on an AVX-512 host, (8,256,14,14)x(256,256,3,3) 82 -> 43 ms, 7x7 850 -> 48; then 2
    vectors x tile_shape's rows, 14 as 5, 5 and 4, spilled with AVX2's 16 registers: 35 ms, 4 x 2 17 ms, compiled
    without AVX-512: tests/codegen/test_conv_avx2.py)."""
    lanes(monkeypatch, 8)
    for shape, cout, rows in (((8, 256, 14, 14), 256, 2), ((8, 512, 7, 7), 512, 2)):
        x, w = Tensor.empty(*shape), Tensor.empty(cout, shape[1], 3, 3)
        copy, conv = x.conv2d(w, padding=1).schedule()
        assert copy.bufs[0].size == w.numel()
        _, opts = hand_coded_optimizations(ranges_simplified(conv.ast), 32, threads=1)
        # axis 7: a block's 32 output channels (tensor/conv_layout.py: _output_channel_block), axis 1 the blocks
        assert opts[:3] == [Opt(U, 7, 8), Opt(U, 7, 4), Opt(U, 3, rows)]


def test_stride1_conv_tile_per_vector_width(monkeypatch):
    lanes(monkeypatch, 16)
    _, opts = hand_coded_optimizations(conv_ast(64, 1), 64, threads=1)
    # before: [UPCAST ow 8, UPCAST oh 4, UPCAST co 2, UNROLL kh 3, SWAP]: 8 accumulators of 8 lanes
    assert opts == [Opt(U, 1, 16), Opt(U, 1, 4), Opt(U, 2, 4)]  # 16 lanes of co x 4 vectors x 4 columns (ow)
    lanes(monkeypatch, 8)
    ast = conv_ast(64, 1)
    window_tile = [Opt(U, 3, 8), Opt(U, 2, 4), Opt(U, 1, 2), Opt(OptOps.UNROLL, 5, 3), Opt(S, 1, 3)]
    assert hand_coded_optimizations(ast, 32, threads=1)[1] == window_tile  # AVX2: as before
    assert hand_coded_optimizations(ast, 64, threads=1)[1] == window_tile  # the weight not stored channels-last


def test_stride2_conv_tile_per_vector_width(monkeypatch):
    lanes(monkeypatch, 16)
    ast = conv_ast(128, 2)
    # AVX-512: 4 vectors of co x 4 output columns (before: 2 x 4, 8 accumulators); AVX2: 4 x 2 (8 of its 12)
    # (axis 7: a block's 64 output channels, tensor/conv_layout.py: _output_channel_block; axis 1 the 2 blocks)
    assert hand_coded_optimizations(ast, 64, threads=1)[1] == [Opt(U, 7, 16), Opt(U, 7, 4), Opt(U, 3, 4)]
    assert hand_coded_optimizations(ast, 32, threads=1)[1][:3] == [Opt(U, 7, 8), Opt(U, 7, 4), Opt(U, 3, 2)]
    # a stride-2 1x1 conv's channels-last weight steps by 1 along the output channels and by cout along its input
    # channels (the reduce): no overlapping windows, and tile_shape's tile of 2 vectors x all 7 output columns (the
    # fewest tiles of at most 8 rows; 6 and a tail row: 1.55 -> 0.95 ms on 1 AVX-512 core)
    # (read in place: a large one stores its subsampled input first, tests/codegen/test_strided_pointwise_conv.py)
    monkeypatch.setattr(nn_ops, "_subsampled_pointwise_input", lambda *args: False)
    x, w = Tensor.empty(8, 1024, 14, 14), Tensor.empty(256, 1024, 1, 1)
    _, conv = x.conv2d(w, stride=2).schedule()
    _, opts = hand_coded_optimizations(ranges_simplified(conv.ast), 64, threads=1)
    assert opts == [Opt(U, 5, 16), Opt(U, 5, 2), Opt(U, 3, 7)]  # axis 5: a block's 64 output channels


def test_fourteen_and_seven_columns(monkeypatch):
    """ow = 14: 4 columns do not divide it, 2 do; the tile's other 2 rows of columns along the output rows (oh, whose
    windows overlap too): 4 vectors x 2 columns x 2 rows, 16 accumulators. (8,256,14,14)x(256,256,3,3) pad 1 on one
    core of an AVX-512 host: 116 ms before (2-lane vectors along ow), 4 x 2 27, 4 x 2 x 2 15.5 (torch 11). Where a
    block of 4 vectors of output channels holds over 512 KB of weight (256 x 9 input taps: 590 KB), blocks of 2
    (tensor/conv_layout.py: _output_channel_block), whose tile is 2 vectors x 7 columns: 8.6 -> 8.0 ms on 1 core."""
    lanes(monkeypatch, 16)
    x, w = Tensor.empty(8, 256, 14, 14), Tensor.empty(256, 256, 3, 3)
    (ast,) = [it.ast for it in x.conv2d(w, padding=1).schedule() if any(u.op is Ops.REDUCE for u in it.ast.toposort())]
    _, opts = hand_coded_optimizations(ranges_simplified(ast), 64, threads=1)
    assert opts == [Opt(U, 7, 16), Opt(U, 7, 2), Opt(U, 3, 7)]  # axis 7: a block's output channels
    # ow = 7: the row whole (before: no action at all, a scalar loop: 850 ms; blocks of 4 vectors, 4 x 4 columns and
    # a tail of 3: 12.3 ms; blocks of 2 (1.18 MB of weight in 4), 2 x 7: 8.9, torch 9.1)
    x, w = Tensor.empty(8, 512, 7, 7), Tensor.empty(512, 512, 3, 3)
    (ast,) = [it.ast for it in x.conv2d(w, padding=1).schedule() if any(u.op is Ops.REDUCE for u in it.ast.toposort())]
    _, opts = hand_coded_optimizations(ranges_simplified(ast), 64, threads=1)
    assert opts == [Opt(U, 7, 16), Opt(U, 7, 2), Opt(U, 3, 7)]


@pytest.mark.parametrize("cout, stride", [(64, 1), (128, 2)])
def test_the_tile_fits_avx512_registers(monkeypatch, cout, stride):
    lanes(monkeypatch, 16)
    ast = conv_ast(cout, stride)
    renderer = LLVMRenderer(simd_bytes=64)
    uops, opts = full_rewrite(ast, renderer)
    src = renderer.render(kernel_name(ast), uops).src
    assert set(re.findall(r"llvm\.fma\.(v\d+f32)", src)) == {"v16f32"}  # full 16-lane vectors
    assert set(re.findall(r"%acc\d+ = alloca (<\d+ x float>)", src)) == {"<16 x float>"}
    cols, rows = (o.arg for o in opts[1:3])
    accumulators = cols * rows  # per loop nest (the pad's border nests, peeled, each their own)
    assert len(re.findall(r"%acc\d+ = alloca", src)) % accumulators == 0
    assert accumulators == 16 <= accumulator_budget(64)
    # 16 accumulators, a weight vector per column and one broadcast input value: 21 of the 32 registers
    assert accumulators + cols + 1 <= vector_registers(64)


@pytest.fixture
def channels_last_16(monkeypatch):
    """Small convs take the 16-lane path too (the threshold keeps the copy off convs too small to pay a kernel)."""
    monkeypatch.setattr(conv_layout, "CHANNELS_LAST_MIN_MACS", 1)
    monkeypatch.setattr(conv_layout, "UNALIGNED_COLUMNS_CHANNELS_LAST_MIN_MACS", 1)
    lanes(monkeypatch, 16)


CASES = [
    (dict(padding=1), (2, 8, 9, 13), (32, 8, 3, 3)),
    (dict(padding=1), (1, 4, 6, 14), (64, 4, 3, 3)),  # 4 vectors x 2 columns x 2 rows
    (dict(padding=1), (1, 3, 5, 7), (64, 3, 3, 3)),  # 4 columns and a tail of 3
    (dict(padding=1, groups=2), (1, 8, 7, 10), (64, 4, 3, 3)),
    (dict(padding=2, dilation=2), (1, 4, 11, 12), (32, 4, 3, 3)),
    (dict(padding=(0, 1)), (1, 3, 6, 17), (32, 3, 3, 3)),
    (dict(), (1, 5, 9, 21), (32, 5, 5, 5)),
    (dict(padding=1), (2, 5, 23), (32, 5, 3)),  # 1-d
]


@pytest.mark.parametrize("kw, xs, ws", CASES)
@pytest.mark.parametrize("dev", ["CPU", "CPU:C", "NOOPT"])
def test_stride1_channels_last_values_match_torch(channels_last_16, kw, xs, ws, dev):
    xn, wn = rng.standard_normal(xs, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    conv = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d}[len(xs)]
    ref = conv(torch.from_numpy(xn), torch.from_numpy(wn), **kw).numpy()
    x, w = Tensor(xn), Tensor(wn)
    assert any(item.bufs[0].size == w.numel() for item in x.conv2d(w, **kw).schedule())  # the weight's copy
    with Context(NOOPT=int(dev == "NOOPT")):
        d = "CPU" if dev == "NOOPT" else dev
        got = x.to(d).conv2d(w.to(d), **kw).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_stride1_channels_last_gradients_match_torch(channels_last_16):
    xn, wn = rng.standard_normal((2, 6, 11, 14), dtype=np.float32), rng.standard_normal((32, 6, 3, 3), dtype=np.float32)
    x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
    assert len(x.conv2d(w, padding=1).schedule()) == 2  # the weight's copy, then the conv
    (x.conv2d(w, padding=1) ** 2).sum().backward()
    tx, tw = torch.from_numpy(xn).requires_grad_(), torch.from_numpy(wn).requires_grad_()
    (torch.nn.functional.conv2d(tx, tw, padding=1) ** 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_weight_gradient_takes_its_window_column_whole(monkeypatch):
    """The weight gradient's tile of dot products (over the output positions, 16 lanes along ow): its window column
    kx (3) whole x 4 output channels, 12 of AVX-512's 32 registers; before, 2 columns and a tail x 8 channels (25 ->
    11 ms per call on one core of an AVX-512 host). AVX2 keeps 3 x 2 channels x 2 input channels (12 of 16). Output
    columns that 16 lanes divide: where they leave a tail, the output gradient is read channels-last instead
    (tests/tensor/test_conv_gradient.py)."""
    lanes(monkeypatch, 16)
    x, w, g = Tensor.empty(8, 64, 32, 32), Tensor.empty(64, 64, 3, 3), Tensor.empty(8, 64, 32, 32)
    _, dw = x.conv2d(w, padding=1).gradient(x, w, gradient=g)
    asts = [ranges_simplified(it.ast) for it in dw.schedule() if any(u.op is Ops.REDUCE for u in it.ast.toposort())]
    (ast,) = [a for a in asts if kernel_name(a).startswith("r_8_64_64_3_3_32_32")]
    tiles = {64: [Opt(U, 4, 3), Opt(U, 1, 4)], 32: [Opt(U, 4, 3), Opt(U, 1, 2), Opt(U, 2, 2)]}
    for simd_bytes, tile in tiles.items():
        _, opts = hand_coded_optimizations(ast, simd_bytes, threads=1)
        assert opts[0] == Opt(OptOps.UNROLL, 6, simd_bytes // 4)  # the vector along ow
        assert opts[1:] == tile
