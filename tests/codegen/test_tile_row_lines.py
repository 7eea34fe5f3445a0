"""A register tile's rows whose broadcast loads share cache lines (codegen/opt/tiles.py: sharing_tile_row).

Attention's qkv weight gradient is x.T @ g with g read through a permute: (3, batch, heads, t, head_dim) viewed as
(batch*t, 3*heads*head_dim). Both heads and head_dim are output loops g's broadcast load can take rows along; the
innermost of the kernel's loops is heads, whose elements are 512 floats apart, so 4 rows loaded 4 cache lines per
reduce step. Rows along head_dim (stride 1) load one line (512x192x64 on 1 AVX-512 core: 140 -> 53 us)."""

from __future__ import annotations

import numpy as np
import pytest

from zeptograd import Tensor
from zeptograd.codegen import ranges_simplified
from zeptograd.codegen.opt.access import accesses, stride
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations
from zeptograd.uop.ops import AxisType, Ops, max_trip_count

rng = np.random.default_rng(0)
BATCH, HEADS, T, HEAD_DIM, DIM = 16, 4, 32, 16, 64
CACHE_LINE_BYTES = 64


def qkv_weight_gradient() -> tuple[Tensor, Tensor, Tensor]:
    g = Tensor(rng.standard_normal((3, BATCH, HEADS, T, HEAD_DIM), dtype=np.float32)).realize()
    x = Tensor(rng.standard_normal((BATCH * T, DIM), dtype=np.float32)).realize()
    return g, x, g.permute(1, 3, 0, 2, 4).reshape(BATCH * T, 3 * HEADS * HEAD_DIM).T @ x


@pytest.mark.parametrize("simd_bytes", [32, 64])
def test_tile_rows_of_a_permuted_operand_share_a_cache_line(simd_bytes):
    g, _, w_grad = qkv_weight_gradient()
    items = [it for it in w_grad.schedule() if it.ast.op is Ops.SINK]
    (ast,) = [it.ast for it in items if any(u.op is Ops.REDUCE for u in it.ast.toposort())]
    opt_ast, opts = hand_coded_optimizations(ranges_simplified(ast), simd_bytes, threads=1)
    (g_load,) = [u for u in accesses(opt_ast) if u.src[0].arg == 1]  # g: the rows' broadcast operand
    rows = [r for r in g_load.src[1].ranges if r.arg[1] is AxisType.UPCAST]
    assert len(rows) == 1, opts
    (row,) = rows
    assert max_trip_count(row) >= 4, opts
    # the rows are consecutive floats of g (head_dim), a tile's worth within one cache line, not 512 floats apart
    assert stride(g_load.src[1], row) == 1, opts
    assert max_trip_count(row) * g.dtype.itemsize <= CACHE_LINE_BYTES


def test_qkv_weight_gradient_values_match_numpy():
    g, x, w_grad = qkv_weight_gradient()
    ref = g.numpy().transpose(1, 3, 0, 2, 4).reshape(BATCH * T, -1).T @ x.numpy()
    np.testing.assert_allclose(w_grad.numpy(), ref, rtol=1e-4, atol=1e-3)
