"""Attention in one kernel (schedule/policy.py: `row_buffer_request`, `first_reduce`, `reduces_below`;
schedule/cost.py: `row_buffer_is_cheaper`, `expands`). Per query row: the scores (a dot product over d per key) are
computed into a row buffer in their max's loop, exp(score - max) into a second one in its sum's loop, and the product
with v reads that one: no N x N buffer is ever written to memory, and the division by the sum comes after the product
(tensor/nn_ops.py: scaled_dot_product_attention). Only where the scores' buffer would exceed
`EXPANDED_BUFFER_BYTES` (below it the stored scores' tiled matmul is faster): the tests of the one-kernel path lower
that bound to 0 (the `one_kernel` fixture) to exercise it on small shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zeptograd import Context, Device, GlobalCounters, Tensor
from zeptograd.codegen import full_rewrite
from zeptograd.codegen.opt import OptOps
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations
from zeptograd.engine.schedule_cache import SCHEDULE_CACHE
from zeptograd.schedule import cost
from zeptograd.schedule.policy import MaterializationPolicy
from zeptograd.uop.ops import Ops

rng = np.random.default_rng(0)


@pytest.fixture
def one_kernel(monkeypatch):
    """Every scores buffer counts as over the memory bound: the one-kernel path at any size (the schedule cache off,
    so no schedule made under the default bound is reused)."""
    monkeypatch.setattr(cost, "EXPANDED_BUFFER_BYTES", 0)
    with Context(**{SCHEDULE_CACHE.key: 0}):
        yield


def kernels(t: Tensor) -> list:
    with Context(**{SCHEDULE_CACHE.key: 0}):  # the policy is patched in some tests: schedule again each time
        return [item for item in t.schedule() if item.ast.op is Ops.SINK]


def row_buffer_sizes(ast) -> list[int]:
    return sorted(u.dtype.size for u in ast.toposort() if u.op is Ops.DEFINE_REG and u.dtype.size > 1)


def count(ast, op) -> int:
    return sum(u.op is op for u in ast.toposort())


def sdpa(shape, causal, device="CPU"):
    q, k, v = (Tensor.empty(*shape, device=device) for _ in range(3))
    return q.scaled_dot_product_attention(k, v, is_causal=causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 2048, 64), (2, 3, 256, 32)])
def test_one_kernel_and_no_n_by_n_buffer(shape, causal, one_kernel):
    """One kernel; its buffers are the output and q, k, v (each B*H*N*d elements), nothing of N x N; inside it two
    row buffers of N floats (the scores row and the exp row), exp computed once per score."""
    (item,) = kernels(sdpa(shape, causal))
    b, h, n, d = shape
    assert [buf.size for buf in item.bufs] == [b * h * n * d] * 4
    assert row_buffer_sizes(item.ast) == [n, n]
    assert count(item.ast, Ops.EXP2) == 1


def test_the_decision_before_and_after(monkeypatch, one_kernel):
    """Before (no reduce in a row buffer's fill: the scores row costs a load, and its contraction is decided on its
    own): the scores are stored, an N x N buffer written by a tiled matmul kernel and read by a second kernel. After:
    the scores' contraction is computed in their row buffer's fill, one kernel. The walk's decisions: the scores
    (the scale's MUL) and the exp are row-buffered, the q @ k.T reduce is inlined into the scores' fill."""
    n = 256
    decided: dict = {}
    orig = MaterializationPolicy.row_buffer_request

    def spy(self, x, reqs):
        fill = orig(self, x, reqs)
        if fill is not None:
            decided[x.op] = (self.rf.red_ranges, fill, set(self.row_fill_reduces))
        return fill

    monkeypatch.setattr(MaterializationPolicy, "row_buffer_request", spy)
    (after,) = kernels(sdpa((1, 1, n, 64), False))
    assert set(decided) == {Ops.EXP2, Ops.MUL}
    (fill_reduce,) = decided[Ops.MUL][2]
    assert fill_reduce.op is Ops.REDUCE_AXIS and fill_reduce.tensor_shape == (1, 1, n, n, 1)  # q @ k.T
    assert row_buffer_sizes(after.ast) == [n, n]
    monkeypatch.setattr(MaterializationPolicy, "reduces_below", lambda self, x, fill: set())
    before = kernels(sdpa((1, 1, n, 64), False))
    assert len(before) == 2
    assert n * n in [buf.size for item in before for buf in item.bufs]
    assert row_buffer_sizes(before[1].ast) == [n]  # the exp row only


def test_scores_no_larger_than_q_and_k_are_stored():
    """Where the scores are no larger than q and k together (N <= 2d) the memory cliff is not there: the cost model
    weighs the stored scores (a tiled matmul) against the row buffer and stores them; exp stays row-buffered."""
    items = kernels(sdpa((1, 2, 64, 64), True))
    assert len(items) == 2
    assert sum(count(item.ast, Ops.EXP2) for item in items) == 1


def test_the_exp_row_is_filled_in_its_sum_not_in_the_product_with_v(one_kernel):
    """exp is read in two reduces over the keys: its sum (per query row) and the product with v (per query row and
    output column). The sum's loop runs first (fewer loops around it), so it fills the row buffer; the product's
    loop loads it, after the sum's REDUCE."""
    (item,) = kernels(sdpa((1, 1, 128, 16), False))
    nodes = list(item.ast.toposort())
    exp = next(u for u in nodes if u.op is Ops.EXP2)
    stores = [u for u in nodes if u.op is Ops.STORE and u.src[0].src[0].op is Ops.DEFINE_REG]
    fill_stores = [u for u in stores if exp in u.toposort()]
    assert len(fill_stores) == 1
    buf = fill_stores[0].src[0].src[0]
    loads = [u for u in nodes if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.AFTER and u.src[0].src[0].src[0] is buf]
    (load,) = loads
    sum_reduce = load.src[0].src[0].src[1]
    assert sum_reduce.op is Ops.REDUCE and sum_reduce.arg is Ops.ADD and exp in sum_reduce.toposort()


def test_the_output_columns_are_independent_accumulators(one_kernel):
    """The product with v runs per query row over the head dimension's vectors: each vector accumulates a reduce over
    the keys, so the head dimension is upcast past one vector (8 lanes x 8 with AVX2's 32 bytes): independent
    multiply-add chains (codegen/opt/heuristic.py: vectorize_own_loops, reduces_along)."""
    (item,) = kernels(sdpa((1, 1, 256, 64), False))
    _, opts = hand_coded_optimizations(item.ast, 32, threads=1)
    upcasts = [o for o in opts if o.op is OptOps.UPCAST]
    assert [o.arg for o in upcasts] == [8, 8]


def test_the_exp_loop_is_vectorized(one_kernel):
    """The exp loop reads the scores row and fills the exp row, both row buffers, and no buffer in memory: it gets a
    vector of its own (codegen/opt/heuristic.py: vectorize_own_loops counts row-buffer accesses, as the expander's
    choose_vector_ranges does), so LLVM computes exp2 as a vector polynomial, not one libm call per score."""
    (item,) = kernels(sdpa((1, 1, 256, 64), True))
    uops, _ = full_rewrite(item.ast, Device["CPU"].renderer)
    src = Device["CPU"].renderer.render("k", uops).src
    assert "@llvm.exp2.f32(float" not in src


def reference(arrs, causal):
    return torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, arrs), is_causal=causal).numpy()


