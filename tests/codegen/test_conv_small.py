"""Small stride-1 convs whose output columns the CPU's vector lanes do not divide (DenseNet's 7x7 and 14x14 growth
convs, SqueezeNet's 13x13 expand convs) store their weight channels-last too (tensor/conv_layout.py), so the vector
goes along the output channels. Read in place, their kernels took no optimizer action at all (scalar code) or a tile
of 2-lane pieces. On 1 AVX-512 core, batch 1, pad 1, per call (the weight's copy included): (1,128,7,7)x(32,128,3,3)
1.9 -> 0.25 ms, (1,64,13,13)x(256,64,3,3) 21 -> 0.52 ms (torch 0.09 and 0.62).
An odd axis shorter than the vector (a 13x13 pool's columns under 16 lanes) takes 8 lanes and a tail (heuristic)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zeptograd import Context, Tensor
from zeptograd.codegen import ranges_simplified
from zeptograd.codegen.opt import OptOps
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations, kernel_axes, max_trip_count
from zeptograd.tensor import nn_ops
from zeptograd.uop.ops import Ops

rng = np.random.default_rng(0)

SHAPES = [
    ((1, 128, 7, 7), (32, 128, 3, 3)),  # DenseNet-121's last dense block
    ((1, 128, 14, 14), (32, 128, 3, 3)),
    ((1, 64, 13, 13), (256, 64, 3, 3)),  # SqueezeNet's expand 3x3
    ((1, 48, 13, 13), (192, 48, 3, 3)),
]


@pytest.mark.parametrize("simd_bytes", [32, 64])
@pytest.mark.parametrize("xs, ws", SHAPES)
def test_small_conv_vectorizes_along_output_channels(monkeypatch, simd_bytes, xs, ws):
    lanes = simd_bytes // 4
    monkeypatch.setattr(nn_ops, "_vector_lanes", lambda device, itemsize: lanes)
    items = Tensor.empty(*xs).conv2d(Tensor.empty(*ws), padding=1).schedule()
    assert any(it.bufs[0].size == int(np.prod(ws)) for it in items)  # the weight's channels-last copy
    (ast,) = [ranges_simplified(it.ast) for it in items if any(u.op is Ops.REDUCE for u in it.ast.toposort())]
    _, opts = hand_coded_optimizations(ast, simd_bytes, threads=1)
    # before: [] (7x7, 13x13: scalar code) or 2-lane upcasts (14x14)
    assert opts and opts[0].op is OptOps.UPCAST and opts[0].arg == lanes
    channel_axis = kernel_axes(ast)[opts[0].axis]
    block = 4 * lanes if ws[0] > 4 * lanes else ws[0]  # the weight's blocks of output channels, or all of them
    assert max_trip_count(channel_axis) == block  # the vector along the output channels, not the columns
    assert len(opts) >= 3  # a register tile: more vectors of channels x output positions


@pytest.mark.parametrize("dev", ["CPU", "CPU:C", "NOOPT"])
@pytest.mark.parametrize("xs, ws", SHAPES[:3])
def test_small_conv_values_match_torch(xs, ws, dev):
    xn, wn = rng.standard_normal(xs, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    ref = torch.nn.functional.conv2d(torch.from_numpy(xn), torch.from_numpy(wn), padding=1).numpy()
    with Context(NOOPT=int(dev == "NOOPT")):
        d = "CPU" if dev == "NOOPT" else dev
        got = Tensor(xn, device=d).conv2d(Tensor(wn, device=d), padding=1).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)


def test_small_conv_gradients_match_torch():
    xn = rng.standard_normal((1, 128, 7, 7), dtype=np.float32)
    wn = rng.standard_normal((32, 128, 3, 3), dtype=np.float32)
    x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
    (x.conv2d(w, padding=1) ** 2).sum().backward()
    tx, tw = torch.from_numpy(xn).requires_grad_(), torch.from_numpy(wn).requires_grad_()
    (torch.nn.functional.conv2d(tx, tw, padding=1) ** 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-2)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-2)


@pytest.mark.parametrize("simd_bytes", [32, 64])
def test_odd_pooled_columns_take_8_lanes_and_a_tail(simd_bytes):
    """SqueezeNet's 3x3 stride-2 maxpool to 13x13: its 13 output columns take 8 lanes and a tail with AVX-512's 16 as
    with AVX2's 8; before, no divisor of 13 fit and the heuristic took no action (a scalar max chain: 0.36 -> 0.09 ms
    the kernel, on 1 AVX-512 core). The 5 columns left are one masked vector, not 5 scalar copies (0.095 -> 0.046 ms
    per call)."""
    (item,) = Tensor.empty(1, 256, 27, 27).max_pool2d(3, 2).schedule()
    ast = ranges_simplified(item.ast)
    _, opts = hand_coded_optimizations(ast, simd_bytes, threads=1)
    assert opts and opts[0].op is OptOps.MASKED_UPCAST and opts[0].arg == 8
    assert max_trip_count(kernel_axes(ast)[opts[0].axis]) == 13  # the output columns


@pytest.mark.parametrize("dev", ["CPU", "CPU:C", "NOOPT"])
def test_odd_pooled_columns_values_match_torch(dev):
    xn = rng.standard_normal((1, 32, 27, 27), dtype=np.float32)
    ref = torch.nn.functional.max_pool2d(torch.from_numpy(xn), 3, 2).numpy()
    with Context(NOOPT=int(dev == "NOOPT")):
        got = Tensor(xn, device="CPU" if dev == "NOOPT" else dev).max_pool2d(3, 2).numpy()
    np.testing.assert_allclose(got, ref)


@pytest.mark.parametrize("h", [7, 14])
def test_two_vectors_of_output_channels_take_7_output_columns(monkeypatch, h):
    """32 output channels with AVX-512: 2 vectors x 7 output columns (14 accumulators); before, 14 columns took
    tile_shape's 2 x 2 (the 14x14 conv's call 0.36 -> 0.30 ms on 1 core, ~0.15 of it dispatch)."""
    monkeypatch.setattr(nn_ops, "_vector_lanes", lambda device, itemsize: 16)
    items = Tensor.empty(1, 128, h, h).conv2d(Tensor.empty(32, 128, 3, 3), padding=1).schedule()
    (ast,) = [ranges_simplified(it.ast) for it in items if any(u.op is Ops.REDUCE for u in it.ast.toposort())]
    sink, opts = hand_coded_optimizations(ast, 64, threads=1)
    assert [(o.op, o.arg) for o in opts] == [(OptOps.UPCAST, 16), (OptOps.UPCAST, 2), (OptOps.UPCAST, 7)]
    assert max_trip_count(kernel_axes(ast)[2]) == h  # the output columns, the tile's rows
