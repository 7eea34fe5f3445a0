"""A strided 1x1 conv (ResNet's downsample) stores its subsampled input first (tensor/conv_layout.py), then runs as a
stride-1 1x1 conv: a matmul whose vector goes along its output positions, read contiguously from the copy. Read in
place, the input stepped by the stride along every output position, so the vector went along the output channels
with a channels-last weight: (1,1024,14,14)x(2048,1024,1,1) stride 2 took 16 ms on one AVX-512 core (torch 1.7),
now 3.5; smaller ones unrolled the reduce: (1,1024,14,14)x(256,1024,1,1) 6.7 ms, now 0.5."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zeptograd import Context, Tensor
from zeptograd.codegen.opt import OptOps
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations
from zeptograd.codegen.simplify import simplify_ranges
from zeptograd.tensor import conv_layout
from zeptograd.uop.ops import Ops

rng = np.random.default_rng(0)


def data(*shape):
    x = rng.standard_normal(shape, dtype=np.float32)
    return Tensor(x), x


@pytest.mark.parametrize("simd_bytes", [32, 64])
def test_downsample_conv_is_a_matmul_along_the_output_positions(simd_bytes):
    x, w = Tensor.empty(1, 1024, 14, 14), Tensor.empty(2048, 1024, 1, 1)
    copy, conv = x.conv2d(w, stride=2).schedule()
    assert copy.bufs[0].size == 1024 * 7 * 7  # the subsampled input, stored
    assert x.numel() not in [b.size for b in conv.bufs] and copy.bufs[0].size in [b.size for b in conv.bufs]
    ast = simplify_ranges(conv.ast)
    sizes = [r.src[0].arg for r in sorted({r for r in ast.toposort() if r.op is Ops.RANGE}, key=lambda r: r.arg)]
    _, opts = hand_coded_optimizations(ast, simd_bytes, threads=1)
    # before: the vector along the 2048 output channels (a channels-last weight's copy), the input a broadcast
    assert opts[0].op is OptOps.UPCAST and sizes[opts[0].axis] == 49 and opts[0].arg == simd_bytes // 4
    # tiny strided ones read their input in place (0.2M multiply-adds: the copy's kernel would not pay); stride 1
    # already does; one with a window keeps the channels-last weight's copy
    assert len(Tensor.empty(1, 64, 14, 14).conv2d(Tensor.empty(64, 64, 1, 1), stride=2).schedule()) == 1
    assert len(x.conv2d(w).schedule()) == 1
    (weight_copy, _) = x.conv2d(Tensor.empty(2048, 1024, 3, 3), stride=2, padding=1).schedule()
    assert weight_copy.bufs[0].size == 2048 * 1024 * 9


CASES = [
    (dict(stride=2), (2, 16, 14, 15), (32, 16, 1, 1)),
    (dict(stride=(2, 1), padding=1), (1, 8, 9, 10), (24, 8, 1, 1)),
    (dict(stride=3, groups=2), (1, 8, 13, 21), (32, 4, 1, 1)),
    (dict(stride=2), (2, 5, 23), (16, 5, 1)),  # 1-d
]


@pytest.mark.parametrize("kw, xs, ws", CASES)
@pytest.mark.parametrize("dev", ["CPU", "CPU:C", "NOOPT"])
def test_strided_pointwise_conv_values_match_torch(monkeypatch, kw, xs, ws, dev):
    monkeypatch.setattr(conv_layout, "SUBSAMPLED_MIN_MACS", 1)  # small shapes take the copy too
    (x, xn), (w, wn) = data(*xs), data(*ws)
    conv = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d}[len(xs)]
    ref = conv(torch.from_numpy(xn), torch.from_numpy(wn), **kw).numpy()
    copy = x.conv2d(w, **kw).schedule()[-2]  # the subsampled input, stored (w's own rows are a multiple of its size)
    assert copy.bufs[0].size == np.prod(ref.shape[2:]) * xs[0] * xs[1] and len(copy.bufs) == 2
    with Context(NOOPT=int(dev == "NOOPT")):
        d = "CPU" if dev == "NOOPT" else dev
        got = x.to(d).conv2d(w.to(d), **kw).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_strided_pointwise_conv_gradients_match_torch(monkeypatch):
    monkeypatch.setattr(conv_layout, "SUBSAMPLED_MIN_MACS", 1)
    xn, wn = rng.standard_normal((2, 6, 11, 14), dtype=np.float32), rng.standard_normal((16, 6, 1, 1), dtype=np.float32)
    x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
    copy, _ = x.conv2d(w, stride=2).schedule()
    assert copy.bufs[0].size == 2 * 6 * 6 * 7  # the subsampled input, stored
    (x.conv2d(w, stride=2) ** 2).sum().backward()
    tx, tw = torch.from_numpy(xn).requires_grad_(), torch.from_numpy(wn).requires_grad_()
    (torch.nn.functional.conv2d(tx, tw, stride=2) ** 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)