@pytest.mark.parametrize("device", ["CPU", "CPU:C", "PYTHON", "CL"])
def test_values_match_torch(device, one_kernel):
    """Odd lengths (a vector tail in each row loop), several heads; PYTHON at small sizes. CL builds no row buffer
    (a GPU's output loops are threads): several kernels there, the same values."""
    if device == "CL":
        pytest.importorskip("pyopencl")
    shapes = [(1, 2, 40, 8), (2, 1, 24, 8)] if device == "PYTHON" else [(1, 2, 300, 16), (2, 2, 197, 64)]
    for shape in shapes:
        arrs = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
        for causal in (False, True):
            GlobalCounters.reset()
            q, k, v = (Tensor(a, device=device) for a in arrs)
            got = q.scaled_dot_product_attention(k, v, is_causal=causal).numpy()
            np.testing.assert_allclose(got, reference(arrs, causal), rtol=1e-5, atol=2e-6, err_msg=str(shape))
            if device == "CL":
                assert GlobalCounters.kernel_count > 1
            else:
                assert GlobalCounters.kernel_count == 1


@pytest.mark.parametrize("device", ["CPU", "CPU:C"])
def test_values_under_noopt(device, one_kernel):
    """No optimizer actions: the scores' dot product is a reduce loop nested in the max's loop (codegen/prefetch.py
    hints no load of a nested reduce's loop at the outer loop)."""
    arrs = [rng.standard_normal((1, 2, 100, 16)).astype(np.float32) for _ in range(3)]
    with Context(NOOPT=1):
        for causal in (False, True):
            GlobalCounters.reset()
            q, k, v = (Tensor(a, device=device) for a in arrs)
            got = q.scaled_dot_product_attention(k, v, is_causal=causal).numpy()
            assert GlobalCounters.kernel_count == 1
            np.testing.assert_allclose(got, reference(arrs, causal), rtol=1e-5, atol=2e-6)


