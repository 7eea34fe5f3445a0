"""A conv on a CPU with AVX2 (8-float vectors, 16 registers), whichever host runs the test: the weight's layout is
given 8 lanes (nn_ops reads them) and the optimizer 32-byte vectors.

- heuristic: a conv whose channels-last weight tensor/conv_layout.py stored because 8 lanes do not divide its output
  columns (28: 3 vectors and 4 lanes left) takes its vector along the output channels, as with AVX-512's 16 lanes
  (tiles.py: full_vector_output_axis). Before, the vector stayed on the columns, the tile's rows were blocks of 32
  output channels (each a scalar weight load) and every input vector was gated by the pad: (8,128,28,28)x
  (128,128,3,3) pad 1 at 27 GFLOPS, 4x slower than at 14x14;
- heuristic: a conv vectorized along its output channels (its rows output columns whose windows overlap) takes 4
  vectors x 2 rows, 8 of the 12 accumulators AVX2's 16 registers leave, where tile_shape's 2 vectors took the rows
  that divide the columns (2 x 2 at 14 columns, 2 x 6 and a tail at 7); no second row of output rows (4 x 2 x 2:
  16 accumulators).

8-lane code on 1 core of an AVX-512 host compiling without AVX-512 (AVX2's 16 registers), CPU time, ms before ->
after: (8,128,28,28)x(128,128,3,3) 68 -> 18, (8,256,14,14)x(256,256,3,3) 31 -> 18, (8,512,7,7)x(512,512,3,3)
34 -> 20, stride 2 (8,128,28,28)x(256,128,3,3) 16.0 -> 9.5."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from zeptograd import Tensor
from zeptograd.codegen import ranges_simplified
from zeptograd.codegen.opt import Opt, OptOps
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations, kernel_axes
from zeptograd.codegen.opt.tiles import accumulator_budget
from zeptograd.tensor import nn_ops
from zeptograd.uop.ops import Ops

U = OptOps.UPCAST
LANES, SIMD_BYTES = 8, 32


@pytest.fixture
def avx2_lanes(monkeypatch):
    """The conv's layout for 8 lanes (tensor/conv_layout.py: the channels-last weight and its blocks of 32 output
    channels), whichever host runs the test."""
    monkeypatch.setattr(nn_ops, "_vector_lanes", lambda device, itemsize: LANES, raising=False)


def conv_opts(bs: int, cin: int, hw: int, cout: int, stride: int) -> tuple[int, list[Opt], int]:
    """(kernels, the conv kernel's actions, its last axis) of (bs,cin,hw,hw)x(cout,cin,3,3), pad 1: axes (n, blocks,
    oh, ow, cin, kh, kw, block), n gone with batch 1."""
    x, w = Tensor.empty(bs, cin, hw, hw), Tensor.empty(cout, cin, 3, 3)
    items = x.conv2d(w, padding=1, stride=stride).schedule()
    (ast,) = [it.ast for it in items if any(u.op is Ops.REDUCE for u in it.ast.toposort())]
    ast = ranges_simplified(ast)
    return len(items), hand_coded_optimizations(ast, SIMD_BYTES, threads=1)[1], len(kernel_axes(ast)) - 1


@pytest.mark.parametrize("bs", [1, 8, 32])
def test_28_columns_vectorize_along_output_channels(avx2_lanes, bs):
    kernels, opts, co = conv_opts(bs, 128, 28, 128, 1)
    assert kernels == 2  # the weight's channels-last copy (28 columns: 8 lanes leave 4), then the conv
    # the vector along a block's 32 output channels (co), 4 vectors x 2 output columns (ow, co - 4); before:
    # [UPCAST blocks 4, UPCAST ow 8], 8 lanes of columns x 4 blocks
    assert opts == [Opt(U, co, LANES), Opt(U, co, 4), Opt(U, co - 4, 2)]


@pytest.mark.parametrize(
    "cin, hw, cout, stride",
    [
        (256, 14, 256, 1),  # 14 output columns, before 2 vectors x 2
        (512, 7, 512, 1),  # 7, before 2 x 6 and a tail column
        (64, 56, 128, 2),  # 28, before 2 x 4
        (128, 28, 256, 2),  # 14, before 2 x 2
        (256, 14, 512, 2),  # 7, before 2 x 6 and a tail column
    ],
)
def test_sliding_window_tile_is_4_vectors_by_2_columns(avx2_lanes, cin, hw, cout, stride):
    kernels, opts, co = conv_opts(8, cin, hw, cout, stride)
    assert kernels == 2
    assert opts[:3] == [Opt(U, co, LANES), Opt(U, co, 4), Opt(U, co - 4, 2)]
    assert not any(o.op is U and o.axis == co - 5 for o in opts)  # no second row of output rows: 16 accumulators
    vectors, rows = opts[1].arg, opts[2].arg
    assert vectors * rows <= accumulator_budget(SIMD_BYTES)


def test_the_56_column_conv_keeps_its_vector_along_the_columns(avx2_lanes):
    # 8 lanes divide 56: one kernel, the weight read in place, the window tile along the columns as before
    kernels, opts, _ = conv_opts(8, 64, 56, 64, 1)
    assert kernels == 1
    assert opts[0] == Opt(U, 3, LANES)


CHECK = """
import numpy as np, torch
from zeptograd import Tensor
from zeptograd.tensor import conv_layout
from zeptograd.tensor.matmul_layout import _vector_lanes
avx = _vector_lanes("CPU", 4) == 8  # SIMD_BYTES=32 on a host with AVX (else the host's narrower vector)
conv_layout.UNALIGNED_COLUMNS_CHANNELS_LAST_MIN_MACS = conv_layout.CHANNELS_LAST_MIN_MACS = 1
rng = np.random.default_rng(0)
cases = [((1, 8, 6, 12), (64, 8, 3, 3), 1), ((2, 5, 7, 7), (64, 5, 3, 3), 1), ((1, 4, 9, 13), (32, 4, 3, 3), 1),
         ((1, 6, 10, 14), (64, 6, 3, 3), 2), ((1, 3, 13, 13), (32, 3, 3, 3), 2)]
for xs, ws, s in cases:
    xn, wn = rng.standard_normal(xs, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    x, w = Tensor(xn), Tensor(wn)
    assert not avx or len(x.conv2d(w, padding=1, stride=s).schedule()) == 2, (xs, ws)  # the channels-last weight
    ref = torch.nn.functional.conv2d(torch.from_numpy(xn), torch.from_numpy(wn), padding=1, stride=s).numpy()
    for dev in ("CPU", "CPU:C"):
        got = x.to(dev).conv2d(w.to(dev), padding=1, stride=s).numpy()
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
print("ok")
"""


def test_values_with_8_lane_vectors_match_torch():
    """The 4 x 2 tile with its tail column (7 and 13 columns) and its tail of output channels, rendered with 8
    lanes (SIMD_BYTES=32: an AVX2 host's kernels on any host with AVX)."""
    env = {**os.environ, "SIMD_BYTES": "32"}
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
