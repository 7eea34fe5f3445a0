"""A large strided conv stores its weight with the output channels contiguous (tensor/conv_layout.py), so codegen's
vector goes along the output channels: the weight is a contiguous vector load, the input (read every other column)
one broadcast value per row of the register tile, whose rows are output columns (codegen/opt/heuristic.py), and the
tile's border column, where the pad's gate differs between its rows, is peeled (codegen/peel.py). Before, the
vector went along the stride-2 output columns: a gather (two loads and a shuffle, masked at the border) feeding 8
output channels, each a scalar weight load: (8,64,56,56)x(128,64,3,3) at 2.3x torch's time on one core, now ~1.2x."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zeptograd import Context, Tensor
from zeptograd.codegen import full_rewrite
from zeptograd.codegen.opt import OptOps
from zeptograd.codegen.opt.access import stride
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations, kernel_axes, max_trip_count
from zeptograd.codegen.simplify import simplify_ranges
from zeptograd.renderer.cstyle import CStyleRenderer
from zeptograd.tensor import conv_layout, nn_ops
from zeptograd.uop.ops import AxisType, Ops

rng = np.random.default_rng(0)


def data(*shape):
    x = rng.standard_normal(shape, dtype=np.float32)
    return Tensor(x), x


@pytest.fixture
def small_threshold(monkeypatch):
    """Small shapes take the channels-last weight too (the threshold keeps it off convs too small to pay a kernel)."""
    monkeypatch.setattr(conv_layout, "CHANNELS_LAST_MIN_MACS", 1)
    monkeypatch.setattr(conv_layout, "UNALIGNED_COLUMNS_CHANNELS_LAST_MIN_MACS", 1)


def test_large_stride2_conv_vectorizes_along_output_channels(monkeypatch):
    (x, _), (w, _) = data(8, 64, 56, 56), data(128, 64, 3, 3)
    for lanes, simd_bytes in ((8, 32), (16, 64)):  # the weight's blocks of output channels follow the vector
        monkeypatch.setattr(nn_ops, "_vector_lanes", lambda device, itemsize, n=lanes: n)
        copy, conv = x.conv2d(w, padding=1, stride=2).schedule()
        assert copy.bufs[0].size == w.numel()  # the weight, stored channels-last
        ast = simplify_ranges(conv.ast)
        co = len(kernel_axes(ast)) - 1  # a block's output channels: (n, blocks, oh, ow, cin, kh, kw, block)
        assert max_trip_count(kernel_axes(ast)[co]) == 4 * lanes  # the lanes the conv was given (nn_ops reads them)
        sink, opts = hand_coded_optimizations(ast, simd_bytes, threads=1)
        # before: [UPCAST ow 8, UPCAST co 8 (rows), SWAP]: a gathered stride-2 input vector
        assert opts[0].op is OptOps.UPCAST and opts[0].axis == co and opts[0].arg == lanes  # co: a vector's lanes
        # 4 vectors of co x 2 (AVX2's 16 registers) or 4 (AVX-512's 32) output columns (rows)
        assert [(o.axis, o.arg) for o in opts[1:3]] == [(co, 4), (3, 2 if lanes == 8 else 4)]
    # the stride-1 conv keeps its vector along the output columns (its input is contiguous there): one kernel, where
    # the vector is 8 lanes (AVX2), which divide its 56 columns (16 lanes: tests/codegen/test_conv_avx512.py)
    monkeypatch.setattr(nn_ops, "_vector_lanes", lambda device, itemsize: 8)
    (item,) = x.conv2d(w[:64, :, :, :].contiguous().realize(), padding=1).schedule()
    _, opts = hand_coded_optimizations(simplify_ranges(item.ast), 32, threads=1)
    assert opts[0].axis == 3 and opts[0].arg == 8


def test_small_convs_keep_one_kernel():
    (x, _), (w, _) = data(2, 16, 18, 30), data(32, 16, 3, 3)
    assert len(x.conv2d(w, padding=1, stride=2).schedule()) == 1  # 2.4M multiply-adds: the copy would not pay
    x, w = Tensor.empty(8, 64, 112, 112), Tensor.empty(8, 64, 3, 3)
    assert len(x.conv2d(w, padding=1, stride=2).schedule()) == 1  # 115M, but 8 output channels: not two vectors


def test_weight_is_a_vector_load_and_the_input_a_broadcast(small_threshold):
    (x, _), (w, _) = data(1, 8, 9, 56), data(32, 8, 3, 3)
    copy, conv = x.conv2d(w, padding=(0, 1), stride=2).schedule()  # only the columns padded: one gate
    uops, opts = full_rewrite(conv.ast, CStyleRenderer(), None)
    loads = [u for u in uops if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.DEFINE_GLOBAL]
    size = {u: u.src[0].src[0].dtype.size for u in loads}
    weight = [u.dtype.count for u in loads if size[u] == w.numel()]
    inputs = [u.dtype.count for u in loads if size[u] == x.numel()]
    assert weight and set(weight) == {CStyleRenderer().simd_bytes // 4}  # contiguous vector loads, no gather
    assert inputs and set(inputs) == {1}  # one value broadcast across the output channels' lanes
    gated = [u for u in loads if size[u] == x.numel() and len(u.src[0].src) > 2]
    ungated = [u for u in loads if size[u] == x.numel() and len(u.src[0].src) == 2]
    assert gated and ungated  # the border column's rows are gated, the interior's (peeled) are not


def test_peel_splits_the_border_column_of_the_tile(small_threshold):
    from zeptograd.codegen.peel import peel_borders
    from zeptograd.uop.symbolic import symbolic
    from zeptograd.uop.upat import graph_rewrite

    (x, _), (w, _) = data(1, 8, 9, 56), data(32, 8, 3, 3)
    _, conv = x.conv2d(w, padding=1, stride=2).schedule()
    sink, opts = hand_coded_optimizations(simplify_ranges(conv.ast), 32, threads=1)
    sink = graph_rewrite(sink, symbolic)
    peeled = peel_borders(sink, 32)
    # before: one nest (a conv's gated input meets its ungated weight); now the first output-column tile and the rest
    assert len(sink.src) == 1 and len(peeled.src) == 2
    assert all(any(r.arg[1] is AxisType.UPCAST for r in n.toposort() if r.op is Ops.RANGE) for n in peeled.src)


CASES = [
    (dict(stride=2, padding=1), (2, 16, 18, 30), (32, 16, 3, 3)),
    (dict(stride=2, padding=1, groups=2), (1, 8, 13, 21), (32, 4, 3, 3)),
    (dict(stride=(1, 2), padding=(0, 2)), (1, 3, 9, 20), (16, 3, 3, 5)),
    (dict(stride=3, padding=1, dilation=2), (1, 4, 15, 17), (24, 4, 3, 3)),
    (dict(stride=2), (2, 5, 23), (16, 5, 3)),  # 1-d
    # blocks of output channels (4 vectors: 32 or 64 channels), stride 1 at 7x7, groups, dilation, odd sizes
    (dict(padding=1), (1, 8, 7, 7), (128, 8, 3, 3)),
    (dict(stride=2, padding=1, groups=2), (2, 6, 9, 11), (256, 3, 3, 3)),
    (dict(padding=(2, 1), dilation=(2, 1)), (1, 5, 7, 13), (192, 5, 3, 3)),
    (dict(stride=2, padding=1), (1, 4, 13, 6), (128, 4, 3, 2)),
]


@pytest.mark.parametrize("kw, xs, ws", CASES)
@pytest.mark.parametrize("dev", ["CPU", "CPU:C", "NOOPT"])
def test_channels_last_conv_values_match_torch(small_threshold, kw, xs, ws, dev):
    (x, xn), (w, wn) = data(*xs), data(*ws)
    conv = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d}[len(xs)]
    ref = conv(torch.from_numpy(xn), torch.from_numpy(wn), **kw).numpy()
    assert any(item.bufs[0].size == w.numel() for item in x.conv2d(w, **kw).schedule())  # the weight's copy
    with Context(NOOPT=int(dev == "NOOPT")):
        d = "CPU" if dev == "NOOPT" else dev
        got = x.to(d).conv2d(w.to(d), **kw).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_channels_last_conv_gradients_match_torch(small_threshold):
    xn, wn = rng.standard_normal((2, 6, 11, 14), dtype=np.float32), rng.standard_normal((16, 6, 3, 3), dtype=np.float32)
    x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
    (x.conv2d(w, padding=1, stride=2) ** 2).sum().backward()
    tx, tw = torch.from_numpy(xn).requires_grad_(), torch.from_numpy(wn).requires_grad_()
    (torch.nn.functional.conv2d(tx, tw, padding=1, stride=2) ** 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_the_weight_copy_reads_its_rows_in_blocks():
    """The channels-last copy of a (2048, 1024) 1x1 weight (a strided conv's channels-last weight) stores along
    cout and reads along cin: each of a vector's lanes reads a row 4 KiB from the next. Unblocked, one output row
    walked all 2048 rows of the read (a page per lane, 9.3 ms on 2 AVX2 cores); in blocks (TILE) of
    TRANSPOSE_BLOCK_ROWS rows, the outer loop walks a block's rows, each line read for 16 steps (1.4 ms)."""
    (w, wn) = data(2048, 1024, 1, 1)
    copy = conv_layout._stored_output_channels_last(w.realize(), 1).contiguous().schedule()[0]  # the channels-last copy
    _, opts = hand_coded_optimizations(simplify_ranges(copy.ast), 32, threads=2)  # AVX2: 8 lanes
    assert opts[0].op is OptOps.UPCAST and opts[0].arg == 8
    assert [(o.op, o.arg) for o in opts if o.op is OptOps.TILE] == [(OptOps.TILE, 2)]  # 16 rows: 2 vectors
    # a copy whose reads are contiguous along its vector takes no block
    (item,) = [i for i in (w.reshape(2048, 1024) + 1).schedule() if i.ast.op is Ops.SINK]
    _, opts = hand_coded_optimizations(simplify_ranges(item.ast), 32, threads=2)
    assert not any(o.op is OptOps.TILE for o in opts)
    last = w.reshape(1, 2048, 1024, 1, 1).permute(0, 2, 3, 4, 1).contiguous()
    np.testing.assert_array_equal(last.numpy(), np.moveaxis(wn.reshape(1, 2048, 1024, 1, 1), 1, -1))


@pytest.mark.parametrize("simd_bytes", [32, 64])
def test_a_3x3_weight_copy_reads_its_rows_in_blocks_of_one_vector_with_16_lanes(simd_bytes):
    """ResNet-50's (512,512,3,3) weight copied cout-last, every call of a batch-1 inference: each of a vector's
    lanes reads a row 18 KiB from the next. AVX2's 8 lanes take TILE blocks of 2 vectors (16 rows); AVX-512's 16
    lanes are such a block already, and their loop goes outermost (SWAP), so the inner loop walks one block's rows
    rather than all 512 of them at every input column (a page per lane: 3.3 -> 0.7 ms on 1 AVX-512 core, the
    conv's copy and kernel 5.3 -> 2.3 ms)."""
    w, wn = data(512, 512, 3, 3)
    copy = conv_layout._stored_output_channels_last(w.realize(), 1).contiguous().schedule()[0]
    ast = simplify_ranges(copy.ast)
    lanes = simd_bytes // 4
    _, opts = hand_coded_optimizations(ast, simd_bytes, threads=1)
    assert opts[0].op is OptOps.UPCAST and opts[0].arg == lanes
    expected = [(OptOps.TILE, 2)] if lanes == 8 else [(OptOps.SWAP, 1)]  # (the vector's loop is axis 1 of (4608, 512))
    assert [(o.op, o.arg) for o in opts[1:]] == expected
    if lanes == 16:  # the vector's loop outermost, the cores then splitting the rows of each block
        _, opts = hand_coded_optimizations(ast, simd_bytes, threads=2)
        assert [o.op for o in opts] == [OptOps.UPCAST, OptOps.SWAP, OptOps.THREAD] and opts[2].axis == 1
    last = conv_layout._stored_output_channels_last(w, 1)
    np.testing.assert_array_equal(last.numpy(), wn)
    moved = w.permute(1, 2, 3, 0).contiguous()
    np.testing.assert_array_equal(moved.numpy(), np.transpose(wn, (1, 2, 3, 0)))


@pytest.mark.parametrize("lanes, simd_bytes", [(8, 32), (16, 64)])
def test_the_channels_last_weight_is_stored_in_blocks_of_a_tiles_output_channels(monkeypatch, lanes, simd_bytes):
    """ResNet-50's (1,256,14,14)x(256,256,3,3): the channels-last weight in blocks of 4 vectors of output channels,
    (blocks, cin, kh, kw, block), the blocks' loop outermost, so a register tile reads its weight as one contiguous
    stream rather than 4 vectors of every cout-long row (1 AVX-512 core, the kernel: 2.1 -> 1.2 ms, torch 1.1). With
    16 lanes, whose block of 4 vectors would hold 590 KB of weight (over 512 KB), blocks of 2 vectors."""
    monkeypatch.setattr(nn_ops, "_vector_lanes", lambda device, itemsize: lanes)
    x, w = Tensor.empty(1, 256, 14, 14), Tensor.empty(256, 256, 3, 3)
    copy, conv = x.conv2d(w, padding=1).schedule()
    assert copy.bufs[0].size == w.numel()
    block = (2 if lanes == 16 else 4) * lanes
    ast = simplify_ranges(conv.ast)
    axes = kernel_axes(ast)
    assert [max_trip_count(r) for r in axes] == [256 // block, 14, 14, 256, 3, 3, block]
    (weight,) = [u for u in ast.toposort() if u.op is Ops.INDEX and u.src[0].dtype.size == w.numel()]
    assert [stride(weight.src[1], r) for r in axes] == [256 * 9 * block, 0, 0, 9 * block, 3 * block, block, 1]
    _, opts = hand_coded_optimizations(ast, simd_bytes, threads=1)
    assert (opts[0].op, opts[0].axis, opts[0].arg) == (OptOps.UPCAST, 6, lanes)
    if simd_bytes == 64:  # AVX-512's tile takes the block whole: 2 vectors x 7 columns
        assert [(o.axis, o.arg) for o in opts[1:]] == [(6, 2), (2, 7)]
    # fewer output channels than two blocks: one block, the plain channels-last layout
    monkeypatch.setattr(conv_layout, "CHANNELS_LAST_MIN_MACS", 1)
    monkeypatch.setattr(conv_layout, "UNALIGNED_COLUMNS_CHANNELS_LAST_MIN_MACS", 1)
    x, w = Tensor.empty(1, 64, 14, 14), Tensor.empty(block, 64, 3, 3)
    _, conv = x.conv2d(w, padding=1).schedule()
    assert [max_trip_count(r) for r in kernel_axes(simplify_ranges(conv.ast))] == [block, 14, 14, 64, 3, 3]


def test_blocked_channels_last_conv_gradients_match_torch(small_threshold):
    xn, wn = rng.standard_normal((2, 6, 7, 9), dtype=np.float32), rng.standard_normal((128, 6, 3, 3), dtype=np.float32)
    x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
    (x.conv2d(w, padding=1) ** 2).sum().backward()
    tx, tw = torch.from_numpy(xn).requires_grad_(), torch.from_numpy(wn).requires_grad_()
    (torch.nn.functional.conv2d(tx, tw, padding=1) ** 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("lanes", [8, 16])
def test_a_window_of_one_column_and_more_rows_stores_its_weight_channels_last(monkeypatch, lanes):
    """A stride-1 conv of taps (2, 1) (a strided conv's input-gradient phase: tensor/conv_layout.py:
    _transposed_conv_in_phases) whose columns the lanes do not divide: the weight stored channels-last, as a 3x3's
    (before, only a window wider than one column was, and the conv's vector went along 28 = 16 + 12 columns)."""
    monkeypatch.setattr(nn_ops, "_vector_lanes", lambda device, itemsize: lanes)
    x, w = Tensor.empty(8, 128, 28, 28), Tensor.empty(64, 128, 2, 1)
    copy, conv = x.conv2d(w, padding=(0, 0, 0, 1)).schedule()
    assert copy.bufs[0].size == w.numel()
    x, w = Tensor.empty(8, 128, 28, 28), Tensor.empty(64, 128, 1, 1)  # a 1x1 conv is a matmul: read in place
    assert len(x.conv2d(w).schedule()) == 1
