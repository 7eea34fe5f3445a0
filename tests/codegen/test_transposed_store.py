"""A register tile whose vector lanes step through its store by more than 1 (a conv's output channels, its output
stored NCHW) while an unrolled range of the tile writes consecutive elements (the output columns) is stored one
vector per lane, the tile transposed by shuffles (codegen/expander.py, `store_transposed`), not one float per
element: ResNet-50's stem at batch 1 wrote its 4 x 16 channels x 4 columns tile with 256 scalar stores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zeptograd import Context, Device, Tensor
from zeptograd.codegen import full_rewrite
from zeptograd.codegen.opt import Opt, OptOps
from zeptograd.engine.realize import schedule_tensors
from zeptograd.engine.schedule_cache import SCHEDULE_CACHE
from zeptograd.renderer.cstyle import CStyleRenderer
from zeptograd.renderer.llvmir import LLVMRenderer
from zeptograd.uop.ops import Ops, UOp

STEM = ((1, 3, 224, 224), (64, 3, 7, 7), 2, 3)  # ResNet-50's first conv: its weight stored channels-last


@pytest.fixture(params=[32, 64], ids=["avx2", "avx512"])
def simd_bytes(request, monkeypatch):
    """the kernels as an AVX2 host's (32-byte vectors) and an AVX-512 host's render them"""
    monkeypatch.setattr(Device["CPU"].renderer, "simd_bytes", request.param)
    return request.param


def conv_kernel(x: Tensor, w: Tensor, stride: int, padding: int) -> UOp:
    with Context(**{SCHEDULE_CACHE.key: 0}):
        items = [it for it in x.conv2d(w, stride=stride, padding=padding).schedule() if it.ast.op is Ops.SINK]
    return items[-1].ast  # the conv (the weight's channels-last copy runs first)


def global_store_lanes(uops: list[UOp]) -> list[int]:
    return [u.src[1].dtype.count for u in uops if u.op is Ops.STORE and u.src[0].src[0].op is Ops.DEFINE_GLOBAL]


def test_stem_conv_stores_vectors(simd_bytes):
    """The stem's vector goes along its 64 output channels (stride 2: no operand is contiguous along the columns),
    each lane's output 12544 elements from the next; its tile's columns (4 with AVX-512, 3 with AVX2: 2 + 1) are
    stored as one vector per channel (the tile's tail nests aside), so the kernel has fewer than 3 stores per 4
    elements (before: one per element)."""
    xs, ws, stride, padding = STEM
    ast = conv_kernel(Tensor.empty(*xs), Tensor.empty(*ws), stride, padding)
    uops, opts = full_rewrite(ast, Device["CPU"].renderer)
    lanes = global_store_lanes(uops)
    assert 4 * len(lanes) < 3 * sum(lanes) and max(lanes) > 1, (opts, lanes)


@pytest.mark.slow
def test_stem_conv_values(simd_bytes):
    rng = np.random.default_rng(0)
    xs, ws, stride, padding = STEM
    x, w = rng.standard_normal(xs, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    out = Tensor(x).conv2d(Tensor(w), stride=stride, padding=padding).numpy()
    ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), stride=stride, padding=padding).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("renderer", [LLVMRenderer(simd_bytes=64), LLVMRenderer(simd_bytes=32), CStyleRenderer()])
@pytest.mark.parametrize("columns, pieces", [(2, [2]), (4, [4]), (8, [8]), (7, [4, 2, 1]), (3, [2, 1])])
def test_transpose_stores_one_vector_per_lane(renderer, columns, pieces):
    """out = x.T + 1, lanes along out's rows (the rows of x apart) and `columns` copies along its columns: per lane
    one store of `columns` elements, in power-of-two pieces (given opts: the heuristic plays no part); the values
    are x.T + 1, on the LLVM and C renderers."""
    x = np.arange(columns * 8 * 64, dtype=np.float32).reshape(columns * 8, 64)
    (item,) = schedule_tensors([Tensor(x).T + 1])
    width = min(16, renderer.simd_bytes // 4) if isinstance(renderer, LLVMRenderer) else 8
    uops, _ = full_rewrite(item.ast, renderer, [Opt(OptOps.UPCAST, 0, width), Opt(OptOps.UPCAST, 1, columns)])
    assert sorted(global_store_lanes(uops)) == sorted(pieces * width)  # before: width * columns scalar stores
    # the kernel rendered here (not the heuristic's) runs, on the device of its renderer
    device = Device["CPU" if isinstance(renderer, LLVMRenderer) else "CPU:C"]
    program = device.build(renderer.render("transposed_store", uops))
    program(*[b.ptr for b in item.bufs])
    np.testing.assert_array_equal(item.bufs[0].numpy().reshape(64, columns * 8), x.T + 1)
