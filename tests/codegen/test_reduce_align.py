"""A slice of a reduce's result, `x.mean(0)[:, 1:-1]`, reduces the aligned superset of its columns: the output loop is
shifted back to the vector boundary its loads start past, its extra lanes' stores gated off
(codegen/opt/align.py). Fused, the slice became an offset on the reduce's loads, so every vector read spanned two
cache lines on each of the reduce's iterations (1.2-1.5x the unfused kernels', which reduce every column and copy)."""

from __future__ import annotations

import numpy as np
import pytest

from zeptograd import Tensor
from zeptograd.codegen import full_rewrite, kernel_name, optimize
from zeptograd.helpers import Context
from zeptograd.renderer.llvmir import LLVMRenderer
from zeptograd.uop.ops import Ops
from zeptograd.uop.symbolic import split_sum

rng = np.random.default_rng(0)


def _kernel(t: Tensor):
    (item,) = t.schedule()
    return item.ast


@pytest.mark.parametrize("simd_bytes", [32, 64])
def test_sliced_reduce_loads_start_on_vector_boundaries(simd_bytes):
    lanes = simd_bytes // 4  # float32
    x = Tensor(rng.standard_normal((128, 128), dtype=np.float32)).realize()
    ast = _kernel(x.mean(0, keepdim=True)[:, 1:-1])
    renderer = LLVMRenderer(simd_bytes=simd_bytes)
    with Context(NOOPT=0):  # the heuristic's kernel (NOOPT makes no vectors, so nothing is aligned)
        sink, _ = optimize(ast, renderer)
        uops, _ = full_rewrite(ast, renderer)
    (load,) = [u.src[0] for u in sink.toposort() if u.op is Ops.LOAD]
    assert split_sum(load.src[1])[1] % lanes == 0  # the reduce reads columns from a vector boundary
    (store,) = [u.src[0] for u in sink.toposort() if u.op is Ops.STORE]
    assert len(store.src) == 3  # the superset's columns outside the slice are not stored
    src = renderer.render(kernel_name(ast), uops).src
    assert "masked.load" not in src  # 128 columns: whole vectors, no tail


@pytest.mark.parametrize("shape", [(128, 128), (33, 17), (40, 130), (16, 512), (7, 31)])
def test_sliced_reduce_values(shape):
    xn = rng.standard_normal(shape, dtype=np.float32)
    x = Tensor(xn).realize()
    cols = shape[1]
    for lo, hi in [(1, cols - 1), (1, cols), (3, cols), (7, cols - 5), (9, min(cols, 26)), (15, cols), (2, 5)]:
        if not lo < hi <= cols:
            continue
        np.testing.assert_allclose(
            x.mean(0, keepdim=True)[:, lo:hi].numpy(), xn.mean(0, keepdims=True)[:, lo:hi], rtol=1e-5, atol=1e-5
        )
        np.testing.assert_allclose(x.max(0)[lo:hi].numpy(), xn.max(0)[lo:hi])


def test_sliced_reduce_superset_cut_at_the_buffer_end():
    # 33 floats read as 2 rows of 16 from offset 1: the superset rounded to whole vectors would read past the end
    xn = rng.standard_normal(33, dtype=np.float32)
    x = Tensor(xn).realize()
    np.testing.assert_allclose(x[1:].reshape(2, 16).sum(0).numpy(), xn[1:].reshape(2, 16).sum(0), rtol=1e-5)
    np.testing.assert_allclose(x[3:].reshape(2, 15).sum(0).numpy(), xn[3:].reshape(2, 15).sum(0), rtol=1e-5)


def test_sliced_reduce_with_loads_after_the_reduce():
    # b[r] read once per output: gated with the stores (the superset's columns before the slice would be b[-1])
    xn, bn = rng.standard_normal((64, 128), dtype=np.float32), rng.standard_normal(126, dtype=np.float32)
    x, b = Tensor(xn).realize(), Tensor(bn).realize()
    np.testing.assert_allclose((x.sum(0)[1:-1] * b).numpy(), xn.sum(0)[1:-1] * bn, rtol=1e-4, atol=1e-4)
    yn = rng.standard_normal((3, 40, 48), dtype=np.float32)
    y = Tensor(yn).realize()
    np.testing.assert_allclose(y.max(1)[:, 1:47].numpy(), yn.max(1)[:, 1:47])
    np.testing.assert_allclose(
        (y.sum(1)[:, 5:45] + y[:, 0, 5:45]).numpy(), yn.sum(1)[:, 5:45] + yn[:, 0, 5:45], rtol=1e-4, atol=1e-4
    )
