"""Row statistics inside a register tile's rows (codegen/opt/heuristic.py: vectorize_own_loops). Attention with few keys
stores its scores in one kernel, and softmax(scores) @ v is the next: per query row the max and the sum of exp over
the keys, computed before the row's output columns, then the product with v, a register tile of query rows x vectors
of columns. The tile's rows are unrolled copies, not vector lanes: the max and the sum still get a vector along the
keys in each row copy. Left scalar loops (as when any expanded range kept a loop from a vector of its own), every exp
ran on one lane: (1, 2, 128, 32) against 32 keys on one AVX-512 core, 81 us for both kernels, 15 us unfused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zeptograd import Tensor
from zeptograd.codegen import ranges_simplified
from zeptograd.codegen.opt import OptOps, kernel_axes
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations
from zeptograd.codegen.opt.tiles import accumulator_budget
from zeptograd.uop.ops import AxisType, Ops

N_QUERIES, N_KEYS = 128, 32


def softmax_times_values(d: int, causal: bool):
    """The kernel after the scores': per query row a max and a sum over the keys, then the product with v."""
    q = Tensor.empty(1, 2, N_QUERIES, d)
    k, v = Tensor.empty(1, 2, N_KEYS, d), Tensor.empty(1, 2, N_KEYS, d)
    items = [it for it in q.scaled_dot_product_attention(k, v, is_causal=causal).schedule() if it.ast.op is Ops.SINK]
    ast = items[-1].ast
    assert sum(u.op is Ops.REDUCE for u in ast.toposort()) == 3  # the max, the sum, the product with v
    return ranges_simplified(ast)


# (vector bytes, head dim): a tile of rows x 2 vectors of columns with AVX-512's 16 lanes (32, 64), 4 rows x 2 of 3
# vectors with AVX2's 8 (48)
@pytest.mark.parametrize("simd_bytes, d", [(64, 32), (64, 64), (32, 48)])
@pytest.mark.parametrize("causal", [False, True])
def test_the_row_max_and_sum_are_vectors_in_each_row_copy(simd_bytes, d, causal):
    width = simd_bytes // 4
    sink, opts = hand_coded_optimizations(softmax_times_values(d, causal), simd_bytes, threads=1)
    rows = [o for o in opts if o.op is OptOps.UPCAST and o.axis == 1]
    assert rows and rows[0].arg > 1  # the tile's query rows
    # the max's and the sum's keys: a vector each, and accumulators (vectors per row copy) within the tile's budget
    assert sum(o.op is OptOps.UNROLL and o.arg == width for o in opts) == 2
    accumulators = [o.arg for o in opts if o.op is OptOps.UNROLL and o.arg < width]
    assert len(accumulators) == 2 and all(rows[0].arg * a <= accumulator_budget(simd_bytes) for a in accumulators)
    # the product's keys loop is left, with no vector of its own (its values move with the columns' vectors)
    assert N_KEYS in [r.src[0].arg for r in kernel_axes(sink) if r.arg[1] is AxisType.REDUCE]


@pytest.mark.parametrize("causal", [False, True])
def test_values_match_torch(causal):
    rng = np.random.default_rng(0)
    arrs = [rng.standard_normal(s).astype(np.float32) for s in [(1, 2, N_QUERIES, 32), *[(1, 2, N_KEYS, 32)] * 2]]
    got = Tensor(arrs[0]).scaled_dot_product_attention(*map(Tensor, arrs[1:]), is_causal=causal).numpy()
    want = torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, arrs), is_causal=causal).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