def test_a_user_mask_and_the_gradients_match_torch(one_kernel):
    """A float mask added to the scores (data, read in the scores' fill), and the backward through the one-kernel
    forward: every gradient as torch's."""
    arrs = [rng.standard_normal((1, 2, 48, 16)).astype(np.float32) for _ in range(3)]
    mask = rng.standard_normal((48, 48)).astype(np.float32)
    q, k, v = (Tensor(a, requires_grad=True) for a in arrs)
    out = q.scaled_dot_product_attention(k, v, attn_mask=Tensor(mask))
    (out * out).sum().backward()
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in arrs)
    ref = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.from_numpy(mask))
    (ref * ref).sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=2e-6)
    for g, t in ((q.grad, tq), (k.grad, tk), (v.grad, tv)):
        assert g is not None and t.grad is not None
        np.testing.assert_allclose(g.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_the_renderers_hold_the_rows_on_the_stack(one_kernel):
    """CPU:C renders the two row buffers as C arrays of the row's length."""
    (item,) = kernels(sdpa((1, 1, 96, 16), True, "CPU:C"))
    uops, _ = full_rewrite(item.ast, Device["CPU:C"].renderer)
    src = Device["CPU:C"].renderer.render("k", uops).src
    assert src.count("[96];") == 2


@pytest.mark.parametrize("causal", [False, True])
def test_below_the_memory_bound_the_scores_are_stored(causal):
    """At (1, 1, 2048, 64) the scores (16 MiB) are under EXPANDED_BUFFER_BYTES: the cost model weighs storing them and
    does (a tiled matmul, 2-3x faster there than one query row at a time); the exp stays a row buffer computed once
    per score, read by its sum and by the product with v: 2 kernels (3 with is_causal: the mask's compares, which
    would run on the dot-product tile's scalars, get a kernel of their own)."""
    n = 2048
    items = kernels(sdpa((1, 1, n, 64), causal))
    assert len(items) == (3 if causal else 2)
    assert n * n in [buf.size for item in items for buf in item.bufs]
    assert sum(count(item.ast, Ops.EXP2) for item in items) == 1


def test_over_the_memory_bound_one_kernel(monkeypatch):
    """The same program whose scores' buffer exceeds the bound (lowered to just under a small shape's scores):
    one kernel, no N x N buffer; just over it, the scores are stored."""
    shape, n = (1, 2, 256, 32), 256
    scores_bytes = 2 * n * n * 4
    monkeypatch.setattr(cost, "EXPANDED_BUFFER_BYTES", scores_bytes - 1)
    (item,) = kernels(sdpa(shape, False))
    assert max(buf.size for buf in item.bufs) == 2 * n * 32
    assert row_buffer_sizes(item.ast) == [n, n]
    monkeypatch.setattr(cost, "EXPANDED_BUFFER_BYTES", scores_bytes)
    stored = kernels(sdpa(shape, False))
    assert len(stored) == 2
    assert 2 * n * n in [buf.size for item in stored for buf in item.bufs]
